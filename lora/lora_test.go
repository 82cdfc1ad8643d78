package lora

import (
	"fmt"
	"sync"
	"testing"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/pickers"
	"github.com/fastroute/fastroute/telemetry/engine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fleet registers n workers; worker i holds adapters i%adapters and
// (i+1)%adapters, so each adapter has 2n/adapters holders.
func fleet(tb testing.TB, n, adapters int) (*dataplane.Registry, *Residency) {
	reg := dataplane.NewRegistry()
	for i := 0; i < n; i++ {
		_, err := reg.Add(dataplane.WorkerSpec{ID: uint64(i + 1), URL: fmt.Sprintf("http://127.0.0.1:%d", 9000+i),
			LoRAs: []string{fmt.Sprintf("lora-%d", i%adapters), fmt.Sprintf("lora-%d", (i+1)%adapters)}})
		require.NoError(tb, err)
	}
	return reg, New(reg)
}

func holds(w *dataplane.Worker, adapter string) bool {
	for _, a := range w.Spec().LoRAs {
		if a == adapter {
			return true
		}
	}
	return false
}

func TestResolve(t *testing.T) {
	reg, res := fleet(t, 4, 4)
	snap := reg.Snapshot()
	g, err := res.Resolve(snap, []byte("lora-1"))
	require.NoError(t, err)
	assert.Equal(t, "lora-1", g.Name())
	assert.Equal(t, 2, g.Len())
	g, err = res.Resolve(snap, nil)
	assert.Nil(t, g)
	assert.NoError(t, err)
	g, err = res.Resolve(snap, []byte("base"))
	assert.Nil(t, g)
	assert.NoError(t, err, "no worker has listed models yet: nothing to judge by")

	w, _ := reg.Get(1)
	w.SetAdvertised(dataplane.Advertised{Models: []string{"base"}, Adapters: []string{"lora-9"}})
	reg.Republish()
	snap = reg.Snapshot()
	g, err = res.Resolve(snap, []byte("base"))
	assert.Nil(t, g)
	assert.NoError(t, err)
	g, err = res.Resolve(snap, []byte("lora-9"))
	require.NoError(t, err)
	assert.Equal(t, 1, g.Len(), "advertised adapters count")
	_, err = res.Resolve(snap, []byte("other"))
	assert.ErrorIs(t, err, dataplane.ErrNotFound)
	assert.ErrorContains(t, err, `model "other" is neither a base model nor a LoRA adapter of any worker`)
	assert.Zero(t, testing.AllocsPerRun(100, func() { _, _ = res.Resolve(snap, []byte("lora-9")) }))
}

func TestSetReplacesDeclaredAdapters(t *testing.T) {
	reg, res := fleet(t, 4, 4)
	require.NoError(t, res.Set(3, []string{"hot"}))
	w3, _ := reg.Get(3)
	assert.Equal(t, []string{"hot"}, res.Groups(w3))
	snap := reg.Snapshot()
	for name, want := range map[string]int{"hot": 1, "lora-2": 1, "lora-3": 1, "lora-1": 2} {
		assert.Equal(t, want, snap.Group([]byte(name)).Len(), name) // worker 3 left lora-2 and lora-3
	}
	assert.ErrorIs(t, res.Set(99, []string{"x"}), dataplane.ErrNotFound)
	assert.ErrorContains(t, res.Set(3, []string{""}), "loras[0]: empty adapter name")
	require.NoError(t, reg.Drain(3))
	reg.SweepDrained() // worker 3 leaves: what the admin set for it goes too
	assert.Equal(t, []string{"lora-2", "lora-3"}, res.Groups(w3))
}

func TestAdaptersTheEngineReportsAreResident(t *testing.T) {
	reg, res := fleet(t, 4, 4)
	w2, _ := reg.Get(2)
	w2.SetEngine(&engine.Stats{Reading: engine.Reading{Adapters: []string{"lora-0", "seen-at-run-time"}}})
	reg.Republish()
	assert.Equal(t, []string{"lora-0", "lora-1", "lora-2", "seen-at-run-time"}, res.Groups(w2))
	g, err := res.Resolve(reg.Snapshot(), []byte("seen-at-run-time"))
	require.NoError(t, err)
	assert.Equal(t, 1, g.Len(), "no config names it; the engine runs it on worker 2")
	w2.SetEngine(nil) // the reading went stale
	reg.Republish()
	assert.Equal(t, []string{"lora-1", "lora-2"}, res.Groups(w2))
}

// TestPicksOnlyHoldersAndCountsLoad: 64 goroutines select by adapter under
// every mode; each pick holds the adapter, every adapter's load and every
// worker's occupancy return to 0.
func TestPicksOnlyHoldersAndCountsLoad(t *testing.T) {
	for _, mode := range []pickers.Mode{pickers.ModeRoundRobin, pickers.ModeRandom, pickers.ModeP2C, pickers.ModeLeastLoaded, pickers.ModeWeighted} {
		reg, _ := fleet(t, 64, 16)
		sel, err := dataplane.NewSelector(reg, mode, 4)
		require.NoError(t, err)
		var wg sync.WaitGroup
		for g := 0; g < 64; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var req dataplane.Request
				var res dataplane.Reservation
				for i := 0; i < 300; i++ {
					name := fmt.Sprintf("lora-%d", (g+i)%16)
					req.Reset()
					req.Group = reg.Snapshot().Group([]byte(name))
					if err := sel.Select(&req, &res); err != nil {
						require.ErrorIs(t, err, dataplane.ErrResourceExhausted)
						continue
					}
					if !holds(res.Worker(), name) || res.Group().Name() != name {
						t.Errorf("%s: worker %d does not hold %s", mode, res.Worker().ID(), name)
					}
					res.Release()
				}
			}()
		}
		wg.Wait()
		for name, g := range reg.Snapshot().Groups() {
			assert.Zero(t, g.Inflight(), "%s %s", mode, name)
		}
		for _, w := range reg.All() {
			assert.Zero(t, w.Occupancy())
		}
	}
}

func TestAllHoldersBusyIsExhaustedAndNamedWorkerMustHold(t *testing.T) {
	reg, _ := fleet(t, 4, 4)
	sel, err := dataplane.NewSelector(reg, pickers.ModeP2C, 1)
	require.NoError(t, err)
	g := reg.Snapshot().Group([]byte("lora-0")) // workers 1 and 4
	var held [2]dataplane.Reservation
	for i := range held {
		req := dataplane.Request{Group: g}
		require.NoError(t, sel.Select(&req, &held[i]))
	}
	assert.Equal(t, int64(2), g.Inflight())
	var res dataplane.Reservation
	req := dataplane.Request{Group: g}
	assert.ErrorIs(t, sel.Select(&req, &res), dataplane.ErrResourceExhausted)
	for i := range held {
		held[i].Release()
	}
	req = dataplane.Request{Group: g, WorkerID: 2, HasWorker: true}
	assert.ErrorContains(t, sel.Select(&req, &res), `worker 2 does not hold adapter "lora-0"`)
	require.NoError(t, reg.Drain(1))
	require.NoError(t, reg.Drain(4))
	req = dataplane.Request{Group: reg.Snapshot().Group([]byte("lora-0"))}
	assert.ErrorContains(t, sel.Select(&req, &res), `no routable worker holds adapter "lora-0"`)
	assert.Zero(t, g.Inflight())
}

func TestLoRASelectDoesNotAllocate(t *testing.T) {
	reg, res := fleet(t, 64, 16)
	sel, err := dataplane.NewSelector(reg, pickers.ModeWeighted, 64)
	require.NoError(t, err)
	var req dataplane.Request
	var r dataplane.Reservation
	model := []byte("lora-5")
	n := testing.AllocsPerRun(1000, func() {
		req.Reset()
		req.Group, _ = res.Resolve(reg.Snapshot(), model)
		if err := sel.Select(&req, &r); err != nil {
			t.Fatal(err)
		}
		r.Release()
	})
	assert.Zero(t, n)
}

// BenchmarkLoRAPick holds the "LoRA filter + pick ≤ 100 ns at 64 workers and
// 16 adapters" target: resolve the model to its group, pick, reserve, release.
func BenchmarkLoRAPick(b *testing.B) {
	for _, mode := range []pickers.Mode{pickers.ModeP2C, pickers.ModeLeastLoaded, pickers.ModeWeighted} {
		b.Run(string(mode), func(b *testing.B) {
			reg, res := fleet(b, 64, 16)
			sel, err := dataplane.NewSelector(reg, mode, 64)
			require.NoError(b, err)
			var req dataplane.Request
			var r dataplane.Reservation
			models := make([][]byte, 16)
			for i := range models {
				models[i] = fmt.Appendf(nil, "lora-%d", i)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				req.Reset()
				req.Group, _ = res.Resolve(reg.Snapshot(), models[i&15])
				if err := sel.Select(&req, &r); err != nil {
					b.Fatal(err)
				}
				r.Release()
				i++
			}
		})
	}
}
