package dataplane

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fastroute/fastroute/pickers"
	"github.com/fastroute/fastroute/telemetry/engine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func spec(id uint64) WorkerSpec {
	return WorkerSpec{ID: id, URL: fmt.Sprintf("http://127.0.0.1:%d", 9000+id)}
}

func newFleet(t testing.TB, n int) *Registry {
	reg := NewRegistry()
	// Register in reverse to prove the snapshot is sorted, not insertion-ordered.
	for id := n; id >= 1; id-- {
		_, err := reg.Add(spec(uint64(id)))
		require.NoError(t, err)
	}
	return reg
}

// ranked is spec(id) with 1 to 4 data-parallel ranks.
func ranked(id uint64) WorkerSpec {
	s := spec(id)
	s.DPSize = 1 + int(id%4)
	return s
}

// newRankedFleet is newFleet of ranked workers.
func newRankedFleet(t testing.TB, n int) *Registry {
	reg := NewRegistry()
	for id := uint64(1); id <= uint64(n); id++ {
		_, err := reg.Add(ranked(id))
		require.NoError(t, err)
	}
	return reg
}

// roleFleet registers a worker of each role, ids from 1 in order.
func roleFleet(t testing.TB, roles ...Role) *Registry {
	reg := NewRegistry()
	for i, role := range roles {
		id := uint64(i + 1)
		_, err := reg.Add(WorkerSpec{ID: id, URL: fmt.Sprintf("http://127.0.0.1:%d", 9000+id), Role: role})
		require.NoError(t, err)
	}
	return reg
}

func newSelector(t testing.TB, reg *Registry, mode pickers.Mode, busy int) *Selector {
	s, err := NewSelector(reg, mode, busy)
	require.NoError(t, err)
	return s
}

// leftOf records the ids of the workers reg's subscribers hear have Left.
func leftOf(reg *Registry) *[]uint64 {
	var left []uint64
	reg.Subscribe(func(w *Worker, c Change) {
		if c == Left {
			left = append(left, w.ID())
		}
	})
	return &left
}

func workerIDs(ws []*Worker) []uint64 {
	out := []uint64{}
	for _, w := range ws {
		out = append(out, w.ID())
	}
	return out
}

func assertIdle(t *testing.T, reg *Registry) {
	t.Helper()
	for _, w := range reg.All() {
		assert.Zero(t, w.Occupancy(), "worker %d occupancy", w.ID())
		for r, n := range w.RankOccupancy() {
			assert.Zero(t, n, "worker %d rank %d occupancy", w.ID(), r)
		}
	}
}

func TestSnapshotIsSortedAndTracksRoutability(t *testing.T) {
	reg := newFleet(t, 5)
	assert.Equal(t, []uint64{1, 2, 3, 4, 5}, reg.Snapshot().IDs())

	reg.SetHealthy(3, false)
	assert.Equal(t, []uint64{1, 2, 4, 5}, reg.Snapshot().IDs())
	require.NoError(t, reg.Drain(5))
	assert.Equal(t, []uint64{1, 2, 4}, reg.Snapshot().IDs())
	reg.SetHealthy(3, true)
	assert.Equal(t, []uint64{1, 2, 3, 4}, reg.Snapshot().IDs())
	assert.Len(t, reg.All(), 5, "a draining worker stays registered until idle")

	assert.Equal(t, []uint64{5}, workerIDs(reg.SweepDrained()))
	assert.Len(t, reg.All(), 4)
	var nf *Error
	require.ErrorAs(t, reg.Drain(42), &nf)
	assert.Equal(t, NotFound, nf.Code)
}

func TestAddRefusesDuplicatesAndBadSpecs(t *testing.T) {
	reg := newFleet(t, 1)
	_, err := reg.Add(spec(1))
	assert.ErrorContains(t, err, "worker 1 is already registered")
	var dup *DuplicateError
	assert.ErrorAs(t, err, &dup, "a typed error, matched without reading its text")
	for _, c := range []struct {
		spec WorkerSpec
		want string
	}{
		{WorkerSpec{URL: "http://a:1"}, "id:"},
		{WorkerSpec{ID: 2, URL: "ftp://a"}, "url:"},
		{WorkerSpec{ID: 2, URL: "http://a:1", Device: "tpu"}, "device:"},
		{WorkerSpec{ID: 2, URL: "http://a:1", DPSize: -1}, "dp_size:"},
		{WorkerSpec{ID: 2, URL: "http://a:1", Capacity: -1}, "capacity:"},
		{WorkerSpec{ID: 2, URL: "http://a:1/v1"}, `url: "http://a:1/v1" has more than http://host:port`},
		{WorkerSpec{ID: 2, URL: "http://a:1?x=1"}, "url:"},
		{WorkerSpec{ID: 2, URL: "http://a:1", MetricsPath: "metrics"}, "metrics_path:"},
		{WorkerSpec{ID: 2, URL: "http://a:1", MaxInflight: -1}, "max_inflight:"},
		{WorkerSpec{ID: 2, URL: "http://a:1", CgroupPath: "relative/dir"}, "cgroup_path:"},
		{WorkerSpec{ID: 2, URL: "http://a:1", MaxModelLen: -1}, "max_model_len: -1 is negative"},
	} {
		_, err := reg.Add(c.spec)
		assert.ErrorContains(t, err, c.want)
		var fe *FieldError
		if assert.ErrorAs(t, err, &fe, "typed, naming the field") {
			assert.Equal(t, strings.SplitN(c.want, ":", 2)[0], fe.Field)
		}
	}
	assert.Len(t, reg.All(), 1)
}

// A worker's url is http://, https:// or unix:/path; its address gets its
// scheme's port when it names none, a unix socket's host is localhost.
func TestAWorkersHostAndScheme(t *testing.T) {
	for _, c := range []struct {
		url, host, address, hostname, socket, base string
		tls                                        bool
	}{
		{"http://10.0.0.1:8000", "10.0.0.1:8000", "10.0.0.1:8000", "10.0.0.1", "", "http://10.0.0.1:8000", false},
		{"http://vllm-0", "vllm-0", "vllm-0:80", "vllm-0", "", "http://vllm-0", false},
		{"https://vllm-0.internal", "vllm-0.internal", "vllm-0.internal:443", "vllm-0.internal", "", "https://vllm-0.internal", true},
		{"HTTPS://[fd00::1]:8443/", "[fd00::1]:8443", "[fd00::1]:8443", "fd00::1", "", "HTTPS://[fd00::1]:8443", true},
		{"unix:/run/vllm/engine.sock", "localhost", "", "localhost", "/run/vllm/engine.sock", "http://localhost", false},
	} {
		s := WorkerSpec{ID: 1, URL: c.url}
		require.NoError(t, s.Normalize(), c.url)
		assert.Equal(t, c.host, s.Host(), c.url)
		if c.socket == "" {
			assert.Equal(t, c.address, s.Address(), c.url)
		}
		assert.Equal(t, c.hostname, s.Hostname(), c.url)
		assert.Equal(t, c.socket, s.Socket(), c.url)
		assert.Equal(t, c.base, s.BaseURL(), c.url)
		assert.Equal(t, c.tls, s.TLS(), c.url)
	}
	for _, bad := range []string{"unix:run/vllm.sock", "unix:/run/../vllm.sock", "unix:", "unix://run/vllm.sock"} {
		s := WorkerSpec{ID: 1, URL: bad}
		assert.ErrorContains(t, s.Normalize(), "is not unix:/absolute/path of a socket", bad)
	}
}

func TestDrainedWorkerIsKeptWhileBusy(t *testing.T) {
	reg := newFleet(t, 2)
	sel := newSelector(t, reg, pickers.ModeDirect, 0)
	var res Reservation
	require.NoError(t, sel.Select(&Request{WorkerID: 2}, &res))
	require.NoError(t, reg.Drain(2))
	assert.Empty(t, workerIDs(reg.SweepDrained()), "in-flight request keeps the worker")
	assert.True(t, res.Release())
	assert.Equal(t, []uint64{2}, workerIDs(reg.SweepDrained()))
}

func TestReservationReleasesExactlyOnce(t *testing.T) {
	reg := newFleet(t, 1)
	sel := newSelector(t, reg, pickers.ModeRoundRobin, 0)
	var res Reservation
	require.NoError(t, sel.Select(&Request{}, &res))
	w := res.Worker()
	assert.EqualValues(t, 1, w.Occupancy())
	assert.True(t, res.Held())
	assert.True(t, res.Release())
	assert.False(t, res.Release(), "second release is a no-op")
	assert.False(t, res.Held())
	assert.Zero(t, w.Occupancy())

	// Concurrent double release frees the slot once.
	require.NoError(t, sel.Select(&Request{}, &res))
	var wg sync.WaitGroup
	var freed [16]bool
	for g := range freed {
		wg.Add(1)
		go func() { defer wg.Done(); freed[g] = res.Release() }()
	}
	wg.Wait()
	n := 0
	for _, f := range freed {
		if f {
			n++
		}
	}
	assert.Equal(t, 1, n)
	assert.Zero(t, w.Occupancy())
}

func TestSelectErrors(t *testing.T) {
	empty := newSelector(t, NewRegistry(), pickers.ModeRandom, 0)
	var res Reservation
	assert.ErrorIs(t, empty.Select(&Request{}, &res), ErrNoEndpoints)

	reg := newFleet(t, 2)
	sel := newSelector(t, reg, pickers.ModeP2C, 1)
	var a, b, c Reservation
	require.NoError(t, sel.Select(&Request{}, &a))
	require.NoError(t, sel.Select(&Request{}, &b))
	assert.NotEqual(t, a.Worker().ID(), b.Worker().ID(), "busy threshold 1 spreads")
	assert.ErrorIs(t, sel.Select(&Request{}, &c), ErrResourceExhausted)
	assert.False(t, c.Held())
	a.Release()
	b.Release()
	assertIdle(t, reg)

	reg.SetHealthy(1, false)
	reg.SetHealthy(2, false)
	assert.ErrorIs(t, sel.Select(&Request{}, &c), ErrNoEndpoints)
	assertIdle(t, reg)

	_, err := NewSelector(reg, pickers.ModeRandom, -1)
	assert.ErrorContains(t, err, "busy_threshold")
}

func TestDirectMode(t *testing.T) {
	reg := newFleet(t, 3)
	sel := newSelector(t, reg, pickers.ModeDirect, 0)
	var res Reservation
	err := sel.Select(&Request{}, &res)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, "x-worker-id")

	require.NoError(t, sel.Select(&Request{WorkerID: 2}, &res))
	assert.EqualValues(t, 2, res.Worker().ID())
	res.Release()

	err = sel.Select(&Request{WorkerID: 9}, &res)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, "unknown worker id 9")

	reg.SetHealthy(3, false)
	err = sel.Select(&Request{WorkerID: 3}, &res)
	assert.ErrorIs(t, err, ErrNoEndpoints)
	assert.ErrorContains(t, err, "not routable")
	assertIdle(t, reg)
}

func TestDPRank(t *testing.T) {
	reg := NewRegistry()
	s := spec(1)
	s.DPSize = 3
	_, err := reg.Add(s)
	require.NoError(t, err)
	sel := newSelector(t, reg, pickers.ModeRoundRobin, 0)
	var res Reservation
	var ranks []int
	for k := 0; k < 6; k++ {
		require.NoError(t, sel.Select(&Request{}, &res))
		ranks = append(ranks, res.Rank())
		res.Release()
	}
	assert.Equal(t, []int{0, 1, 2, 0, 1, 2}, ranks, "ranks rotate within the worker")

	// Requests in flight: each goes to the rank with the fewest, ties in
	// turn.
	held := make([]Reservation, 7)
	for i := range 3 {
		require.NoError(t, sel.Select(&Request{}, &held[i]))
	}
	assert.Equal(t, []int64{1, 1, 1}, w1(t, reg).RankOccupancy())
	held[1].Release() // one rank has the fewest: the next goes there, whatever the turn
	require.NoError(t, sel.Select(&Request{}, &held[3]))
	assert.Equal(t, held[1].Rank(), held[3].Rank())
	held[0].Release()
	held[2].Release()
	require.NoError(t, sel.Select(&Request{}, &held[4]))
	require.NoError(t, sel.Select(&Request{}, &held[5]))
	assert.Equal(t, []int64{1, 1, 1}, w1(t, reg).RankOccupancy(), "the two went to the two ranks with none")
	require.NoError(t, sel.Select(&Request{WorkerID: 1, DPRank: 0, HasDPRank: true}, &held[6]))
	assert.Equal(t, []int64{2, 1, 1}, w1(t, reg).RankOccupancy(), "a pinned rank counts too")
	for i := range held {
		held[i].Release()
	}
	assertIdle(t, reg)

	// One rank busy: the two idle ones take turns, evenly.
	for busy := range 3 {
		require.NoError(t, sel.Select(&Request{WorkerID: 1, DPRank: busy, HasDPRank: true}, &held[0]))
		taken := map[int]int{}
		for range 12 {
			require.NoError(t, sel.Select(&Request{}, &res))
			taken[res.Rank()]++
			res.Release()
		}
		held[0].Release()
		want := map[int]int{(busy + 1) % 3: 6, (busy + 2) % 3: 6}
		assert.Equal(t, want, taken, "rank %d busy", busy)
	}
	assertIdle(t, reg)

	require.NoError(t, sel.Select(&Request{WorkerID: 1, DPRank: 2, HasDPRank: true}, &res))
	assert.Equal(t, 2, res.Rank())
	res.Release()
	err = sel.Select(&Request{WorkerID: 1, DPRank: 3, HasDPRank: true}, &res)
	assert.ErrorContains(t, err, "dp rank 3 is outside 0..2")
	assertIdle(t, reg)
}

// w1 is worker 1 of reg.
func w1(t *testing.T, reg *Registry) *Worker {
	t.Helper()
	w, ok := reg.Get(1)
	require.True(t, ok)
	return w
}

func TestRetryNeverRepeatsAWorker(t *testing.T) {
	reg := newFleet(t, 3)
	sel := newSelector(t, reg, pickers.ModeRoundRobin, 0)
	var req Request
	var res Reservation
	require.NoError(t, sel.Select(&req, &res))
	seen := map[uint64]bool{res.Worker().ID(): true}
	for k := 0; k < 2; k++ {
		require.NoError(t, sel.Retry(&req, &res))
		id := res.Worker().ID()
		assert.False(t, seen[id], "worker %d tried twice", id)
		seen[id] = true
	}
	assert.Equal(t, 2, req.Attempts())
	assert.ErrorIs(t, sel.Retry(&req, &res), ErrNoEndpoints, "every worker failed")
	assert.False(t, res.Held())
	assertIdle(t, reg)

	// A request bound to its worker cannot move.
	req = Request{WorkerID: 1}
	require.NoError(t, sel.Select(&req, &res))
	assert.ErrorContains(t, sel.Retry(&req, &res), "bound to it")
	assertIdle(t, reg)
}

func TestPoolAndPrefer(t *testing.T) {
	reg := NewRegistry()
	for id := uint64(1); id <= 6; id++ {
		sp := spec(id)
		if sp.Role = RolePrefill; id%2 == 0 {
			sp.Role = RoleDecode
		}
		_, err := reg.Add(sp)
		require.NoError(t, err)
	}
	sel := newSelector(t, reg, pickers.ModeRandom, 1)
	var res [3]Reservation
	for i := range res {
		require.NoError(t, sel.Select(&Request{Phase: PhaseDecode}, &res[i]))
		assert.Zero(t, res[i].Worker().ID()%2)
	}
	var extra Reservation
	assert.ErrorIs(t, sel.Select(&Request{Phase: PhaseDecode}, &extra), ErrResourceExhausted,
		"all admitted workers busy")
	for i := range res {
		res[i].Release()
	}
	for k := 0; k < 20; k++ {
		require.NoError(t, sel.Select(&Request{preferID: 5}, &extra))
		assert.EqualValues(t, 5, extra.Worker().ID())
		extra.Release()
	}
	// A busy preferred worker yields to another.
	var hold Reservation
	require.NoError(t, sel.Select(&Request{WorkerID: 5}, &hold))
	require.NoError(t, sel.Select(&Request{preferID: 5}, &extra))
	assert.NotEqualValues(t, 5, extra.Worker().ID())
	extra.Release()
	hold.Release()
	assertIdle(t, reg)
}

func TestErrorsMatchByCode(t *testing.T) {
	err := error(Errorf(ResourceExhausted, "worker %d busy", 3))
	assert.ErrorIs(t, err, ErrResourceExhausted)
	assert.False(t, errors.Is(err, ErrNoEndpoints))
	assert.Equal(t, "resource_exhausted", ResourceExhausted.String())
}

// pickingModes are the modes that pick (every mode but direct), each also
// with engine readings on every worker where the mode reads them.
func pickingModes() (out []struct {
	mode   pickers.Mode
	engine bool
}) {
	for _, m := range pickers.Modes {
		if m == pickers.ModeDirect {
			continue
		}
		out = append(out, struct {
			mode   pickers.Mode
			engine bool
		}{m, false})
		if m == pickers.ModeWeighted || m == pickers.ModeLoadAware {
			out = append(out, struct {
				mode   pickers.Mode
				engine bool
			}{m, true})
		}
	}
	return out
}

// setEngines gives every worker an engine reading with a learned speed.
func setEngines(reg *Registry) {
	for _, w := range reg.All() {
		w.SetEngine(&engine.Stats{Slots: 8, TokenRate: float64(w.ID())})
	}
}

func TestSelectReserveReleaseAllocatesNothing(t *testing.T) {
	for _, pm := range pickingModes() {
		mode := pm.mode
		reg := newRankedFleet(t, 64)
		if pm.engine {
			setEngines(reg)
			mode += "+engine"
		}
		sel := newSelector(t, reg, pm.mode, 64)
		var req Request
		var res Reservation
		allocs := testing.AllocsPerRun(2000, func() {
			req.Reset()
			if err := sel.Select(&req, &res); err != nil {
				t.Fatal(err)
			}
			res.Release()
		})
		assert.Zero(t, allocs, "%s fast path", mode)

		// A retry takes the filtered path: scratch comes from the request.
		allocs = testing.AllocsPerRun(2000, func() {
			req.Reset()
			if err := sel.Select(&req, &res); err != nil {
				t.Fatal(err)
			}
			if err := sel.Retry(&req, &res); err != nil {
				t.Fatal(err)
			}
			res.Release()
		})
		assert.Zero(t, allocs, "%s filtered path", mode)

		// A backup among the workers: every pick takes the filtered path,
		// and one that finds the others at their cap its second pass.
		backup := spec(65)
		backup.Backup = true
		_, err := reg.Add(backup)
		require.NoError(t, err)
		allocs = testing.AllocsPerRun(2000, func() {
			req.Reset()
			if err := sel.Select(&req, &res); err != nil {
				t.Fatal(err)
			}
			res.Release()
			req.Reset()
			req.WorkerID = 65 // named: the backup
			if err := sel.Select(&req, &res); err != nil {
				t.Fatal(err)
			}
			res.Release()
		})
		assert.Zero(t, allocs, "%s with a backup", mode)
		require.NoError(t, reg.Drain(65))
		reg.SweepDrained()

		// Failures return sentinels and allocate nothing either.
		reg.SetHealthy(1, false)
		empty := newSelector(t, NewRegistry(), pm.mode, 0)
		allocs = testing.AllocsPerRun(1000, func() {
			req.Reset()
			_ = empty.Select(&req, &res)
		})
		assert.Zero(t, allocs, "%s no endpoints", mode)
		assertIdle(t, reg)
	}
}

// TestConcurrentSelectWithChurn runs 64 goroutines selecting, retrying and
// releasing while workers are drained, re-added and flap health. Every
// occupancy (each data-parallel rank's too) must end at exactly zero and
// never exceed the busy threshold, nor a rank's its worker's.
func TestConcurrentSelectWithChurn(t *testing.T) {
	for _, mode := range []pickers.Mode{pickers.ModeRoundRobin, pickers.ModeRandom, pickers.ModeP2C, pickers.ModeLeastLoaded, pickers.ModeWeighted} {
		t.Run(string(mode), func(t *testing.T) {
			const busy = 4
			reg := newRankedFleet(t, 16)
			sel := newSelector(t, reg, mode, busy)
			stop := make(chan struct{})
			var churn sync.WaitGroup
			churn.Add(1)
			go func() {
				defer churn.Done()
				for k := 0; ; k++ {
					select {
					case <-stop:
						return
					default:
					}
					id := uint64(1 + k%16)
					reg.SetHealthy(id, k%3 != 0)
					if k%7 == 0 {
						_ = reg.Drain(id)
						reg.SweepDrained()
						_, _ = reg.Add(ranked(id))
					}
				}
			}()
			var wg sync.WaitGroup
			var over [64]bool
			for g := 0; g < 64; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var req Request
					var res Reservation
					for k := 0; k < 300; k++ {
						req.Reset()
						if sel.Select(&req, &res) != nil {
							continue
						}
						// A rank's count is at most its worker's, which is at
						// most busy: each read alone, since two reads in a row
						// may straddle another request's release.
						if w := res.Worker(); w.Occupancy() > busy || (len(w.ranks) > 0 && w.ranks[res.Rank()].Load() > busy) {
							over[g] = true
						}
						if k%5 == 0 {
							_ = sel.Retry(&req, &res)
						}
						res.Release()
						res.Release()
					}
				}()
			}
			wg.Wait()
			close(stop)
			churn.Wait()
			assert.NotContains(t, over, true, "occupancy passed busy_threshold")
			assertIdle(t, reg)
		})
	}
}

func BenchmarkSelectReserveRelease(b *testing.B) {
	for _, pm := range pickingModes() {
		for _, n := range []int{4, 64, 1024} {
			reg := newFleet(b, n)
			mode := pm.mode
			if pm.engine {
				setEngines(reg)
				mode += "+engine"
			}
			sel := newSelector(b, reg, pm.mode, 64)
			b.Run(fmt.Sprintf("%s/n=%d", mode, n), func(b *testing.B) {
				var req Request
				var res Reservation
				b.ReportAllocs()
				for b.Loop() {
					req.Reset()
					_ = sel.Select(&req, &res)
					res.Release()
				}
			})
			b.Run(fmt.Sprintf("%s/n=%d/parallel", mode, n), func(b *testing.B) {
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					var req Request
					var res Reservation
					for pb.Next() {
						req.Reset()
						_ = sel.Select(&req, &res)
						res.Release()
					}
				})
			})
		}
	}
}

func TestSnapshotIndexMatchesBinarySearch(t *testing.T) {
	for n := 0; n <= 70; n++ {
		s := &Snapshot{}
		for i := 0; i < n; i++ {
			s.ids = append(s.ids, uint64(3*i+2))
		}
		for id := uint64(0); id <= uint64(3*n+3); id++ {
			want, ok := slices.BinarySearch(s.ids, id)
			if !ok {
				want = -1
			}
			require.Equal(t, want, s.index(id), "n=%d id=%d", n, id)
		}
	}
}

// TestResetClearsEveryExportedField guards Reset's field-by-field clearing:
// a field added to Request and forgotten there fails here.
// Reset clears every field of a Request but the exclusions (Attempts says
// they are gone) and the scratch space; byte and key buffers keep their
// capacity.
func TestResetClearsEveryField(t *testing.T) {
	var r Request
	v := reflect.ValueOf(&r).Elem()
	kept := map[string]bool{"exclude": true, "nExclude": true, "scratch": true}
	for i := 0; i < v.NumField(); i++ {
		name := v.Type().Field(i).Name
		if kept[name] {
			continue
		}
		f := reflect.NewAt(v.Field(i).Type(), v.Field(i).Addr().UnsafePointer()).Elem()
		switch f.Kind() {
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Int:
			f.SetInt(3)
		case reflect.Uint64, reflect.Uint8:
			f.SetUint(2)
		case reflect.Pointer:
			f.Set(reflect.New(f.Type().Elem()))
		case reflect.Slice:
			f.Set(reflect.MakeSlice(f.Type(), 2, 8))
		default:
			t.Fatalf("field %s: kind %v not covered by this test", name, f.Kind())
		}
	}
	r.nExclude = 2
	r.Reset()
	for i := 0; i < v.NumField(); i++ {
		name := v.Type().Field(i).Name
		switch f := v.Field(i); {
		case kept[name]:
		case f.Kind() == reflect.Slice:
			assert.Zero(t, f.Len(), "Reset leaves %s filled", name)
			assert.Equal(t, 8, f.Cap(), "Reset drops the buffer of %s", name)
		default:
			assert.True(t, f.IsZero(), "Reset leaves %s set", name)
		}
	}
	assert.Zero(t, r.Attempts())
}

// Each phase picks from its pool (prefill: prefill and both workers;
// decode: decode and both) with its own picker; a named worker must serve
// the phase; an empty pool is a 503.
func TestPhasesPickFromTheirPools(t *testing.T) {
	reg := NewRegistry()
	for id, role := range map[uint64]Role{1: RolePrefill, 2: RolePrefill, 3: RoleDecode, 4: RoleBoth} {
		sp := spec(id)
		sp.Role = role
		_, err := reg.Add(sp)
		require.NoError(t, err)
	}
	sel := newSelector(t, reg, pickers.ModeRoundRobin, 0)
	require.NoError(t, sel.SetPhaseModes(pickers.ModeLeastLoaded, ""))
	seen := map[Phase]map[uint64]int{PhasePrefill: {}, PhaseDecode: {}, PhaseAny: {}}
	held := make([]Reservation, 0, 12)
	for i := 0; i < 12; i++ {
		for ph := range seen {
			var req Request
			req.Phase = ph
			res := &Reservation{}
			if ph == PhasePrefill {
				held = held[:len(held)+1] // least-loaded spreads only what it holds
				res = &held[len(held)-1]
			}
			require.NoError(t, sel.Select(&req, res))
			seen[ph][res.Worker().ID()]++
			if ph != PhasePrefill {
				res.Release()
			}
		}
	}
	assert.Equal(t, map[uint64]int{1: 4, 2: 4, 4: 4}, seen[PhasePrefill], "least-loaded over prefill and both")
	assert.Equal(t, map[uint64]int{3: 6, 4: 6}, seen[PhaseDecode], "round-robin over decode and both")
	assert.Len(t, seen[PhaseAny], 4, "disaggregation off: every worker")
	for i := range held {
		held[i].Release()
	}

	named := Request{WorkerID: 3, Phase: PhasePrefill}
	var res Reservation
	assert.ErrorContains(t, sel.Select(&named, &res), "worker 3 has role decode and does not serve the prefill phase")
	require.NoError(t, reg.Drain(3))
	require.NoError(t, reg.Drain(4))
	decode := Request{Phase: PhaseDecode}
	err := sel.Select(&decode, &res)
	assert.True(t, errors.Is(err, ErrNoEndpoints), "%v", err)
	assert.ErrorContains(t, err, "no routable worker serves the decode phase")
	assert.ErrorContains(t, sel.SetPhaseModes(pickers.ModeDirect, ""), "needs the worker named")
	assertIdle(t, reg)
}

// TestEngineCostSpreadsABurstByCapacity holds 100 requests picked between
// two scrapes: the router's own dispatches since the reading count on top
// of it, so the burst splits by learned capacity instead of herding on the
// cheapest worker.
func TestEngineCostSpreadsABurstByCapacity(t *testing.T) {
	for _, mode := range []pickers.Mode{pickers.ModeWeighted, pickers.ModeLoadAware} {
		reg := newFleet(t, 3)
		fast := engine.Stats{Slots: 16, TokenRate: 60}
		slow := engine.Stats{Slots: 4, TokenRate: 10} // a CPU-like engine: 1/24 of the throughput
		w1, _ := reg.Get(1)
		w2, _ := reg.Get(2)
		w3, _ := reg.Get(3)
		w1.SetEngine(&fast)
		w2.SetEngine(&fast)
		w3.SetEngine(&slow)
		sel := newSelector(t, reg, mode, 0)
		res := make([]Reservation, 100)
		count := map[uint64]int{}
		for i := range res {
			var req Request
			require.NoError(t, sel.Select(&req, &res[i]))
			count[res[i].Worker().ID()]++
		}
		t.Logf("%s: %v", mode, count)
		// (L+1)/960 vs (l+1)/40: the slow worker gets its second request
		// once the fast ones hold 47 each.
		assert.InDelta(t, count[1], count[2], 1, "%s: equal fast workers share the burst", mode)
		assert.Equal(t, 2, count[3], "%s: the slow worker gets its capacity's share", mode)
		for i := range res {
			res[i].Release()
		}
		assertIdle(t, reg)

		// A queue the engine reports counts like the router's own load.
		queued := fast
		queued.Waiting = 20
		w1.SetEngine(&queued)
		count = map[uint64]int{}
		for i := 0; i < 20; i++ {
			var req Request
			require.NoError(t, sel.Select(&req, &res[i]))
			count[res[i].Worker().ID()]++
		}
		assert.Equal(t, map[uint64]int{2: 20}, count, "%s: the worker with a queue waits its turn", mode)
		for i := 0; i < 20; i++ {
			res[i].Release()
		}
		assertIdle(t, reg)

		// Without a reading on every worker the costs are not comparable:
		// the mode falls back to the router's own signals.
		w3.SetEngine(nil)
		count = map[uint64]int{}
		for i := 0; i < 30; i++ {
			var req Request
			require.NoError(t, sel.Select(&req, &res[i]))
			count[res[i].Worker().ID()]++
		}
		assert.GreaterOrEqual(t, count[3], 5, "%s: without every reading the slow worker is not priced out", mode)
		if mode == pickers.ModeLoadAware {
			assert.Equal(t, map[uint64]int{1: 10, 2: 10, 3: 10}, count, "least (occupancy+1)/weight at equal weights")
		}
		for i := 0; i < 30; i++ {
			res[i].Release()
		}
		assertIdle(t, reg)
	}
}

// Without max_inflight a worker's cap is the one learned from its engine
// (two batches) in place of busy_threshold, which stays the cap of a
// worker without engine readings; a threshold of 0 turns both off.
func TestLearnedAdmissionLimit(t *testing.T) {
	reg := newFleet(t, 2)
	w1, _ := reg.Get(1)
	w1.SetEngine(&engine.Stats{Slots: 2, Admit: 4})
	sel := newSelector(t, reg, pickers.ModeLeastLoaded, 3)
	var res [20]Reservation
	n := 0
	for ; n < len(res); n++ {
		var req Request
		if sel.Select(&req, &res[n]) != nil {
			break
		}
	}
	assert.Equal(t, 7, n, "4 on the engine that said its batch is 2, 3 (busy_threshold) on the other")
	assert.EqualValues(t, 4, w1.Occupancy())
	for i := range n {
		res[i].Release()
	}
	require.NoError(t, sel.SetPolicy(pickers.ModeLeastLoaded, 0, 0))
	for i := range res {
		var req Request
		require.NoError(t, sel.Select(&req, &res[i]), "busy_threshold 0: no cap, learned or not")
	}
	for i := range res {
		res[i].Release()
	}
	assertIdle(t, reg)
}

func TestEjection(t *testing.T) {
	reg := newFleet(t, 2)
	reg.SetEjectPolicy(EjectPolicy{After: 2, Base: time.Second, Max: 3 * time.Second})
	w1, _ := reg.Get(1)
	assert.Zero(t, reg.ReportAnswer(w1, false))
	assert.Zero(t, reg.ReportAnswer(w1, true), "a good answer resets the streak")
	assert.Zero(t, reg.ReportAnswer(w1, false))
	assert.Equal(t, time.Second, reg.ReportAnswer(w1, false), "second failure in a row")
	assert.Equal(t, []uint64{2}, reg.Snapshot().IDs())
	w2, _ := reg.Get(2)
	reg.ReportAnswer(w2, false)
	assert.Zero(t, reg.ReportAnswer(w2, false), "the last routable worker is never ejected")

	until, n := w1.Ejected()
	assert.Equal(t, 1, n)
	assert.Empty(t, reg.Readmit(until.Add(-time.Millisecond)))
	assert.Equal(t, []uint64{1}, reg.Readmit(until))
	assert.Equal(t, []uint64{1, 2}, reg.Snapshot().IDs())
	reg.ReportAnswer(w1, false)
	assert.Equal(t, 2*time.Second, reg.ReportAnswer(w1, false), "doubled while it keeps failing")
	until, _ = w1.Ejected()
	reg.Readmit(until)
	reg.ReportAnswer(w1, false)
	assert.Equal(t, 3*time.Second, reg.ReportAnswer(w1, false), "up to the max")
	reg.Uneject(1)
	until, n = w1.Ejected()
	assert.True(t, until.IsZero())
	assert.Zero(t, n)
	assert.Equal(t, uint64(3), reg.Ejections())
	assert.Zero(t, testing.AllocsPerRun(100, func() { reg.ReportAnswer(w1, true) }))
}

// TestCPUOverflowRule: with GPU and CPU workers and no engine readings,
// device-aware-weighted sends to the CPU only while
// cpu_inflight < gpu_inflight × cpus / (ratio × gpus).
func TestCPUOverflowRule(t *testing.T) {
	reg := NewRegistry()
	for id, dev := range map[uint64]Device{1: DeviceGPU, 2: DeviceGPU, 3: DeviceCPU} {
		s := spec(id)
		s.Device = dev
		_, err := reg.Add(s)
		require.NoError(t, err)
	}
	sel := newSelector(t, reg, pickers.ModeWeighted, 0)
	require.NoError(t, sel.SetPolicy(pickers.ModeWeighted, 0, 8))
	var req Request
	var res Reservation
	for i := 0; i < 50; i++ { // one at a time: the GPUs are idle, the CPU is never needed
		req.Reset()
		require.NoError(t, sel.Select(&req, &res))
		assert.NotEqual(t, uint64(3), res.Worker().ID())
		res.Release()
	}
	held := make([]Reservation, 40)
	cpu := 0
	for i := range held {
		var r Request
		require.NoError(t, sel.Select(&r, &held[i]))
		if held[i].Worker().ID() == 3 {
			cpu++
		}
	}
	// The CPU gets a request each time it holds fewer than gpu_inflight/16:
	// at 1, 17 and 33 requests on the GPUs.
	assert.Equal(t, 3, cpu)
	for i := range held {
		held[i].Release()
	}
	assertIdle(t, reg)

	// Off (ratio 0), or with engine readings on every worker, the rule steps aside.
	require.NoError(t, sel.SetPolicy(pickers.ModeWeighted, 0, 0))
	seen := map[uint64]bool{}
	for i := 0; i < 200; i++ {
		req.Reset()
		require.NoError(t, sel.Select(&req, &res))
		seen[res.Worker().ID()] = true
		res.Release()
	}
	assert.True(t, seen[3], "weighted draws reach the CPU worker")
	assert.Zero(t, testing.AllocsPerRun(200, func() {
		req.Reset()
		_ = sel.Select(&req, &res)
		res.Release()
	}))
}

// The registry tells every subscriber of each worker change once: joined,
// left (drained, unhealthy, ejected; asleep and stalled in
// TestAnEngineAsleepIsOutOfRotation), replaced (a new spec), removed
// (swept).
func TestSubscribersHearEveryChange(t *testing.T) {
	reg := newFleet(t, 4)
	type heard struct {
		id     uint64
		change Change
	}
	var a, b []heard
	reg.Subscribe(func(w *Worker, c Change) { a = append(a, heard{w.ID(), c}) })
	reg.Subscribe(func(w *Worker, c Change) { b = append(b, heard{w.ID(), c}) })

	require.NoError(t, reg.Drain(1))
	reg.SetHealthy(2, false)
	reg.SetEjectPolicy(EjectPolicy{After: 1, Base: time.Minute, Max: time.Minute})
	w3, _ := reg.Get(3)
	reg.ReportAnswer(w3, false)
	sp := spec(4)
	sp.Capacity = 2
	old4, _ := reg.Get(4)
	_, err := reg.Replace(sp)
	require.NoError(t, err)
	require.NoError(t, reg.Drain(4))
	new4, _ := reg.Get(4)
	assert.NotSame(t, old4, new4)
	assert.ElementsMatch(t, []uint64{1, 4}, workerIDs(reg.SweepDrained()))
	assert.Empty(t, reg.SweepDrained(), "swept once")

	_, err = reg.Add(spec(9))
	require.NoError(t, err)
	for _, got := range [][]heard{a, b} {
		require.Len(t, got, 9)
		assert.Equal(t, []heard{{1, Left}, {2, Left}, {3, Left}, {4, Replaced}, {4, Joined}, {4, Left}}, got[:6])
		assert.ElementsMatch(t, []heard{{1, Removed}, {4, Removed}}, got[6:8])
		assert.Equal(t, heard{9, Joined}, got[8])
	}
}

// A worker whose engine says it sleeps leaves the snapshot (its
// subscribers hear it left), keeps its sleep through a new spec, names it
// when a request is bound to it, and is back once a reading says it is
// awake, or once no fresh reading says anything (its health probes judge
// it then). One whose engine stalled likewise.
func TestAnEngineAsleepIsOutOfRotation(t *testing.T) {
	reg := newFleet(t, 2)
	left := leftOf(reg)
	sel := newSelector(t, reg, pickers.ModeRoundRobin, 0)
	named := func() error {
		req := &Request{WorkerID: 1}
		var res Reservation
		err := sel.Select(req, &res)
		res.Release()
		return err
	}
	reg.SetEngine(1, &engine.Stats{Reading: engine.Reading{Running: 1}})
	assert.Equal(t, 2, reg.Snapshot().Len())
	reg.SetEngine(1, &engine.Stats{Reading: engine.Reading{Asleep: true}})
	assert.Equal(t, 1, reg.Snapshot().Len())
	assert.Equal(t, []uint64{1}, *left)
	w1, _ := reg.Get(1)
	assert.True(t, w1.Asleep())
	assert.False(t, w1.Routable())
	assert.ErrorContains(t, named(), "worker 1 is not routable (asleep)")
	reg.SetEngine(1, &engine.Stats{Reading: engine.Reading{Asleep: true}})
	assert.Equal(t, []uint64{1}, *left, "told once")

	_, err := reg.Replace(spec(1))
	require.NoError(t, err)
	assert.Equal(t, 1, reg.Snapshot().Len(), "a new spec of a sleeping worker sleeps")
	reg.SetHealthy(1, false)
	assert.ErrorContains(t, named(), "worker 1 is not routable (unhealthy)", "the first reason")
	reg.SetHealthy(1, true)

	reg.SetEngine(1, &engine.Stats{})
	assert.Equal(t, 2, reg.Snapshot().Len(), "awake")
	assert.NoError(t, named())
	reg.SetEngine(1, &engine.Stats{Reading: engine.Reading{Asleep: true}})
	reg.SetEngine(1, nil)
	assert.Equal(t, 2, reg.Snapshot().Len(), "no fresh reading: not taken to sleep")
	reg.SetEngine(99, &engine.Stats{Reading: engine.Reading{Asleep: true}}) // unknown: nothing

	// An engine taken to have stalled (engine.Stats.Stalled) likewise.
	heard := len(*left)
	reg.SetEngine(1, &engine.Stats{Stalled: true})
	assert.Equal(t, 1, reg.Snapshot().Len())
	assert.Len(t, *left, heard+1, "told it left")
	assert.ErrorContains(t, named(), "worker 1 is not routable (stalled)")
	reg.SetEngine(1, &engine.Stats{})
	assert.Equal(t, 2, reg.Snapshot().Len(), "generating again")
}

// A request a worker refused as longer than its context moves only to
// workers of a longer known context, as long as one is left; a worker of
// unknown context is passed over then, and refusals of its own move
// nothing.
func TestARequestRefusedAsLongerMovesOnlyToLongerContexts(t *testing.T) {
	reg := NewRegistry()
	for id, ctx := range map[uint64]int{1: 100, 2: 200, 3: 0, 4: 400} {
		sp := spec(id)
		sp.MaxModelLen = ctx
		_, err := reg.Add(sp)
		require.NoError(t, err)
	}
	sel := newSelector(t, reg, pickers.ModeRoundRobin, 0)
	w := func(id uint64) *Worker { x, _ := reg.Get(id); return x }
	for range 8 {
		req := &Request{}
		var res Reservation
		require.NoError(t, sel.Select(req, &res))
		first := res.Worker()
		longer := sel.LongerContext(req, first)
		switch first.ID() {
		case 1, 2:
			require.True(t, longer)
			require.NoError(t, sel.Retry(req, &res))
			assert.Greater(t, res.Worker().ContextLen(), first.ContextLen(), "from worker %d", first.ID())
		case 3:
			assert.False(t, longer, "unknown: nothing is known to be longer")
		case 4:
			assert.False(t, longer, "the longest")
		}
		res.Release()
	}
	assert.False(t, sel.LongerContext(&Request{WorkerID: 1}, w(1)), "bound to its worker")
	reg.SetHealthy(4, false)
	req := &Request{}
	assert.True(t, sel.LongerContext(req, w(1)))
	assert.False(t, sel.LongerContext(req, w(2)), "worker 4 is not routable")
	for _, x := range reg.All() {
		assert.Zero(t, x.Occupancy())
	}
}

// A worker put down by hand leaves the snapshot (its subscribers hear it
// left) with its requests in flight kept, stays down through a new spec,
// names it when a request is bound to it, and is back once put back. An id
// put down before its worker joins (a restart's state file) joins down; a
// worker drained and swept forgets it, so one added again under its id
// joins in rotation. A worker being drained cannot be put down or back.
func TestAWorkerPutDownIsOutOfRotation(t *testing.T) {
	reg := newFleet(t, 3)
	left := leftOf(reg)
	sel := newSelector(t, reg, pickers.ModeLeastLoaded, 0)
	var res Reservation
	require.NoError(t, sel.Select(&Request{WorkerID: 2}, &res))

	changed, err := reg.SetDown(2, true)
	require.NoError(t, err)
	assert.True(t, changed)
	changed, err = reg.SetDown(2, true)
	require.NoError(t, err)
	assert.False(t, changed, "already down")
	assert.Equal(t, []uint64{1, 3}, reg.Snapshot().IDs())
	assert.Equal(t, []uint64{2}, *left)
	w2, _ := reg.Get(2)
	assert.EqualValues(t, 1, w2.Occupancy(), "its request in flight is kept")
	res.Release()
	assert.Zero(t, w2.Occupancy())
	err = sel.Select(&Request{WorkerID: 2}, &res)
	assert.ErrorIs(t, err, ErrNoEndpoints)
	assert.ErrorContains(t, err, "worker 2 is not routable (down)")

	sp := spec(2)
	sp.Capacity = 3
	_, err = reg.Replace(sp)
	require.NoError(t, err)
	w2, _ = reg.Get(2)
	assert.True(t, w2.Down(), "a new spec keeps it down")
	assert.Equal(t, []uint64{1, 3}, reg.Snapshot().IDs())

	reg.SetDownIDs([]uint64{3, 7})
	assert.Equal(t, []uint64{2, 3, 7}, reg.DownIDs())
	assert.Equal(t, []uint64{1}, reg.Snapshot().IDs())
	w7, err := reg.Add(spec(7))
	require.NoError(t, err)
	assert.True(t, w7.Down(), "joins down")

	_, err = reg.SetDown(9, true)
	assert.ErrorIs(t, err, ErrNotFound)
	require.NoError(t, reg.Drain(3))
	_, err = reg.SetDown(3, false)
	var draining *DrainingError
	assert.ErrorAs(t, err, &draining)
	assert.Equal(t, []uint64{3}, workerIDs(reg.SweepDrained()))
	assert.Equal(t, []uint64{2, 7}, reg.DownIDs(), "a swept worker's id is forgotten")
	w3, err := reg.Add(spec(3))
	require.NoError(t, err)
	assert.False(t, w3.Down(), "added again, it joins in rotation")

	changed, err = reg.SetDown(2, false)
	require.NoError(t, err)
	assert.True(t, changed)
	assert.Equal(t, []uint64{7}, reg.DownIDs())
	require.NoError(t, sel.Select(&Request{WorkerID: 2}, &res))
	res.Release()
}

// A worker replaced at the same URL (a reload that changed its capacity,
// its cap or its adapters) shares its counts with the old spec: the
// requests in flight there run on the same engine, so they count against
// the new spec's cap until they end, and release to zero on both. At
// another URL (another engine) the new spec counts only its own, and is on
// probation until a probe judges it (health.Checker takes it out at its
// first failed probe), keeping the verdict before; a down mark, the
// operator's, stays with the worker either way.
func TestAReplacedWorkerKeepsCountingTheRequestsOnItsEngine(t *testing.T) {
	reg := newFleet(t, 1)
	sel := newSelector(t, reg, pickers.ModeLeastLoaded, 2)
	var a, b, c Reservation
	require.NoError(t, sel.Select(&Request{}, &a))
	require.NoError(t, sel.Select(&Request{}, &b))
	a.Dispatched()
	b.Dispatched()
	sp := spec(1)
	sp.Capacity, sp.DPSize = 3, 2
	old, err := reg.Replace(sp)
	require.NoError(t, err)
	w, _ := reg.Get(1)
	assert.EqualValues(t, 2, w.Occupancy(), "the old spec's requests run on its engine")
	assert.EqualValues(t, 2, w.Served())
	assert.ErrorIs(t, sel.Select(&Request{}, &c), ErrResourceExhausted, "at its cap of 2")
	a.Release()
	require.NoError(t, sel.Select(&Request{}, &c))
	assert.Equal(t, []int64{1, 0}, w.RankOccupancy(), "ranks of its new dp_size")
	b.Release()
	c.Release()
	assert.Zero(t, w.Occupancy())
	assert.Zero(t, old.Occupancy())

	old, err = reg.Replace(sp)
	require.NoError(t, err)
	w, _ = reg.Get(1)
	assert.False(t, w.OnProbation(), "the same engine")

	require.NoError(t, sel.Select(&Request{}, &a))
	_, err = reg.SetDown(1, true)
	require.NoError(t, err)
	moved := spec(1)
	moved.URL = "http://127.0.0.1:9999"
	old, err = reg.Replace(moved)
	require.NoError(t, err)
	w, _ = reg.Get(1)
	assert.Zero(t, w.Occupancy(), "another engine")
	assert.EqualValues(t, 1, old.Occupancy())
	assert.True(t, w.OnProbation(), "another engine, not judged yet")
	assert.True(t, w.Healthy(), "the verdict before, until its probe")
	assert.True(t, w.Down(), "the operator's mark stays")
	moved.Capacity = 2
	_, err = reg.Replace(moved)
	require.NoError(t, err)
	w, _ = reg.Get(1)
	assert.True(t, w.OnProbation(), "changed at its new URL before a probe: not judged yet")
	reg.SetHealthy(1, true)
	assert.False(t, w.OnProbation(), "judged")
	a.Release()
	assert.Zero(t, old.Occupancy())
	assert.Zero(t, w.Occupancy())
}

// Update changes a worker's spec as a new spec is checked, replaces the
// worker only when that changed anything, keeps its engine's last reading
// and the tokens relayed from it (the same engine), and refuses an unknown worker, a spec it cannot take
// and a worker being drained, changing nothing.
func TestUpdateChangesARunningWorkersSpec(t *testing.T) {
	reg := newFleet(t, 2)
	reg.SetEngine(1, &engine.Stats{Slots: 8, TokenRate: 40, Admit: 16})
	before, _ := reg.Get(1)
	changed, err := reg.Update(1, func(s *WorkerSpec) { s.Capacity = 1 })
	require.NoError(t, err)
	assert.False(t, changed, "the same spec")
	w, _ := reg.Get(1)
	assert.Same(t, before, w)

	before.AddRelayedTokens(7)
	changed, err = reg.Update(1, func(s *WorkerSpec) { s.MaxInflight, s.Backup = 4, true })
	require.NoError(t, err)
	assert.True(t, changed)
	w, _ = reg.Get(1)
	assert.NotSame(t, before, w)
	assert.Equal(t, 4, w.Spec().MaxInflight)
	assert.True(t, w.Spec().Backup)
	assert.Same(t, before.Engine(), w.Engine(), "its engine's reading kept")
	relayed := w.Relayed().Tokens
	assert.EqualValues(t, 7, relayed, "the tokens relayed from its engine go on counting")

	_, err = reg.Update(1, func(s *WorkerSpec) { s.MaxInflight = -1 })
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, "max_inflight")
	after, _ := reg.Get(1)
	assert.Same(t, w, after, "refused: nothing changed")
	_, err = reg.Update(9, func(*WorkerSpec) {})
	assert.ErrorIs(t, err, ErrNotFound)
	require.NoError(t, reg.Drain(2))
	_, err = reg.Update(2, func(s *WorkerSpec) { s.Capacity = 2 })
	var draining *DrainingError
	assert.ErrorAs(t, err, &draining)
}
