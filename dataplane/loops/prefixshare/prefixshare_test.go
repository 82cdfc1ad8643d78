package prefixshare

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fastroute/fastroute/affinity"
	"github.com/fastroute/fastroute/dataplane/metrics"
	"github.com/fastroute/fastroute/internal/bearer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// peerTable is a replica's admin route over a real socket: it takes
// records into its own table, and can be held (the first post waits for
// release).
type peerTable struct {
	prefixes *affinity.Prefixes
	learned  atomic.Int64
	auth     atomic.Value
	hold     chan struct{}
}

func (p *peerTable) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != Path || r.Header.Get("Content-Type") != "application/octet-stream" {
		http.Error(w, "wrong route", http.StatusNotFound)
		return
	}
	p.auth.Store(r.Header.Get("Authorization"))
	if p.hold != nil {
		<-p.hold
	}
	body, _ := io.ReadAll(r.Body)
	n, err := p.prefixes.Learn(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	p.learned.Add(int64(n))
	w.WriteHeader(http.StatusNoContent)
}

func page(l *Loop) string { return metrics.Text(l.Collector()) }

// serve serves p over loopback until the test ends and returns its URL.
func serve(t *testing.T, p *peerTable) string {
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return srv.URL
}

// journaled is a table whose records a Loop reads (Share).
func journaled() *affinity.Prefixes {
	p := affinity.NewPrefixes(1024)
	p.Share(JournalKeys)
	return p
}

func run(t *testing.T, l *Loop) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { l.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// What the table records anew reaches the peer's table, with the token.
func TestRecordsReachThePeer(t *testing.T) {
	peer := &peerTable{prefixes: affinity.NewPrefixes(1024)}
	url, mine := serve(t, peer), journaled()
	l := New(Options{Prefixes: mine, Peers: []string{url + "/"}, Token: bearer.New("s3cret"), Interval: time.Millisecond, Timeout: time.Second})
	run(t, l)

	keys := []uint64{0xAAAA_0000_0000_0001, 0xBBBB_0000_0000_0002, 0xCCCC_0000_0000_0003}
	mine.Record(keys, 7)
	require.Eventually(t, func() bool { return peer.learned.Load() == 3 }, 5*time.Second, time.Millisecond)
	w, blocks := peer.prefixes.Holder(keys)
	assert.Equal(t, [2]uint64{7, 3}, [2]uint64{w, uint64(blocks)})
	assert.Equal(t, "Bearer s3cret", peer.auth.Load())
	require.Eventually(t, func() bool {
		return strings.Contains(page(l), `fastroute_prefix_shared_records_total{peer="`+url+`/",outcome="sent"} 3`)
	}, 5*time.Second, time.Millisecond)
	assert.Contains(t, page(l), "fastroute_prefix_recorded_keys_total 3")
}

// A peer that does not answer holds up only its own sender: its queue
// fills and the newest batches are dropped and counted, while another
// peer gets every record.
func TestASlowPeerDropsOnlyItsOwnBatches(t *testing.T) {
	slow := &peerTable{prefixes: affinity.NewPrefixes(1024), hold: make(chan struct{})}
	fast := &peerTable{prefixes: affinity.NewPrefixes(1024)}
	slowURL, fastURL, mine := serve(t, slow), serve(t, fast), journaled()
	l := New(Options{Prefixes: mine, Peers: []string{slowURL, fastURL}, Interval: time.Millisecond, Timeout: 10 * time.Second})
	run(t, l)

	const batches = queued + 4 // one in flight, queued waiting, the rest dropped
	for i := range batches {
		mine.Record([]uint64{uint64(i+1)<<32 | uint64(i)}, 1)
		require.Eventually(t, func() bool { return fast.learned.Load() == int64(i+1) }, 5*time.Second, time.Millisecond)
	}
	assert.Contains(t, page(l), `fastroute_prefix_shared_records_total{peer="`+slowURL+`",outcome="dropped"} 3`)
	close(slow.hold)
	require.Eventually(t, func() bool { return slow.learned.Load() == queued+1 }, 5*time.Second, time.Millisecond)
	// The sender counts a batch sent when the 204 is back, after the peer
	// took it in.
	require.Eventually(t, func() bool {
		return strings.Contains(page(l), `fastroute_prefix_shared_records_total{peer="`+fastURL+`",outcome="sent"} 8`)
	}, 5*time.Second, time.Millisecond)
}

// The replicas found later join the configured ones, this one's own
// address left out; one gone gets nothing more.
func TestSetPeersFollowsTheReplicasFound(t *testing.T) {
	static, found := &peerTable{prefixes: affinity.NewPrefixes(1024)}, &peerTable{prefixes: affinity.NewPrefixes(1024)}
	staticURL, foundURL, mine := serve(t, static), serve(t, found), journaled()
	const self = "http://127.0.0.1:1"
	l := New(Options{Prefixes: mine, Peers: []string{staticURL}, Self: self, Interval: time.Millisecond, Timeout: time.Second})
	run(t, l)

	l.SetPeers([]string{self, foundURL, staticURL})
	assert.Equal(t, []string{staticURL, foundURL}, l.Peers())
	mine.Record([]uint64{0xAAAA_0000_0000_0001}, 1)
	require.Eventually(t, func() bool { return static.learned.Load() == 1 && found.learned.Load() == 1 }, 5*time.Second, time.Millisecond)
	assert.NotContains(t, page(l), self, "not sent to itself")

	l.SetPeers([]string{self})
	assert.Equal(t, []string{staticURL}, l.Peers())
	mine.Record([]uint64{0xBBBB_0000_0000_0002}, 1)
	require.Eventually(t, func() bool { return static.learned.Load() == 2 }, 5*time.Second, time.Millisecond, "the configured peer stays")
	assert.Equal(t, int64(1), found.learned.Load(), "a replica gone gets nothing more")
	assert.NotContains(t, page(l), foundURL)
}

// SetInterval applies at once: records an hour's interval would keep
// reach the peer a new interval after it.
func TestSetIntervalAppliesAtOnce(t *testing.T) {
	peer := &peerTable{prefixes: affinity.NewPrefixes(1024)}
	mine := journaled()
	l := New(Options{Prefixes: mine, Peers: []string{serve(t, peer)}, Interval: time.Hour, Timeout: time.Second})
	run(t, l)
	mine.Record([]uint64{0xAAAA_0000_0000_0001, 0xBBBB_0000_0000_0002}, 7)
	time.Sleep(50 * time.Millisecond)
	assert.Zero(t, peer.learned.Load(), "the journal is read once an hour")
	l.SetInterval(time.Millisecond)
	require.Eventually(t, func() bool { return peer.learned.Load() == 2 }, 5*time.Second, time.Millisecond)
}
