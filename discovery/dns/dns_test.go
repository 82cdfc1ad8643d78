package dns

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/metrics"
	"github.com/fastroute/fastroute/internal/fakedns"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recorder is a Target that keeps the workers put and drained.
type recorder struct {
	mu      sync.Mutex
	live    map[uint64]dataplane.WorkerSpec
	puts    int
	drained []uint64
	refuse  uint64 // an id Put refuses
}

func (r *recorder) Put(spec dataplane.WorkerSpec) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if spec.ID == r.refuse {
		return fmt.Errorf("id %d is taken", spec.ID)
	}
	r.live[spec.ID] = spec
	r.puts++
	return nil
}

func (r *recorder) Drain(id uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.live, id)
	r.drained = append(r.drained, id)
}

// urls is the live workers' urls, sorted.
func (r *recorder) urls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for id, s := range r.live {
		if _, addr, _ := strings.Cut(s.URL, "://"); id != ID(addr) {
			out = append(out, "wrong id for "+s.URL)
		}
		out = append(out, s.URL)
	}
	slices.Sort(out)
	return out
}

func startDNS(t *testing.T) *fakedns.Server {
	srv, err := fakedns.Start()
	require.NoError(t, err)
	t.Cleanup(func() { srv.Close() })
	return srv
}

// Reconfigure changes the names of the next round: a name dropped takes
// its workers away, and a failing one its metric; an invalid list changes
// nothing.
func TestReconfigureChangesTheNamesOfTheNextRound(t *testing.T) {
	srv := startDNS(t)
	srv.Set("a.fastroute.test", "10.0.0.1")
	srv.Set("b.fastroute.test", "10.0.0.2")
	srv.Fail("c.fastroute.test")
	rec := &recorder{live: map[uint64]dataplane.WorkerSpec{}}
	o := Options{Names: []string{"a.fastroute.test.:8000", "c.fastroute.test.:8000"}, Interval: time.Second, Server: srv.Addr(),
		Scheme: "http", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	w, err := New(o, rec)
	require.NoError(t, err)
	ctx := context.Background()
	w.Sync(ctx)
	assert.Equal(t, []string{"http://10.0.0.1:8000"}, rec.urls())
	assert.Contains(t, metrics.Text(w.Collector()), `fastroute_dns_discovery_up{name="c.fastroute.test.:8000"} 0`)

	o.Names = []string{"b.fastroute.test.:8000", "no-port"}
	assert.ErrorContains(t, w.Reconfigure(o), `names[1]: "no-port" is not host:port`)
	w.Sync(ctx)
	assert.Equal(t, []string{"http://10.0.0.1:8000"}, rec.urls(), "a refused list changes nothing")

	o.Names = []string{"b.fastroute.test.:8000"}
	require.NoError(t, w.Reconfigure(o))
	assert.Equal(t, []string{"http://10.0.0.1:8000"}, rec.urls(), "nothing changes before the next round")
	w.Sync(ctx)
	assert.Equal(t, []string{"http://10.0.0.2:8000"}, rec.urls())
	assert.Equal(t, []uint64{ID("10.0.0.1:8000")}, rec.drained)
	assert.NotContains(t, metrics.Text(w.Collector()), "c.fastroute.test", "a dropped name leaves the metric")
}

// Reconfigure changes the rest from the next round too: a new scheme and
// worker fields replace each worker's spec (same id: same address), a new
// family takes a dual-stack host's other address (the one it drops
// drained), and a new server answers the lookups.
func TestReconfigureChangesHowTheNextRoundPuts(t *testing.T) {
	first, second := startDNS(t), startDNS(t)
	first.Set("vllm.fastroute.test", "10.0.0.1", "fd00::1")
	second.Set("vllm.fastroute.test", "10.0.0.9")
	rec := &recorder{live: map[uint64]dataplane.WorkerSpec{}}
	o := Options{Names: []string{"vllm.fastroute.test.:8000"}, Interval: time.Second, Server: first.Addr(), Scheme: "http",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	w, err := New(o, rec)
	require.NoError(t, err)
	ctx := context.Background()
	w.Sync(ctx)
	assert.Equal(t, []string{"http://10.0.0.1:8000"}, rec.urls())

	o.Scheme, o.Worker.Capacity, o.Worker.Device = "https", 8, "gpu"
	require.NoError(t, w.Reconfigure(o))
	w.Sync(ctx)
	assert.Equal(t, []string{"https://10.0.0.1:8000"}, rec.urls())
	spec := rec.live[ID("10.0.0.1:8000")]
	assert.Equal(t, 8.0, spec.Capacity)
	assert.Equal(t, dataplane.Device("gpu"), spec.Device)
	assert.Empty(t, rec.drained, "the same address: replaced, not drained")

	o.Family = PreferIPv6
	require.NoError(t, w.Reconfigure(o))
	w.Sync(ctx)
	assert.Equal(t, []string{"https://[fd00::1]:8000"}, rec.urls())
	assert.Equal(t, []uint64{ID("10.0.0.1:8000")}, rec.drained)

	o.Family, o.Server = PreferIPv4, second.Addr()
	require.NoError(t, w.Reconfigure(o))
	w.Sync(ctx)
	assert.Equal(t, []string{"https://10.0.0.9:8000"}, rec.urls(), "the new server's answer")

	o.Scheme = "ftp"
	assert.ErrorContains(t, w.Reconfigure(o), "scheme")
	w.Sync(ctx)
	assert.Equal(t, []string{"https://10.0.0.9:8000"}, rec.urls(), "a refused config changes nothing")
}

// Every address a name resolves to is a worker on the name's port, with
// the template's fields and an id of its address. An address that leaves
// the answer is drained; a lookup that fails keeps the name's workers (and
// says so in the metric); a name that does not exist any more has none.
func TestTheWorkersFollowTheNamesAddresses(t *testing.T) {
	srv := startDNS(t)
	srv.Set("vllm.fastroute.test", "10.0.0.1", "10.0.0.2")
	srv.Set("sglang.fastroute.test", "fd00::7")
	rec := &recorder{live: map[uint64]dataplane.WorkerSpec{}}
	w, err := New(Options{Names: []string{"vllm.fastroute.test.:8000", "sglang.fastroute.test.:30000"}, Interval: time.Second, Server: srv.Addr(),
		Scheme: "http", Worker: dataplane.WorkerSpec{Device: dataplane.DeviceGPU, Capacity: 2, Models: []string{"m"}},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, rec)
	require.NoError(t, err)
	ctx := context.Background()

	w.Sync(ctx)
	assert.Equal(t, []string{"http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://[fd00::7]:30000"}, rec.urls())
	for _, s := range rec.live {
		assert.Equal(t, dataplane.DeviceGPU, s.Device)
		assert.Equal(t, 2.0, s.Capacity)
		assert.Equal(t, []string{"m"}, s.Models)
		assert.True(t, w.Known(s.ID))
	}
	assert.Contains(t, metrics.Text(w.Collector()), `fastroute_dns_discovery_up{name="vllm.fastroute.test.:8000"} 1`)

	srv.Set("vllm.fastroute.test", "10.0.0.2", "10.0.0.3")
	w.Sync(ctx)
	assert.Equal(t, []string{"http://10.0.0.2:8000", "http://10.0.0.3:8000", "http://[fd00::7]:30000"}, rec.urls())
	assert.Equal(t, []uint64{ID("10.0.0.1:8000")}, rec.drained)
	assert.False(t, w.Known(ID("10.0.0.1:8000")))

	srv.Fail("vllm.fastroute.test")
	w.Sync(ctx)
	assert.Len(t, rec.urls(), 3, "a failing lookup keeps the name's workers")
	assert.Contains(t, metrics.Text(w.Collector()), `fastroute_dns_discovery_up{name="vllm.fastroute.test.:8000"} 0`)
	assert.Contains(t, metrics.Text(w.Collector()), `fastroute_dns_discovery_up{name="sglang.fastroute.test.:30000"} 1`)

	srv.Remove("vllm.fastroute.test")
	w.Sync(ctx)
	assert.Equal(t, []string{"http://[fd00::7]:30000"}, rec.urls(), "a name that is gone (NXDOMAIN) has no workers")
	assert.Contains(t, metrics.Text(w.Collector()), `fastroute_dns_discovery_up{name="vllm.fastroute.test.:8000"} 1`)
}

// An SRV name (a Kubernetes headless service's named port, a Consul
// service) gives its targets' addresses on each target's port. A target
// that fails keeps the name's workers.
func TestAnSRVNameGivesItsTargetsOnTheirPorts(t *testing.T) {
	srv := startDNS(t)
	srv.Set("pod-a.fastroute.test", "10.0.0.1")
	srv.Set("pod-b.fastroute.test", "10.0.0.2", "fd00::2")
	srv.SetSRV("_http._tcp.vllm.fastroute.test", "pod-a.fastroute.test:8000", "pod-b.fastroute.test:8001")
	rec := &recorder{live: map[uint64]dataplane.WorkerSpec{}}
	name := "_http._tcp.vllm.fastroute.test."
	w, err := New(Options{Names: []string{name}, Interval: time.Second, Server: srv.Addr(), Scheme: "http",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, rec)
	require.NoError(t, err)
	ctx := context.Background()
	w.Sync(ctx)
	assert.Equal(t, []string{"http://10.0.0.1:8000", "http://10.0.0.2:8001"}, rec.urls(), "a dual-stack target is one worker, on IPv4")

	srv.Fail("pod-b.fastroute.test")
	w.Sync(ctx)
	assert.Len(t, rec.urls(), 2, "a target's failed lookup keeps the name's workers")
	assert.Contains(t, metrics.Text(w.Collector()), `fastroute_dns_discovery_up{name="`+name+`"} 0`)

	srv.Set("pod-b.fastroute.test", "10.0.0.2")
	srv.SetSRV("_http._tcp.vllm.fastroute.test", "pod-b.fastroute.test:8001")
	w.Sync(ctx)
	assert.Equal(t, []string{"http://10.0.0.2:8001"}, rec.urls())
	srv.Remove("_http._tcp.vllm.fastroute.test")
	w.Sync(ctx)
	assert.Empty(t, rec.urls(), "a name gone has no workers")
}

// A dual-stack host is one worker, not one per address: Family takes a
// host's addresses of one family, the other's only when it has none, or
// (both) every address. A host that loses its addresses of the family
// taken moves to the other's, its old workers drained.
func TestOneAddressFamilyPerHost(t *testing.T) {
	srv := startDNS(t)
	srv.Set("pod-a.fastroute.test", "10.0.0.1", "fd00::1")
	srv.Set("pod-b.fastroute.test", "::ffff:10.0.0.2", "fd00::2") // IPv4-mapped: IPv4
	srv.Set("v6only.fastroute.test", "fd00::3")
	srv.SetSRV("_http._tcp.pods.fastroute.test", "pod-a.fastroute.test:8000", "pod-b.fastroute.test:8000")
	names := []string{"_http._tcp.pods.fastroute.test.", "v6only.fastroute.test.:9000"}
	for _, c := range []struct {
		family string
		want   []string
	}{
		{"", []string{"http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://[fd00::3]:9000"}},
		{PreferIPv4, []string{"http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://[fd00::3]:9000"}},
		{PreferIPv6, []string{"http://[fd00::1]:8000", "http://[fd00::2]:8000", "http://[fd00::3]:9000"}},
		{BothFamilies, []string{"http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://[fd00::1]:8000", "http://[fd00::2]:8000", "http://[fd00::3]:9000"}},
	} {
		rec := &recorder{live: map[uint64]dataplane.WorkerSpec{}}
		w, err := New(Options{Names: names, Interval: time.Second, Server: srv.Addr(), Scheme: "http", Family: c.family,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, rec)
		require.NoError(t, err)
		w.Sync(context.Background())
		assert.Equal(t, c.want, rec.urls(), "family %q", c.family)
	}

	rec := &recorder{live: map[uint64]dataplane.WorkerSpec{}}
	w, err := New(Options{Names: []string{"pod-a.fastroute.test.:8000"}, Interval: time.Second, Server: srv.Addr(), Scheme: "http",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, rec)
	require.NoError(t, err)
	w.Sync(context.Background())
	assert.Equal(t, []string{"http://10.0.0.1:8000"}, rec.urls())
	srv.Set("pod-a.fastroute.test", "fd00::1")
	w.Sync(context.Background())
	assert.Equal(t, []string{"http://[fd00::1]:8000"}, rec.urls())
	assert.Equal(t, []uint64{ID("10.0.0.1:8000")}, rec.drained)
}

// Each name has its own time: one whose server does not answer fails
// alone, and the names after it are still looked up.
func TestANameThatDoesNotAnswerFailsAlone(t *testing.T) {
	srv := startDNS(t)
	srv.Set("slow.fastroute.test", "10.0.0.1")
	srv.Stall("slow.fastroute.test")
	srv.Set("fast.fastroute.test", "10.0.0.2")
	rec := &recorder{live: map[uint64]dataplane.WorkerSpec{}}
	w, err := New(Options{Names: []string{"slow.fastroute.test.:80", "fast.fastroute.test.:80"}, Interval: 300 * time.Millisecond,
		Server: srv.Addr(), Scheme: "http", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, rec)
	require.NoError(t, err)
	w.Sync(context.Background())
	assert.Equal(t, []string{"http://10.0.0.2:80"}, rec.urls())
	page := metrics.Text(w.Collector())
	assert.Contains(t, page, `fastroute_dns_discovery_up{name="slow.fastroute.test.:80"} 0`)
	assert.Contains(t, page, `fastroute_dns_discovery_up{name="fast.fastroute.test.:80"} 1`)
}

// A worker drained by hand (Hold) is not put again while its address
// stays in DNS; once the address left and came back it is.
func TestAWorkerDrainedByHandStaysDrained(t *testing.T) {
	srv := startDNS(t)
	srv.Set("w.fastroute.test", "10.0.0.1", "10.0.0.2")
	rec := &recorder{live: map[uint64]dataplane.WorkerSpec{}}
	w, err := New(Options{Names: []string{"w.fastroute.test.:80"}, Interval: time.Second, Server: srv.Addr(), Scheme: "http"}, rec)
	require.NoError(t, err)
	ctx := context.Background()
	w.Sync(ctx)
	one := ID("10.0.0.1:80")
	require.True(t, w.Hold(one))
	assert.False(t, w.Hold(12345), "not a worker found here")
	rec.Drain(one) // what the router does beside Hold
	puts := rec.puts
	w.Sync(ctx)
	assert.Equal(t, []string{"http://10.0.0.2:80"}, rec.urls())
	assert.Equal(t, puts+1, rec.puts, "only the other worker is put again")
	assert.True(t, w.Known(one), "held: its id stays taken")

	srv.Set("w.fastroute.test", "10.0.0.2")
	w.Sync(ctx)
	srv.Set("w.fastroute.test", "10.0.0.1", "10.0.0.2")
	w.Sync(ctx)
	assert.Equal(t, []string{"http://10.0.0.1:80", "http://10.0.0.2:80"}, rec.urls(), "back in DNS: put again")
}

// gatedTarget is a recorder whose Put of one id, once armed, says it
// began and waits to be let go: a lookup's put under way.
type gatedTarget struct {
	*recorder
	id            uint64
	armed         atomic.Bool
	began, letGo  chan struct{}
	putsAfterHold atomic.Int32
	holdDone      atomic.Bool
}

func (g *gatedTarget) Put(spec dataplane.WorkerSpec) error {
	if spec.ID == g.id && g.armed.CompareAndSwap(true, false) {
		g.began <- struct{}{}
		<-g.letGo
	}
	if spec.ID == g.id && g.holdDone.Load() {
		g.putsAfterHold.Add(1)
	}
	return g.recorder.Put(spec)
}

// A hand drain racing a lookup: Hold waits for a put of the worker under
// way, so the router's drain, made after Hold, is never followed by a put
// that would take it back (a put of a draining worker replaces it, fresh).
// It was: under load the router's test saw a worker drained by hand
// serving again.
func TestAHoldWaitsForAPutUnderWay(t *testing.T) {
	srv := startDNS(t)
	srv.Set("w.fastroute.test", "10.0.0.1")
	one := ID("10.0.0.1:80")
	g := &gatedTarget{recorder: &recorder{live: map[uint64]dataplane.WorkerSpec{}}, id: one,
		began: make(chan struct{}), letGo: make(chan struct{})}
	w, err := New(Options{Names: []string{"w.fastroute.test.:80"}, Interval: time.Second, Server: srv.Addr(), Scheme: "http"}, g)
	require.NoError(t, err)
	ctx := context.Background()
	w.Sync(ctx)
	require.True(t, w.Known(one))

	g.armed.Store(true)
	synced := make(chan struct{})
	go func() { w.Sync(ctx); close(synced) }()
	<-g.began // the second round's put of the worker is under way
	held := make(chan bool)
	go func() { ok := w.Hold(one); g.holdDone.Store(true); held <- ok }()
	select {
	case <-held:
		t.Fatal("Hold returned while a put of its worker was under way")
	case <-time.After(100 * time.Millisecond):
	}
	close(g.letGo)
	require.True(t, <-held)
	<-synced
	w.Sync(ctx)
	assert.Zero(t, g.putsAfterHold.Load(), "no put of the worker after Hold")
	assert.Equal(t, []string{"10.0.0.1:80"}, w.Held())
}

// Hand drains outlast a restart: Held lists the held addresses, and
// Restore, before the first lookup, holds the ones a state file kept, so
// they are not put while DNS names them. While a name's lookups fail, no
// hold is forgotten (the address may be among its answer); once every name
// answered without an address, its hold is, and HoldsChanged says so.
func TestRestoredHandDrainsOutlastARestart(t *testing.T) {
	srv := startDNS(t)
	srv.Set("w.fastroute.test", "10.0.0.1", "10.0.0.2")
	srv.Set("v.fastroute.test", "10.0.0.3")
	rec := &recorder{live: map[uint64]dataplane.WorkerSpec{}}
	var changed atomic.Int32
	w, err := New(Options{Names: []string{"w.fastroute.test.:80", "v.fastroute.test.:80"}, Interval: time.Second, Server: srv.Addr(),
		Scheme: "http", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), HoldsChanged: func() { changed.Add(1) }}, rec)
	require.NoError(t, err)
	w.Restore([]netip.AddrPort{netip.MustParseAddrPort("10.0.0.1:80"), netip.MustParseAddrPort("[::ffff:10.0.0.3]:80")})
	assert.Equal(t, []string{"10.0.0.1:80", "10.0.0.3:80"}, w.Held(), "an IPv4-mapped address is held as its IPv4 one")
	ctx := context.Background()
	w.Sync(ctx)
	assert.Equal(t, []string{"http://10.0.0.2:80"}, rec.urls(), "restored holds are not put")
	assert.True(t, w.Known(ID("10.0.0.1:80")))

	srv.Fail("w.fastroute.test")
	srv.Set("v.fastroute.test")
	w.Sync(ctx)
	assert.Equal(t, []string{"10.0.0.1:80", "10.0.0.3:80"}, w.Held(), "a name's lookups fail: every hold is kept")
	assert.Zero(t, changed.Load())

	srv.Set("w.fastroute.test", "10.0.0.1", "10.0.0.2")
	w.Sync(ctx)
	assert.Equal(t, []string{"10.0.0.1:80"}, w.Held(), "every name answered: the hold of the address gone is forgotten")
	assert.EqualValues(t, 1, changed.Load())
	assert.Equal(t, []string{"http://10.0.0.2:80"}, rec.urls())
	w.Sync(ctx)
	assert.EqualValues(t, 1, changed.Load(), "nothing forgotten: no call")

	require.True(t, w.Hold(ID("10.0.0.2:80")))
	assert.Equal(t, []string{"10.0.0.1:80", "10.0.0.2:80"}, w.Held(), "a hand drain is held by its address")
}

// A worker the target refuses is logged once, not at every lookup, and
// is not drained (it was never put).
func TestARefusedWorkerIsLoggedOnce(t *testing.T) {
	srv := startDNS(t)
	srv.Set("w.fastroute.test", "10.0.0.1", "10.0.0.2")
	rec := &recorder{live: map[uint64]dataplane.WorkerSpec{}, refuse: ID("10.0.0.1:80")}
	var logs strings.Builder
	w, err := New(Options{Names: []string{"w.fastroute.test.:80"}, Interval: time.Second, Server: srv.Addr(), Scheme: "http",
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}, rec)
	require.NoError(t, err)
	for range 3 {
		w.Sync(context.Background())
	}
	assert.Equal(t, 1, strings.Count(logs.String(), "worker found in DNS not added"), logs.String())
	assert.Contains(t, logs.String(), "is taken")
	assert.False(t, w.Known(rec.refuse))
	srv.Set("w.fastroute.test", "10.0.0.2")
	w.Sync(context.Background())
	assert.Empty(t, rec.drained)
	assert.Equal(t, []string{"http://10.0.0.2:80"}, rec.urls())
}

// Run looks the names up every interval.
func TestRunLooksUpEveryInterval(t *testing.T) {
	srv := startDNS(t)
	srv.Set("w.fastroute.test", "10.0.0.1")
	rec := &recorder{live: map[uint64]dataplane.WorkerSpec{}}
	w, err := New(Options{Names: []string{"w.fastroute.test.:80"}, Interval: 20 * time.Millisecond, Server: srv.Addr(), Scheme: "https"}, rec)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	require.Eventually(t, func() bool { return slices.Equal(rec.urls(), []string{"https://10.0.0.1:80"}) },
		2*time.Second, 5*time.Millisecond)
	srv.Set("w.fastroute.test", "10.0.0.9")
	require.Eventually(t, func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.drained) == 1
	}, 2*time.Second, 5*time.Millisecond)
	cancel()
	<-done
}

func TestOptionsAreChecked(t *testing.T) {
	ok := Options{Names: []string{"w:80", "_http._tcp.vllm.default.svc.cluster.local"}, Interval: time.Second, Scheme: "http"}
	require.NoError(t, ok.Check())
	for _, c := range []struct {
		edit func(*Options)
		want string
	}{
		{func(o *Options) { o.Names = nil }, "names: none"},
		{func(o *Options) { o.Names = []string{"w"} }, `names[0]: "w" is not host:port or an SRV name (_service._proto.name)`},
		{func(o *Options) { o.Names = []string{"w:0"} }, `names[0]: "w:0" is not host:port`},
		{func(o *Options) { o.Names = []string{":80"} }, `names[0]: ":80" is not host:port`},
		{func(o *Options) { o.Interval = 0 }, "interval: 0s must be positive"},
		{func(o *Options) { o.Scheme = "ftp" }, `scheme: "ftp" is not http or https`},
		{func(o *Options) { o.Worker.ID = 3 }, "worker: id and url are each address's"},
		{func(o *Options) { o.Worker.Device = "tpu" }, `worker.device: "tpu" is not gpu or cpu`},
		{func(o *Options) { o.Server = "10.96.0.10" }, `server: "10.96.0.10" is not host:port`},
		{func(o *Options) { o.Family = "ipv6" }, `family: "ipv6" is not prefer_ipv4, prefer_ipv6 or both`},
	} {
		o := ok
		c.edit(&o)
		assert.ErrorContains(t, o.Check(), c.want)
		_, err := New(o, &recorder{})
		assert.ErrorContains(t, err, c.want)
	}
}

// An address's id is the same wherever it is computed, a JSON-safe
// integer, and differs between addresses.
func TestIDs(t *testing.T) {
	seen := map[uint64]string{}
	for i := range 10000 {
		addr := fmt.Sprintf("10.%d.%d.1:8000", i/256, i%256)
		id := ID(addr)
		if other, dup := seen[id]; dup || id == 0 || id >= 1<<53 {
			t.Fatalf("%s: id %d (the same as %q's)", addr, id, other)
		}
		seen[id] = addr
	}
	assert.Equal(t, ID("10.0.0.1:8000"), ID("10.0.0.1:8000"))
}
