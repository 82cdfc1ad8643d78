// Package discovery finds workers on etcd: each is a key
// <prefix>/workers/<id> holding its spec as JSON (the fields of POST
// /workers), attached to a lease its registrar keeps alive (Register). A
// router lists the prefix, then watches it: a put adds or replaces the
// worker, a delete or an expired lease drains it. A drain mark
// <prefix>/drain/<id> (MarkDrain, on the worker's lease) drains the worker
// on every router until it is deleted or the worker's registration ends.
// A down mark <prefix>/down/<id> (MarkDown, on no lease) puts the worker
// down on every router whose target takes it (DownTarget): out of
// rotation, still registered, until the mark is deleted.
// A compacted watch or a reconnection resyncs from a fresh list. While
// etcd is unreachable the router keeps the last known set and says so (Up).
// Router replicas register their admin listeners under <prefix>/routers/
// (RegisterRouter); a PeerTarget is told the list whenever it changes.
package discovery

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/internal/tlsfiles"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// Options locate etcd and the keys.
type Options struct {
	Endpoints   []string
	Prefix      string // default /fastroute
	DialTimeout time.Duration
	Username    string
	Password    string
	// TLS files; all empty: plain connections.
	CertFile, KeyFile, CAFile string
	Logger                    *slog.Logger
}

// withDefaults fills in the options left empty: the prefix /fastroute,
// the default logger.
func (o Options) withDefaults() Options {
	if o.Prefix == "" {
		o.Prefix = "/fastroute"
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// WorkersKey is the key prefix of the workers under prefix.
func WorkersKey(prefix string) string { return root(prefix) + "workers/" }

// RoutersKey is the key prefix of the router replicas under prefix.
func RoutersKey(prefix string) string { return root(prefix) + "routers/" }

// root is prefix with one trailing slash.
func root(prefix string) string { return strings.TrimSuffix(prefix, "/") + "/" }

// client connects to etcd.
func client(o Options) (*clientv3.Client, error) {
	if len(o.Endpoints) == 0 {
		return nil, errors.New("discovery.etcd.endpoints: none")
	}
	cfg := clientv3.Config{Endpoints: o.Endpoints, DialTimeout: o.DialTimeout, Username: o.Username, Password: o.Password,
		Logger: zap.NewNop(), // its own errors reach the log as discovery's
		// gRPC's default reconnect backoff grows to 2 minutes: after a long
		// etcd outage a router would stay blind that long once etcd is back.
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: reconnectMax},
			MinConnectTimeout: o.DialTimeout,
		})}}
	var err error
	if cfg.TLS, err = TLSConfig(o); err != nil {
		return nil, err
	}
	return clientv3.New(cfg)
}

// TLSConfig is the TLS configuration of the connections to etcd, from
// o's files (their errors name their keys); nil when o names none.
func TLSConfig(o Options) (*tls.Config, error) {
	if o.CertFile == "" && o.KeyFile == "" && o.CAFile == "" {
		return nil, nil
	}
	t := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.CertFile != "" {
		cert, err := tlsfiles.Pair("discovery.etcd.cert_file", o.CertFile, o.KeyFile)
		if err != nil {
			return nil, err
		}
		t.Certificates = []tls.Certificate{*cert}
	}
	if o.CAFile != "" {
		roots, err := tlsfiles.Roots("discovery.etcd.ca_file", o.CAFile)
		if err != nil {
			return nil, err
		}
		t.RootCAs = roots
	}
	return t, nil
}

// Target is what discovery changes: the router's workers.
type Target interface {
	// Put adds the worker, or replaces it when its spec changed.
	Put(spec dataplane.WorkerSpec) error
	// Drain removes the worker once its requests end.
	Drain(id uint64)
}

// DownTarget is a Target that also puts workers down and back, as the
// down marks on etcd say.
type DownTarget interface {
	Target
	// SetDown puts worker id down or back; an id not registered yet
	// joins as the last mark said.
	SetDown(id uint64, down bool)
}

// Settler is a Target that readies the workers it was just given for
// requests (a health probe of each): a list that puts new workers and
// drains others (an etcd moved to by Reconnect, one that changed during an
// outage) waits for it between the two, so that the workers that replace
// the drained ones take requests by then. Settle is given the workers put
// anew or changed (one at another URL is another engine, not probed yet).
type Settler interface {
	Target
	Settle(ids []uint64)
}

// PeerTarget is a Target that also follows the router replicas
// registered on etcd (RegisterRouter).
type PeerTarget interface {
	Target
	// SetPeers is every registered replica's admin URL, sorted (its own
	// among them), each time the list changes.
	SetPeers(urls []string)
}

// Watcher keeps a Target in step with the workers on etcd.
type Watcher struct {
	// The etcd it follows and its client: the watch goroutine's (run) and
	// Reconnect's, which replaces them once the goroutine ended; connMu
	// guards them for the other readers (MarkDown, MarkDrain, Close).
	o      Options
	cli    *clientv3.Client
	cancel context.CancelFunc // ends the watch goroutine
	done   chan struct{}      // closed once it ended
	closed bool
	connMu sync.Mutex

	target Target
	log    *slog.Logger
	up     atomic.Bool

	mu    sync.Mutex
	known map[uint64]string // spec JSON by id, as last seen
	marks map[uint64]bool   // drain marks
	downs map[uint64]bool   // down marks
	peers map[string]string // router replicas: admin URL by key
}

// probeEvery is how often a watching router checks etcd still answers.
const probeEvery = time.Second

// reconnectMax is the longest pause between two tries to reach etcd
// again, of the connection and of the list.
const reconnectMax = time.Second

// Watch lists and watches the workers under o.Prefix until Close. It
// returns at once; the first list runs in the background (Up reports it).
func Watch(o Options, target Target) (*Watcher, error) {
	o = o.withDefaults()
	cli, err := client(o)
	if err != nil {
		return nil, err
	}
	w := &Watcher{target: target, log: o.Logger.With("component", "discovery"),
		known: map[uint64]string{}, marks: map[uint64]bool{}, downs: map[uint64]bool{}, peers: map[string]string{}}
	w.start(o, cli)
	return w, nil
}

// start starts the watch goroutine on cli, the client of o. The caller
// holds connMu, or has not shared w yet.
func (w *Watcher) start(o Options, cli *clientv3.Client) {
	ctx, cancel := context.WithCancel(context.Background())
	w.o, w.cli, w.cancel, w.done = o, cli, cancel, make(chan struct{})
	go w.run(ctx, w.done)
}

// errClosed is Reconnect's answer after Close.
var errClosed = errors.New("discovery: the watcher is closed")

// Reconnect follows the etcd o locates from then on (a reload's new
// endpoints, prefix, credentials or TLS files, read again): the watch
// ends, a client of o replaces the one before, and the watch starts
// again with a list, which puts the workers it finds, drains those found
// before that it lacks, and takes the marks and replicas it lists, as
// after an outage. The workers found before serve meanwhile. A client
// that cannot be made (a TLS file that does not load) is an error, and
// the watch goes on as it was.
func (w *Watcher) Reconnect(o Options) error {
	o = o.withDefaults()
	cli, err := client(o)
	if err != nil {
		return err
	}
	w.connMu.Lock()
	defer w.connMu.Unlock()
	if w.closed {
		_ = cli.Close()
		return errClosed
	}
	w.cancel()
	<-w.done
	before := w.cli
	w.start(o, cli)
	_ = before.Close()
	return nil
}

// conn returns the etcd the watcher follows now and its client.
func (w *Watcher) conn() (Options, *clientv3.Client) {
	w.connMu.Lock()
	defer w.connMu.Unlock()
	return w.o, w.cli
}

// Up reports whether etcd answered the last list or probe.
func (w *Watcher) Up() bool { return w.up.Load() }

// Known reports whether id is a worker found on etcd.
func (w *Watcher) Known(id uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.known[id]
	return ok
}

// Close stops watching; the workers found stay.
func (w *Watcher) Close() error {
	w.connMu.Lock()
	defer w.connMu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	w.cancel()
	<-w.done
	return w.cli.Close()
}

func (w *Watcher) setUp(up bool, err error) {
	if w.up.Swap(up) != up || (!up && err != nil && w.log.Enabled(context.Background(), slog.LevelDebug)) {
		if up {
			w.log.Info("etcd reachable: workers in step", "endpoints", w.o.Endpoints)
		} else {
			w.log.Warn("etcd unreachable: routing on the last known workers", "endpoints", w.o.Endpoints, "err", err)
		}
	}
}

// run lists, then watches from the list's revision; a watch that fails
// (compaction, a lost connection) or a failed probe starts over.
func (w *Watcher) run(ctx context.Context, done chan struct{}) {
	defer close(done)
	prefix := root(w.o.Prefix)
	pause := 100 * time.Millisecond
	for ctx.Err() == nil {
		lctx, lcancel := context.WithTimeout(ctx, w.o.DialTimeout+time.Second)
		resp, err := w.cli.Get(lctx, prefix, clientv3.WithPrefix())
		lcancel()
		if err != nil {
			w.setUp(false, err)
			sleep(ctx, pause)
			pause = min(2*pause, reconnectMax)
			continue
		}
		pause = 100 * time.Millisecond
		w.sync(resp.Kvs)
		w.setUp(true, nil)
		w.follow(ctx, prefix, resp.Header.Revision+1)
	}
}

// follow applies the watch events until the watch fails or a probe does.
// clientv3's Watch returns only once its stream is set up, which waits for
// etcd: it runs beside the probes, so that an outage that begins meanwhile
// is noticed (its wait ends with the follow's).
func (w *Watcher) follow(ctx context.Context, prefix string, rev int64) {
	wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer wcancel()
	started := make(chan clientv3.WatchChan, 1)
	go func() { started <- w.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(rev)) }()
	var events clientv3.WatchChan // nil until the watch is set up
	probe := time.NewTicker(probeEvery)
	defer probe.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case events = <-started:
			started = nil
		case <-probe.C:
			pctx, pcancel := context.WithTimeout(ctx, w.o.DialTimeout)
			_, err := w.cli.Get(pctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
			pcancel()
			if err != nil {
				w.setUp(false, err)
				return // list again once it answers
			}
		case wr, ok := <-events:
			if !ok || wr.Err() != nil || wr.Canceled {
				if wr.CompactRevision != 0 {
					w.log.Info("etcd watch compacted: listing the workers again", "revision", wr.CompactRevision)
				}
				return
			}
			for _, ev := range wr.Events {
				w.apply(string(ev.Kv.Key), ev.Kv.Value, ev.Type == clientv3.EventTypeDelete)
			}
		}
	}
}

// sync applies a full list: the drain and down marks, then every worker
// put and every known worker not listed drained (once the new ones
// settled: Settler).
func (w *Watcher) sync(kvs []*mvccpb.KeyValue) {
	listed := map[string]map[uint64]bool{"drain": {}, "down": {}, "workers": {}}
	peers := map[string]string{}
	for _, kv := range kvs {
		if kind, id, ok := w.parse(string(kv.Key)); ok {
			listed[kind][id] = true
		} else if w.isRouter(string(kv.Key)) {
			peers[string(kv.Key)] = string(kv.Value)
		}
	}
	w.setPeers(func(m map[string]string) { clear(m); maps.Copy(m, peers) })
	w.mu.Lock()
	lifted, gone := unlisted(w.marks, listed["drain"]), unlisted(w.known, listed["workers"])
	up := unlisted(w.downs, listed["down"])
	var fresh []uint64 // the workers listed that were not known, or whose spec changed
	for _, kv := range kvs {
		if kind, id, ok := w.parse(string(kv.Key)); ok && kind == "workers" {
			if prev, ok := w.known[id]; !ok || prev != string(kv.Value) {
				fresh = append(fresh, id)
			}
		}
	}
	for _, id := range gone {
		delete(w.known, id)
	}
	w.mu.Unlock()
	for id := range listed["drain"] {
		w.mark(id, true)
	}
	for _, id := range lifted {
		w.mark(id, false)
	}
	for id := range listed["down"] {
		w.markDown(id, true)
	}
	for _, id := range up {
		w.markDown(id, false)
	}
	for _, kv := range kvs {
		if kind, _, ok := w.parse(string(kv.Key)); ok && kind == "workers" {
			w.apply(string(kv.Key), kv.Value, false)
		}
	}
	if s, ok := w.target.(Settler); ok && len(gone) > 0 && len(fresh) > 0 {
		s.Settle(fresh)
	}
	for _, id := range gone {
		w.log.Info("worker gone from etcd: draining", "worker", id)
		w.target.Drain(id)
	}
}

// unlisted returns the ids of m that listed lacks.
func unlisted[V any](m map[uint64]V, listed map[uint64]bool) []uint64 {
	var out []uint64
	for id := range m {
		if !listed[id] {
			out = append(out, id)
		}
	}
	return out
}

// parse splits a key into its kind (workers, drain or down) and id.
func (w *Watcher) parse(key string) (kind string, id uint64, ok bool) {
	kind, text, ok := strings.Cut(strings.TrimPrefix(key, root(w.o.Prefix)), "/")
	id, err := strconv.ParseUint(text, 10, 64)
	if !ok || err != nil || id == 0 || (kind != "workers" && kind != "drain" && kind != "down") {
		return "", 0, false
	}
	return kind, id, true
}

// apply one key: a worker's put adds or replaces it, a delete drains it; a
// drain mark's put drains its worker, its delete brings it back; a down
// mark's put puts its worker down, its delete puts it back.
func (w *Watcher) apply(key string, value []byte, deleted bool) {
	if w.isRouter(key) {
		w.setPeers(func(m map[string]string) {
			if deleted {
				delete(m, key)
			} else {
				m[key] = string(value)
			}
		})
		return
	}
	kind, id, ok := w.parse(key)
	if !ok {
		w.log.Warn("etcd key is not <prefix>/workers/<id>, <prefix>/drain/<id>, <prefix>/down/<id> or <prefix>/routers/<name>: ignored", "key", key)
		return
	}
	switch kind {
	case "drain":
		w.mark(id, !deleted)
		return
	case "down":
		w.markDown(id, !deleted)
		return
	}
	w.mu.Lock()
	prev, known := w.known[id]
	marked := w.marks[id]
	switch {
	case deleted:
		delete(w.known, id)
	case known && prev == string(value):
		w.mu.Unlock()
		return // unchanged (a resync)
	}
	w.mu.Unlock()
	switch {
	case deleted && known:
		w.log.Info("worker left etcd (deleted or lease expired): draining", "worker", id)
		w.target.Drain(id)
	case deleted:
	case marked || w.put(id, value): // a marked worker waits for its mark to go
		w.mu.Lock()
		w.known[id] = string(value)
		w.mu.Unlock()
	}
}

// isRouter reports whether key is a router replica's.
func (w *Watcher) isRouter(key string) bool {
	name, ok := strings.CutPrefix(key, RoutersKey(w.o.Prefix))
	return ok && name != ""
}

// setPeers edits the router replicas' list and, when it changed and the
// target follows them, tells it the new one.
func (w *Watcher) setPeers(edit func(map[string]string)) {
	pt, ok := w.target.(PeerTarget)
	if !ok {
		return
	}
	w.mu.Lock()
	before := maps.Clone(w.peers)
	edit(w.peers)
	same := maps.Equal(before, w.peers)
	urls := slices.Sorted(maps.Values(w.peers))
	w.mu.Unlock()
	if !same {
		w.log.Info("router replicas on etcd", "admin", urls)
		pt.SetPeers(urls)
	}
}

// put hands a worker's spec to the target; false when it is refused.
func (w *Watcher) put(id uint64, value []byte) bool {
	var spec dataplane.WorkerSpec
	if err := json.Unmarshal(value, &spec); err != nil {
		w.log.Warn("etcd worker spec is not JSON: ignored", "worker", id, "err", err)
		return false
	}
	if spec.ID == 0 {
		spec.ID = id
	}
	if spec.ID != id {
		w.log.Warn("etcd worker spec names another id than its key: ignored", "worker", id, "spec_id", spec.ID)
		return false
	}
	if dt, ok := w.target.(DownTarget); ok && w.DownMarked(id) {
		dt.SetDown(id, true) // a mark outlives registrations: it joins down
	}
	if err := w.target.Put(spec); err != nil {
		w.log.Warn("etcd worker refused", "worker", id, "err", err)
		return false
	}
	return true
}

// mark sets or lifts the drain mark of worker id.
func (w *Watcher) mark(id uint64, on bool) {
	w.mu.Lock()
	was := setMark(w.marks, id, on)
	spec, known := w.known[id]
	w.mu.Unlock()
	switch {
	case on && !was:
		w.log.Info("drain mark on etcd: draining", "worker", id)
		w.target.Drain(id)
	case !on && was && known:
		w.log.Info("drain mark lifted on etcd: the worker is back", "worker", id)
		w.put(id, []byte(spec))
	}
}

// setMark sets (on) or lifts worker id's mark in marks, and says whether
// it was set.
func setMark(marks map[uint64]bool, id uint64, on bool) (was bool) {
	was = marks[id]
	if on {
		marks[id] = true
	} else {
		delete(marks, id)
	}
	return was
}

// markDown sets or lifts the down mark of worker id and, when that changed
// it and the target takes marks (DownTarget), puts the worker down or back.
func (w *Watcher) markDown(id uint64, on bool) {
	dt, ok := w.target.(DownTarget)
	if !ok {
		return
	}
	w.mu.Lock()
	was := setMark(w.downs, id, on)
	w.mu.Unlock()
	switch {
	case on && !was:
		w.log.Info("down mark on etcd: the worker is out of rotation", "worker", id)
		dt.SetDown(id, true)
	case !on && was:
		w.log.Info("down mark lifted on etcd: the worker is back in rotation", "worker", id)
		dt.SetDown(id, false)
	}
}

// DrainAll, once the watcher is closed (a reload that turns etcd
// discovery off), drains every worker it found, lifts the down marks it
// set and tells a PeerTarget that it knows no replica: the target keeps
// nothing etcd said.
func (w *Watcher) DrainAll() {
	w.mu.Lock()
	known, downs := slices.Collect(maps.Keys(w.known)), slices.Collect(maps.Keys(w.downs))
	clear(w.known)
	clear(w.marks)
	clear(w.downs)
	w.mu.Unlock()
	for _, id := range known {
		w.target.Drain(id)
	}
	if dt, ok := w.target.(DownTarget); ok {
		for _, id := range downs {
			dt.SetDown(id, false)
		}
	}
	w.setPeers(func(m map[string]string) { clear(m) })
}

// DownMarked reports whether worker id has a down mark on etcd, as this
// watcher last saw it.
func (w *Watcher) DownMarked(id uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.downs[id]
}

// MarkDown writes (down) or deletes the down mark of worker id, so every
// router puts it down until the mark is deleted. The mark is on no lease:
// an engine restarted for its maintenance registers again, and stays
// down.
func (w *Watcher) MarkDown(id uint64, down bool) error {
	o, cli := w.conn()
	ctx, cancel := context.WithTimeout(context.Background(), o.DialTimeout+time.Second)
	defer cancel()
	key := root(o.Prefix) + "down/" + strconv.FormatUint(id, 10)
	var err error
	if down {
		_, err = cli.Put(ctx, key, "")
	} else {
		_, err = cli.Delete(ctx, key)
	}
	return err
}

// MarkDrain writes the drain mark of worker id, on the lease of its key,
// so every router drains it until the mark is deleted or the worker's
// registration ends.
func (w *Watcher) MarkDrain(id uint64) error {
	o, cli := w.conn()
	ctx, cancel := context.WithTimeout(context.Background(), o.DialTimeout+time.Second)
	defer cancel()
	idText := strconv.FormatUint(id, 10)
	resp, err := cli.Get(ctx, WorkersKey(o.Prefix)+idText)
	if err != nil {
		return err
	}
	var opts []clientv3.OpOption
	if len(resp.Kvs) == 1 && resp.Kvs[0].Lease != 0 {
		opts = append(opts, clientv3.WithLease(clientv3.LeaseID(resp.Kvs[0].Lease)))
	}
	_, err = cli.Put(ctx, root(o.Prefix)+"drain/"+idText, "", opts...)
	return err
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
