package discovery

import (
	"context"
	"io"
	"log/slog"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fastroute/fastroute/discovery/etcdtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// testOptions locates the test's etcd, with the keys under prefix.
func testOptions(e *etcdtest.Server, prefix string) Options {
	return Options{Endpoints: []string{e.Endpoint}, Prefix: prefix, DialTimeout: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// testClient starts an etcd for the test and a client of it, with the
// keys under prefix.
func testClient(t *testing.T, prefix string) (*etcdtest.Server, Options, *clientv3.Client) {
	e := etcdtest.Start(t)
	o := testOptions(e, prefix)
	cli, err := client(o)
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	return e, o, cli
}

// followEnds runs w's follow from revision 1 and fails the test unless it
// ends within d.
func followEnds(t *testing.T, w *Watcher, ctx context.Context, d time.Duration, why string) {
	t.Helper()
	ended := make(chan struct{})
	go func() { w.follow(ctx, root(w.o.Prefix), 1); close(ended) }()
	select {
	case <-ended:
	case <-time.After(d):
		t.Fatal(why)
	}
}

// A watch from a revision etcd compacted away ends the follow without
// applying anything, and the fresh list that follows (sync) brings the
// target in step: new workers put, a worker deleted meanwhile drained.
func TestCompactedWatchEndsAndTheListResyncs(t *testing.T) {
	_, o, cli := testClient(t, "/c")
	ctx := context.Background()
	for id := 1; id <= 3; id++ {
		_, err := cli.Put(ctx, WorkersKey(o.Prefix)+strconv.Itoa(id), `{"url":"http://10.0.0.`+strconv.Itoa(id)+`:8000"}`)
		require.NoError(t, err)
	}
	resp, err := cli.Put(ctx, root(o.Prefix)+"down/2", "")
	require.NoError(t, err)
	_, err = cli.Compact(ctx, resp.Header.Revision)
	require.NoError(t, err)

	rec := &etcdtest.Recorder{}
	w := &Watcher{o: o, cli: cli, target: rec, log: o.Logger, known: map[uint64]string{9: `{"url":"http://gone:1"}`}, marks: map[uint64]bool{},
		downs: map[uint64]bool{7: true}}
	followEnds(t, w, ctx, 5*time.Second, "a compacted watch did not end the follow")
	put, drained := rec.State()
	assert.Empty(t, put, "nothing applied from a compacted watch")
	assert.Empty(t, drained)
	assert.Empty(t, rec.Down())

	list, err := cli.Get(ctx, root(o.Prefix), clientv3.WithPrefix())
	require.NoError(t, err)
	w.sync(list.Kvs)
	put, drained = rec.State()
	assert.Len(t, put, 3)
	assert.Equal(t, "http://10.0.0.2:8000", put[2].URL)
	assert.Equal(t, []uint64{9}, drained, "the worker that left while unwatched is drained")
	assert.True(t, w.Known(1) && !w.Known(9))
	assert.Equal(t, map[uint64]bool{2: true, 7: false}, rec.Down(), "a down mark listed puts its worker down, one lifted while unwatched puts it back")
	assert.True(t, w.DownMarked(2) && !w.DownMarked(7))
}

// After a long etcd outage a watcher is back in step within a few seconds
// of etcd's return (a worker put then reaches it 1.4 to 2.5 s after the
// restart, most of it etcd's own election): gRPC's default reconnect
// backoff, which grows to two minutes, left it blind 11 to 13 s more
// after a 30 s outage.
func TestAWatcherIsBackSoonAfterALongOutage(t *testing.T) {
	e := etcdtest.Start(t)
	o := testOptions(e, "/o")
	rec := &etcdtest.Recorder{}
	w, err := Watch(o, rec)
	require.NoError(t, err)
	defer w.Close()
	require.Eventually(t, w.Up, 5*time.Second, 10*time.Millisecond)
	e.Stop()
	time.Sleep(30 * time.Second)
	e.Restart()
	back := time.Now()
	cli, err := client(o)
	require.NoError(t, err)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = cli.Put(ctx, WorkersKey(o.Prefix)+"7", `{"url":"http://10.0.0.7:8000"}`)
	require.NoError(t, err)
	require.Eventually(t, func() bool { put, _ := rec.State(); _, ok := put[7]; return ok }, 30*time.Second, 10*time.Millisecond)
	assert.Less(t, time.Since(back), 8*time.Second, "in step again %v after etcd's restart", time.Since(back))
}

// etcd gone before a follow sets its watch up: the watch cannot start, and
// the follow must still probe, say etcd is down and end (before, it waited
// inside clientv3's Watch for as long as etcd stayed away, Up all along).
func TestAFollowWhoseWatchCannotStartStillProbes(t *testing.T) {
	e, o, cli := testClient(t, "/f")
	_, err := cli.Get(context.Background(), root(o.Prefix), clientv3.WithPrefix()) // connected
	require.NoError(t, err)
	w := &Watcher{o: o, cli: cli, target: &etcdtest.Recorder{}, log: o.Logger, known: map[uint64]string{}, marks: map[uint64]bool{}}
	w.up.Store(true)
	e.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	followEnds(t, w, ctx, 10*time.Second, "the follow waited for its watch instead of probing")
	assert.False(t, w.Up())
}

// peerRecorder is a PeerTarget that keeps the last replica list it got.
type peerRecorder struct {
	etcdtest.Recorder
	mu    sync.Mutex
	peers []string
	calls int
}

func (p *peerRecorder) SetPeers(urls []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.peers, p.calls = urls, p.calls+1
}

func (p *peerRecorder) last() ([]string, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.peers, p.calls
}

// A watcher tells a PeerTarget the replicas registered on etcd, sorted,
// each time the list changes: those there when it starts, one that
// registers, one that leaves (its key deleted when its context ends).
func TestAWatcherFollowsTheRouterReplicas(t *testing.T) {
	e := etcdtest.Start(t)
	o := testOptions(e, "/peers")
	// A stopping replica waits dial_timeout for its key's deletion; 1 s
	// looked too short under CI's load once (the key stayed until its
	// lease's 5 s ran out), though a later failure of the same kind was a
	// replica stopped as its put was answered (see
	// TestAReplicaStoppedAsItRegistersLeavesNoKey).
	o.DialTimeout = 4 * time.Second
	first, err := RegisterRouter(o, "http://10.0.0.2:8001", 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = first.Close() })
	rec := &peerRecorder{}
	w, err := Watch(o, rec)
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Close() })
	listed := func(want ...string) func() bool {
		return func() bool { got, _ := rec.last(); return slices.Equal(got, want) }
	}
	require.Eventually(t, listed("http://10.0.0.2:8001"), 5*time.Second, 10*time.Millisecond)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { KeepRouterRegistered(ctx, o, "http://10.0.0.1:8001", 5*time.Second); close(done) }()
	require.Eventually(t, listed("http://10.0.0.1:8001", "http://10.0.0.2:8001"), 5*time.Second, 10*time.Millisecond)
	cancel()
	<-done
	require.Eventually(t, listed("http://10.0.0.2:8001"), 5*time.Second, 10*time.Millisecond, "a replica that stops deletes its key")
	_, calls := rec.last()
	assert.Equal(t, 3, calls, "told once per change")
	put, drained := rec.State()
	assert.Empty(t, put, "a replica is not a worker")
	assert.Empty(t, drained)
}

// A replica stopped as its registration's put is answered leaves no key
// behind: etcd may apply a put whose caller has already given up, and the
// key must not stay for its lease's ttl (its peers would keep sharing
// prefixes with a router that is gone). Each round stops the replica the
// moment a watch sees its key, which is when that answer is in flight.
func TestAReplicaStoppedAsItRegistersLeavesNoKey(t *testing.T) {
	_, o, cli := testClient(t, "/stopping")
	o.DialTimeout = 4 * time.Second // the stop's deletion waits this long for etcd: ample under load
	const admin = "http://10.0.0.1:8001"
	key := RoutersKey(o.Prefix) + url.PathEscape(admin)
	for round := range 20 {
		before, err := cli.Get(context.Background(), key)
		require.NoError(t, err)
		watching, stopWatching := context.WithCancel(context.Background())
		events := cli.Watch(watching, key, clientv3.WithRev(before.Header.Revision+1)) // misses no put made meanwhile
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { KeepRouterRegistered(ctx, o, admin, 30*time.Second); close(done) }()
		for put := false; !put; {
			resp, open := <-events
			require.True(t, open, "round %d: the watch ended", round)
			require.NoError(t, resp.Err())
			for _, ev := range resp.Events {
				put = put || ev.Type == clientv3.EventTypePut
			}
		}
		cancel()
		<-done
		got, err := cli.Get(context.Background(), key)
		require.NoError(t, err)
		require.Empty(t, got.Kvs, "round %d: the key of a replica that stopped is still there", round)
		stopWatching()
	}
}

// A registration's Close deletes its key only while the key is on its
// lease: a router upgraded registers the same admin URL from its new
// process before the old one stops, and the old one's Close must not take
// the new one's key away (its peers would stop sharing prefixes with it
// for good).
func TestAKeyTakenOverOutlivesTheRegistrationBefore(t *testing.T) {
	_, o, cli := testClient(t, "/upgrade")
	const admin = "http://10.0.0.1:8001"
	old, err := RegisterRouter(o, admin, 5*time.Second)
	require.NoError(t, err)
	taken, err := RegisterRouter(o, admin, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, old.Key(), taken.Key())

	require.NoError(t, old.Close())
	got, err := cli.Get(context.Background(), taken.Key())
	require.NoError(t, err)
	require.Len(t, got.Kvs, 1, "the key another registration took over stays")
	assert.Equal(t, int64(taken.lease), got.Kvs[0].Lease)

	require.NoError(t, taken.Close())
	got, err = cli.Get(context.Background(), taken.Key())
	require.NoError(t, err)
	assert.Empty(t, got.Kvs, "its own Close deletes it")
}

// Reconnect moves the watch to another etcd (a reload's new endpoints):
// its list puts the workers found there (one changed, one new), drains
// the one it lacks and lifts the down mark it lacks, and the marks go to
// the new etcd; a client that cannot be made leaves the watch as it was;
// after Close, Reconnect is refused.
func TestReconnectFollowsAnotherEtcd(t *testing.T) {
	_, o, cli := testClient(t, "/r")
	second := etcdtest.Start(t)
	moved := testOptions(second, "/r")
	cli2, err := client(moved)
	require.NoError(t, err)
	defer cli2.Close()
	ctx := context.Background()
	put := func(c *clientv3.Client, key, value string) {
		t.Helper()
		_, err := c.Put(ctx, root(o.Prefix)+key, value)
		require.NoError(t, err)
	}
	put(cli, "workers/1", `{"url":"http://10.0.0.1:8000"}`)
	put(cli, "workers/2", `{"url":"http://10.0.0.2:8000"}`)
	put(cli, "down/2", "")
	put(cli2, "workers/2", `{"url":"http://10.0.1.2:8000"}`)
	put(cli2, "workers/3", `{"url":"http://10.0.1.3:8000"}`)

	rec := &etcdtest.Recorder{}
	w, err := Watch(o, rec)
	require.NoError(t, err)
	defer w.Close()
	require.Eventually(t, func() bool { return w.Up() && w.Known(2) && rec.Down()[2] }, 5*time.Second, 10*time.Millisecond)

	bad := moved
	bad.CertFile, bad.KeyFile = filepath.Join(t.TempDir(), "missing.pem"), filepath.Join(t.TempDir(), "missing.key")
	require.Error(t, w.Reconnect(bad))
	put(cli, "workers/4", `{"url":"http://10.0.0.4:8000"}`)
	require.Eventually(t, func() bool { return w.Known(4) }, 5*time.Second, 10*time.Millisecond, "the watch went on")

	require.NoError(t, w.Reconnect(moved))
	require.Eventually(t, func() bool { return w.Known(3) && !w.Known(1) && !w.Known(4) }, 5*time.Second, 10*time.Millisecond)
	workers, drained := rec.State()
	assert.Equal(t, "http://10.0.1.2:8000", workers[2].URL, "the new etcd's spec")
	assert.ElementsMatch(t, []uint64{1, 4}, drained, "the workers the new etcd lacks")
	assert.Equal(t, []etcdtest.Settling{{Drained: 0, IDs: []uint64{2, 3}}}, rec.Settled(), "drained once the changed one and the new one settled")
	assert.False(t, rec.Down()[2], "the down mark it lacks lifted")
	require.NoError(t, w.MarkDown(3, true))
	got, err := cli2.Get(ctx, root(o.Prefix)+"down/3")
	require.NoError(t, err)
	assert.Len(t, got.Kvs, 1, "the mark goes to the new etcd")
	got, err = cli.Get(ctx, root(o.Prefix)+"down/3")
	require.NoError(t, err)
	assert.Empty(t, got.Kvs)

	require.NoError(t, w.Close())
	assert.ErrorIs(t, w.Reconnect(o), errClosed)
	require.NoError(t, w.Close(), "a second Close is nothing")
}

// DrainAll, once the watcher is closed, drains every worker it found,
// lifts the down marks it held and tells a PeerTarget it knows no replica;
// a later DrainAll has nothing left to do.
func TestDrainAllLetsGoOfWhatEtcdSaid(t *testing.T) {
	_, o, cli := testClient(t, "/released")
	ctx := context.Background()
	for key, value := range map[string]string{"workers/1": `{"url":"http://10.0.0.1:8000"}`, "workers/2": `{"url":"http://10.0.0.2:8000"}`,
		"down/5": "", "routers/a": "http://10.0.0.9:8001"} {
		_, err := cli.Put(ctx, root(o.Prefix)+key, value)
		require.NoError(t, err)
	}
	rec := &peerRecorder{}
	w, err := Watch(o, rec)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		peers, _ := rec.last()
		return w.Known(1) && w.Known(2) && rec.Down()[5] && len(peers) == 1
	}, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, w.Close())

	w.DrainAll()
	_, drained := rec.State()
	assert.ElementsMatch(t, []uint64{1, 2}, drained)
	assert.False(t, rec.Down()[5], "the down mark lifted")
	peers, calls := rec.last()
	assert.Empty(t, peers)
	assert.False(t, w.Known(1) || w.DownMarked(5))
	w.DrainAll()
	_, drained = rec.State()
	assert.Len(t, drained, 2, "nothing more to drain")
	_, again := rec.last()
	assert.Equal(t, calls, again, "the replicas told once")
}
