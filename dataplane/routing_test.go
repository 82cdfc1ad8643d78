package dataplane

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fastroute/fastroute/affinity"
	"github.com/fastroute/fastroute/pickers"
	"github.com/fastroute/fastroute/telemetry/engine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// loraFleet registers n workers; worker i holds adapters i%adapters and
// (i+1)%adapters, so each adapter has 2n/adapters holders.
func loraFleet(tb testing.TB, n, adapters int) *Registry {
	reg := NewRegistry()
	for i := 0; i < n; i++ {
		_, err := reg.Add(WorkerSpec{ID: uint64(i + 1), URL: fmt.Sprintf("http://127.0.0.1:%d", 9000+i),
			LoRAs: []string{fmt.Sprintf("lora-%d", i%adapters), fmt.Sprintf("lora-%d", (i+1)%adapters)}})
		require.NoError(tb, err)
	}
	return reg
}

func TestSetAdaptersReplacesTheDeclaredOnes(t *testing.T) {
	reg := loraFleet(t, 4, 4)
	require.NoError(t, reg.SetAdapters(3, []string{"hot"}))
	w3, _ := reg.Get(3)
	assert.Equal(t, []string{"hot"}, w3.Adapters())
	snap := reg.Snapshot()
	for name, want := range map[string]int{"hot": 1, "lora-2": 1, "lora-3": 1, "lora-1": 2} {
		assert.Equal(t, want, snap.Group([]byte(name)).Len(), name) // worker 3 left lora-2 and lora-3
	}
	assert.ErrorIs(t, reg.SetAdapters(99, []string{"x"}), ErrNotFound)
	assert.ErrorContains(t, reg.SetAdapters(3, []string{""}), "loras[0]: an empty adapter name")
	assert.ErrorContains(t, reg.SetAdapters(3, []string{"ok", "a\nb"}), `loras[1]: adapter name "a\nb" holds a control character`)
	_, err := reg.Replace(WorkerSpec{ID: 3, URL: "http://127.0.0.1:9999", LoRAs: []string{"cfg"}})
	require.NoError(t, err)
	w3, _ = reg.Get(3)
	assert.Equal(t, []string{"hot"}, w3.Adapters(), "what the admin set outlives a reload of the spec")
}

func TestAdaptersTheEngineRunsAreHeld(t *testing.T) {
	reg := loraFleet(t, 4, 4)
	w2, _ := reg.Get(2)
	assert.True(t, w2.SetEngine(&engine.Stats{Reading: engine.Reading{Adapters: []string{"lora-0", "seen-at-run-time"}}}))
	assert.False(t, w2.SetEngine(&engine.Stats{Reading: engine.Reading{Adapters: []string{"lora-0", "seen-at-run-time"}}}))
	reg.Republish()
	assert.Equal(t, []string{"lora-0", "lora-1", "lora-2", "seen-at-run-time"}, w2.Adapters())
	assert.Equal(t, 1, reg.Snapshot().Group([]byte("seen-at-run-time")).Len(), "no config names it; the engine runs it on worker 2")
	assert.True(t, w2.SetEngine(nil), "the reading went stale")
	reg.Republish()
	assert.Equal(t, []string{"lora-1", "lora-2"}, w2.Adapters())
}

// TestPicksOnlyHoldersAndCountsLoad: 64 goroutines select by model under
// every mode; each pick holds the adapter, every adapter's load and every
// worker's occupancy return to 0.
func TestPicksOnlyHoldersAndCountsLoad(t *testing.T) {
	for _, mode := range []pickers.Mode{pickers.ModeRoundRobin, pickers.ModeRandom, pickers.ModeP2C, pickers.ModeLeastLoaded, pickers.ModeWeighted} {
		reg := loraFleet(t, 64, 16)
		sel := newSelector(t, reg, mode, 4)
		var wg sync.WaitGroup
		for g := 0; g < 64; g++ {
			wg.Go(func() {
				var req Request
				var res Reservation
				for i := 0; i < 300; i++ {
					name := fmt.Sprintf("lora-%d", (g+i)%16)
					req.Reset()
					req.Model = append(req.Model, name...)
					if err := sel.Select(&req, &res); err != nil {
						require.ErrorIs(t, err, ErrResourceExhausted)
						continue
					}
					if !slices.Contains(res.Worker().Spec().LoRAs, name) || res.Group().Name() != name {
						t.Errorf("%s: worker %d does not hold %s", mode, res.Worker().ID(), name)
					}
					res.Release()
				}
			})
		}
		wg.Wait()
		for _, g := range reg.Snapshot().Groups() {
			assert.Zero(t, g.Inflight(), "%s %s", mode, g.Name())
		}
		assertIdle(t, reg)
	}
}

func TestAllHoldersBusyIsExhaustedAndNamedWorkerMustHold(t *testing.T) {
	reg := loraFleet(t, 4, 4)
	sel := newSelector(t, reg, pickers.ModeP2C, 1)
	model := []byte("lora-0") // workers 1 and 4
	var held [2]Reservation
	for i := range held {
		require.NoError(t, sel.Select(&Request{Model: model}, &held[i]))
	}
	g := reg.Snapshot().Group(model)
	assert.Equal(t, int64(2), g.Inflight())
	var res Reservation
	assert.ErrorIs(t, sel.Select(&Request{Model: model}, &res), ErrResourceExhausted)
	for i := range held {
		held[i].Release()
	}
	assert.ErrorContains(t, sel.Select(&Request{Model: model, WorkerID: 2}, &res), `worker 2 does not hold adapter "lora-0"`)
	require.NoError(t, reg.Drain(1))
	require.NoError(t, reg.Drain(4))
	assert.ErrorContains(t, sel.Select(&Request{Model: model}, &res), `no routable worker holds adapter "lora-0"`)
	assert.Zero(t, g.Inflight())
}

// A model no worker lists is a 404 once workers list base models; with
// rendezvous placement it goes to the worker its name hashes to.
func TestUnknownModelAndAdapterPlacement(t *testing.T) {
	reg := loraFleet(t, 4, 4)
	sel := newSelector(t, reg, pickers.ModeRoundRobin, 0)
	var res Reservation
	require.NoError(t, sel.Select(&Request{Model: []byte("base")}, &res), "no worker listed its models: nothing to judge by")
	res.Release()
	w1, _ := reg.Get(1)
	w1.SetAdvertised(Advertised{Models: []string{"base"}})
	reg.Republish()
	require.NoError(t, sel.Select(&Request{Model: []byte("base")}, &res))
	res.Release()
	err := sel.Select(&Request{Model: []byte("other")}, &res)
	assert.ErrorIs(t, err, ErrNotFound)
	assert.EqualError(t, err, `model "other" is neither a base model nor a LoRA adapter of any worker`)

	sel.SetRouting(Routing{PlaceAdapters: true})
	want, ok := reg.Snapshot().Rendezvous(affinity.Key([]byte("other")), PhaseAny, nil)
	require.True(t, ok)
	for range 5 {
		require.NoError(t, sel.Select(&Request{Model: []byte("other")}, &res))
		assert.Equal(t, want, res.Worker().ID())
		res.Release()
	}
	assertIdle(t, reg)
}

// modelFleet registers four workers: 1 and 2 list base model "llama", 3
// lists "qwen", 4 lists nothing yet (it may serve either).
func modelFleet(tb testing.TB) *Registry {
	reg := NewRegistry()
	lists := [][]string{{"llama"}, {"llama"}, {"qwen", "qwen-alias"}, nil}
	for i, models := range lists {
		w, err := reg.Add(WorkerSpec{ID: uint64(i + 1), URL: fmt.Sprintf("http://127.0.0.1:%d", 9000+i)})
		require.NoError(tb, err)
		if models != nil {
			w.SetAdvertised(Advertised{Models: models})
		}
	}
	reg.Republish()
	return reg
}

// A fleet serving several base models sends each request to a worker that
// lists its model (or lists nothing yet), in every mode; a model every
// routable worker serves restricts nothing.
func TestABaseModelGoesOnlyToItsServers(t *testing.T) {
	for _, mode := range []pickers.Mode{pickers.ModeRoundRobin, pickers.ModeRandom, pickers.ModeP2C, pickers.ModeLeastLoaded, pickers.ModeWeighted, pickers.ModeLoadAware} {
		reg := modelFleet(t)
		sel := newSelector(t, reg, mode, 0)
		seen := map[string]map[uint64]int{}
		var res Reservation
		for i := 0; i < 200; i++ {
			model := []string{"llama", "qwen", "qwen-alias"}[i%3]
			require.NoError(t, sel.Select(&Request{Model: []byte(model)}, &res), "%s %s", mode, model)
			if seen[model] == nil {
				seen[model] = map[uint64]int{}
			}
			seen[model][res.Worker().ID()]++
			assert.Nil(t, res.Group(), "a base model's group counts no adapter load")
			res.Release()
		}
		assert.Subset(t, []uint64{1, 2, 4}, slices.Collect(maps.Keys(seen["llama"])), "%s", mode)
		assert.Subset(t, []uint64{3, 4}, slices.Collect(maps.Keys(seen["qwen"])), "%s", mode)
		assert.Subset(t, []uint64{3, 4}, slices.Collect(maps.Keys(seen["qwen-alias"])), "%s", mode)
		assertIdle(t, reg)
	}
	sel := newSelector(t, modelFleet(t), pickers.ModeRoundRobin, 0)
	for model, want := range map[string][]uint64{"llama": {1, 2, 4}, "qwen": {3, 4}} {
		seen := map[uint64]bool{}
		var res Reservation
		for range 12 {
			require.NoError(t, sel.Select(&Request{Model: []byte(model)}, &res))
			seen[res.Worker().ID()] = true
			res.Release()
		}
		assert.ElementsMatch(t, want, slices.Collect(maps.Keys(seen)), "round-robin goes round the model's servers")
	}

	reg := modelFleet(t)
	w4, _ := reg.Get(4)
	w4.SetAdvertised(Advertised{Models: []string{"llama"}})
	reg.Republish()
	snap := reg.Snapshot()
	assert.Equal(t, []uint64{1, 2, 4}, snap.ModelGroup([]byte("llama")).ids)
	assert.Equal(t, []uint64{3}, snap.ModelGroup([]byte("qwen")).ids)
	assert.Nil(t, snap.ModelGroup([]byte("lora-x")), "not a base model")

	sel = newSelector(t, reg, pickers.ModeP2C, 1)
	var held, res Reservation
	require.NoError(t, sel.Select(&Request{Model: []byte("qwen")}, &held))
	assert.Equal(t, uint64(3), held.Worker().ID())
	err := sel.Select(&Request{Model: []byte("qwen")}, &res)
	assert.ErrorIs(t, err, ErrResourceExhausted)
	assert.ErrorContains(t, err, `every worker holding model "qwen" is busy`)
	held.Release()
	err = sel.Select(&Request{Model: []byte("qwen"), WorkerID: 1}, &res)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, `worker 1 does not hold model "qwen"`)
	require.NoError(t, sel.Select(&Request{Model: []byte("llama"), WorkerID: 4}, &res))
	res.Release()
	reg.SetHealthy(3, false)
	err = sel.Select(&Request{Model: []byte("qwen")}, &res)
	assert.ErrorIs(t, err, ErrNoEndpoints)
	assert.ErrorContains(t, err, `no routable worker holds model "qwen"`)
	require.NoError(t, sel.Select(&Request{Model: []byte("llama")}, &res), "the other model's workers still serve")
	res.Release()

	// One model on every worker: no group, the pick is the unrouted one.
	for _, id := range []uint64{1, 2, 3} {
		w, _ := reg.Get(id)
		w.SetAdvertised(Advertised{Models: []string{"llama"}})
	}
	reg.SetHealthy(3, true)
	assert.Nil(t, reg.Snapshot().ModelGroup([]byte("llama")))
	assertIdle(t, reg)
}

// A worker's declared models count from its registration, before and
// without any listing, beside those it lists.
func TestDeclaredModelsRouteBeforeAnyListing(t *testing.T) {
	reg := NewRegistry()
	for id, models := range map[uint64][]string{1: {"llama"}, 2: {"qwen"}, 3: nil} {
		_, err := reg.Add(WorkerSpec{ID: id, URL: fmt.Sprintf("http://127.0.0.1:%d", 9000+id), Models: models})
		require.NoError(t, err)
	}
	snap := reg.Snapshot()
	assert.Equal(t, []uint64{1, 3}, snap.ModelGroup([]byte("llama")).ids, "3 names no model: it may serve any")
	assert.Equal(t, []uint64{2, 3}, snap.ModelGroup([]byte("qwen")).ids)
	w2, _ := reg.Get(2)
	w2.SetAdvertised(Advertised{Models: []string{"qwen-alias"}})
	w3, _ := reg.Get(3)
	w3.SetAdvertised(Advertised{Models: []string{"llama"}})
	reg.Republish()
	assert.Equal(t, []string{"qwen", "qwen-alias"}, w2.Models(), "declared and listed")
	snap = reg.Snapshot()
	assert.Equal(t, []uint64{1, 3}, snap.ModelGroup([]byte("llama")).ids)
	assert.Equal(t, []uint64{2}, snap.ModelGroup([]byte("qwen")).ids)
	assert.Equal(t, []uint64{2}, snap.ModelGroup([]byte("qwen-alias")).ids)
	assert.True(t, snap.Lists([]byte("qwen-alias")))
	assert.False(t, snap.Lists([]byte("mistral")), "a model no worker names")
	reg.SetHealthy(2, false)
	assert.False(t, reg.Snapshot().Lists([]byte("qwen-alias")), "its one worker is not routable")

	anyModel := NewRegistry()
	_, err := anyModel.Add(WorkerSpec{ID: 1, URL: "http://127.0.0.1:9001", LoRAs: []string{"sql-lora"}})
	require.NoError(t, err)
	assert.True(t, anyModel.Snapshot().Lists([]byte("sql-lora")), "an adapter its worker holds")
	assert.True(t, anyModel.Snapshot().Serves([]byte("mistral")), "a worker that names no model may serve any")
	assert.False(t, anyModel.Snapshot().Lists([]byte("mistral")), "but it lists none")
}

func sessionSelector(t testing.TB, reg *Registry, mode affinity.Mode) (*Selector, *affinity.Table) {
	sel := newSelector(t, reg, pickers.ModeRoundRobin, 1)
	tbl := affinity.NewTable(affinity.Options{TTL: time.Minute, MaxSessions: 100})
	sel.SetRouting(Routing{Sessions: tbl, SessionMode: mode, SessionHeader: "x-session-id"})
	return sel, tbl
}

// selectAnswered is one request of a session that its worker answers.
func selectAnswered(t *testing.T, sel *Selector, session string) uint64 {
	t.Helper()
	req := Request{Session: []byte(session)}
	var res Reservation
	require.NoError(t, sel.Select(&req, &res))
	sel.Answered(&req, &res)
	res.Release()
	return res.Worker().ID()
}

func TestHardSessionPin(t *testing.T) {
	reg := newFleet(t, 4)
	sel, tbl := sessionSelector(t, reg, affinity.Hard)
	first := selectAnswered(t, sel, "s")
	for range 5 {
		assert.Equal(t, first, selectAnswered(t, sel, "s"), "a hard pin holds")
	}

	// Its worker busy: a 429, and the pin stays.
	var busy, res Reservation
	require.NoError(t, sel.Select(&Request{WorkerID: first}, &busy))
	assert.ErrorIs(t, sel.Select(&Request{Session: []byte("s")}, &res), ErrResourceExhausted)
	busy.Release()
	_, st := tbl.Get([]byte("s"))
	assert.Equal(t, affinity.Pinned, st)

	// Its worker failed before answering: the pin goes, and the error says so.
	req := Request{Session: []byte("s")}
	require.NoError(t, sel.Select(&req, &res))
	res.Release()
	assert.ErrorContains(t, sel.Unanswered(&req, first, "failed before answering (connection refused)"),
		`session "s" is pinned to worker `+fmt.Sprint(first)+`, which failed before answering (connection refused); the pin is dropped`)
	_, st = tbl.Get([]byte("s"))
	assert.Equal(t, affinity.Missing, st)
	assert.NoError(t, sel.Unanswered(&Request{}, first, "x"), "an unpinned request has nothing to add")

	// Its worker left: one 503 naming it, then a new pin elsewhere.
	first = selectAnswered(t, sel, "s")
	require.NoError(t, reg.Drain(first))
	err := sel.Select(&Request{Session: []byte("s")}, &res)
	assert.ErrorIs(t, err, ErrNoEndpoints)
	assert.ErrorContains(t, err, fmt.Sprintf("pinned to worker %d, which left", first))
	assert.NotEqual(t, first, selectAnswered(t, sel, "s"))
	assertIdle(t, reg)
}

func TestSoftSessionPinYieldsWhileBusy(t *testing.T) {
	reg := newFleet(t, 4)
	sel, _ := sessionSelector(t, reg, affinity.Soft)
	first := selectAnswered(t, sel, "s")
	var busy Reservation
	require.NoError(t, sel.Select(&Request{WorkerID: first}, &busy))
	moved := selectAnswered(t, sel, "s")
	assert.NotEqual(t, first, moved, "a soft pin yields to a free worker")
	busy.Release()
	assert.Equal(t, moved, selectAnswered(t, sel, "s"), "and moves with the answer")

	long := make([]byte, MaxSessionID+1)
	var res Reservation
	assert.ErrorContains(t, sel.Select(&Request{Session: long}, &res), "header x-session-id: session id is longer than 256 bytes")
	assertIdle(t, reg)
}

// A session hint (a key from the body, which many clients may share) is
// preferred only while its worker is within the slack of the least
// loaded, and is never a hard pin: beyond, the picker decides; the session
// header's pin is preferred while its worker is free.
func TestASessionHintYieldsBeyondTheSlack(t *testing.T) {
	for _, mode := range []affinity.Mode{affinity.Soft, affinity.Hard} {
		reg := newFleet(t, 4)
		sel := newSelector(t, reg, pickers.ModeLeastLoaded, 64)
		sel.SetRouting(Routing{Sessions: affinity.NewTable(affinity.Options{TTL: time.Minute, MaxSessions: 100}),
			SessionMode: mode, SessionHeader: "x-session-id", PrefixSlack: 2})
		hinted := func() uint64 {
			req := Request{Session: []byte("app-key"), SessionHint: true}
			var res Reservation
			require.NoError(t, sel.Select(&req, &res), "%s", mode)
			sel.Answered(&req, &res)
			res.Release()
			return res.Worker().ID()
		}
		first := hinted()
		assert.Equal(t, first, hinted(), "%s: preferred while near the least loaded", mode)
		held := make([]Reservation, 3)
		for i := range held {
			require.NoError(t, sel.Select(&Request{WorkerID: first}, &held[i]))
			if i == 1 {
				assert.Equal(t, first, hinted(), "%s: 2 more than the least loaded is within a slack of 2", mode)
			}
		}
		assert.NotEqual(t, first, hinted(), "%s: 3 more is not: the hint yields, and is no hard pin", mode)
		for i := range held {
			held[i].Release()
		}
	}
	// The header's session stays on its free worker however busy it is.
	reg := newFleet(t, 4)
	sel := newSelector(t, reg, pickers.ModeLeastLoaded, 64)
	sel.SetRouting(Routing{Sessions: affinity.NewTable(affinity.Options{TTL: time.Minute, MaxSessions: 100}),
		SessionMode: affinity.Soft, SessionHeader: "x-session-id", PrefixSlack: 2})
	first := selectAnswered(t, sel, "s")
	held := make([]Reservation, 3)
	for i := range held {
		require.NoError(t, sel.Select(&Request{WorkerID: first}, &held[i]))
	}
	assert.Equal(t, first, selectAnswered(t, sel, "s"))
	for i := range held {
		held[i].Release()
	}
	assertIdle(t, reg)
}

func TestEmbeddingCacheSteersToTheHolderOfMostInputs(t *testing.T) {
	reg := newFleet(t, 4)
	sel := newSelector(t, reg, pickers.ModeRoundRobin, 0)
	sel.SetRouting(Routing{EmbedCache: affinity.NewCache(100)})
	keys := []uint64{affinity.Key([]byte("a")), affinity.Key([]byte("b")), affinity.Key([]byte("c"))}
	req := Request{CacheKeys: keys[:2]}
	var res Reservation
	require.NoError(t, sel.Select(&req, &res))
	sel.Answered(&req, &res)
	res.Release()
	holder := res.Worker().ID()
	req = Request{CacheKeys: keys[2:]}
	require.NoError(t, sel.Select(&req, &res))
	sel.Answered(&req, &res) // c is cached on another worker (round-robin moved on)
	res.Release()
	require.NotEqual(t, holder, res.Worker().ID())
	for range 4 {
		require.NoError(t, sel.Select(&Request{CacheKeys: keys}, &res))
		assert.Equal(t, holder, res.Worker().ID(), "two of three inputs are there")
		res.Release()
	}
	assertIdle(t, reg)
}

// A split request's prefill follows its session's prefill pin (soft in hard
// mode too) and its decode's adapter; with no prefill worker it falls back
// to running whole on its decode worker, or fails releasing everything.
// Both legs of a split request go to workers serving its base model; with
// none of the model's prefill workers routable the request runs whole on
// a decode worker of the model (the fallback), not on another model's.
func TestASplitRequestStaysWithItsModel(t *testing.T) {
	reg := roleFleet(t, RolePrefill, RolePrefill, RoleDecode, RoleDecode)
	for _, w := range reg.All() {
		w.SetAdvertised(Advertised{Models: []string{[]string{"llama", "qwen"}[w.ID()%2]}}) // qwen: 1 and 3
	}
	reg.Republish()
	sel := newSelector(t, reg, pickers.ModeRoundRobin, 0)
	sel.SetRouting(Routing{PrefillFallback: true})
	for range 4 {
		for model, want := range map[string][2]uint64{"qwen": {1, 3}, "llama": {2, 4}} {
			d, p := Request{Model: []byte(model), Phase: PhaseDecode}, Request{Phase: PhasePrefill}
			var dr, pr Reservation
			split, err := sel.SelectSplit(&d, &p, &dr, &pr)
			require.NoError(t, err)
			require.Equal(t, SplitLegs, split)
			assert.Equal(t, want, [2]uint64{pr.Worker().ID(), dr.Worker().ID()}, model)
			dr.Release()
			pr.Release()
		}
	}
	reg.SetHealthy(1, false)
	d, p := Request{Model: []byte("qwen"), Phase: PhaseDecode}, Request{Phase: PhasePrefill}
	var dr, pr Reservation
	split, err := sel.SelectSplit(&d, &p, &dr, &pr)
	require.NoError(t, err)
	assert.Equal(t, SplitNoPrefill, split, "qwen's only prefill worker is down: whole on its decode worker")
	assert.Equal(t, uint64(3), dr.Worker().ID())
	dr.Release()
	assertIdle(t, reg)
}

func TestSelectSplit(t *testing.T) {
	reg := NewRegistry()
	for id, role := range map[uint64]Role{1: RolePrefill, 2: RolePrefill, 3: RoleDecode, 4: RoleDecode} {
		_, err := reg.Add(WorkerSpec{ID: id, URL: fmt.Sprintf("http://127.0.0.1:%d", 9000+id), Role: role, LoRAs: []string{"ad"}})
		require.NoError(t, err)
	}
	sel, tbl := sessionSelector(t, reg, affinity.Hard)
	split := func() (pre, dec uint64, ok bool, err error) {
		d, p := Request{Session: []byte("s"), Model: []byte("ad"), Phase: PhaseDecode}, Request{Phase: PhasePrefill}
		var dr, pr Reservation
		placed, err := sel.SelectSplit(&d, &p, &dr, &pr)
		if err != nil {
			return 0, 0, false, err
		}
		ok = placed == SplitLegs
		sel.Answered(&d, &dr)
		dr.Release()
		if ok {
			assert.Equal(t, "ad", pr.Group().Name())
			sel.Answered(&p, &pr)
			pr.Release()
			pre = pr.Worker().ID()
		}
		return pre, dr.Worker().ID(), ok, nil
	}
	pre, dec, ok, err := split()
	require.NoError(t, err)
	require.True(t, ok)
	for range 3 {
		p, d, _, err := split()
		require.NoError(t, err)
		assert.Equal(t, [2]uint64{pre, dec}, [2]uint64{p, d}, "both pins hold")
	}
	_, st := tbl.Get(append([]byte("s"), prefillPin...))
	assert.Equal(t, affinity.Pinned, st)

	var busy Reservation // the prefill pin is soft: a busy pinned prefill worker yields
	require.NoError(t, sel.Select(&Request{WorkerID: pre, Phase: PhasePrefill}, &busy))
	p, _, _, err := split()
	require.NoError(t, err)
	assert.NotEqual(t, pre, p)
	busy.Release()

	require.NoError(t, reg.Drain(1))
	require.NoError(t, reg.Drain(2))
	_, _, _, err = split()
	assert.ErrorIs(t, err, ErrNoEndpoints)
	rt := *sel.Routing()
	rt.PrefillFallback = true
	sel.routing.Store(&rt)
	_, d, ok, err := split()
	require.NoError(t, err)
	assert.False(t, ok, "run whole")
	assert.Equal(t, dec, d)
	assertIdle(t, reg)
}

func TestASplitWhosePicksAreOneWorkerRunsWhole(t *testing.T) {
	reg := roleFleet(t, RoleBoth, RoleDecode, RoleDecode)
	sel := newSelector(t, reg, pickers.ModeLeastLoaded, 0)
	// Three splits whose decode legs are held at once (a prefill leg ends
	// first): least-loaded spreads the decode picks over the three
	// workers, and worker 1 is the only prefill worker.
	got := map[uint64]Split{}
	var held []*Reservation
	for range 3 {
		d, p := Request{Phase: PhaseDecode}, Request{Phase: PhasePrefill}
		dr, pr := new(Reservation), new(Reservation)
		split, err := sel.SelectSplit(&d, &p, dr, pr)
		require.NoError(t, err)
		got[dr.Worker().ID()] = split
		held = append(held, dr)
		if split == SplitLegs {
			assert.Equal(t, uint64(1), pr.Worker().ID())
			assert.True(t, pr.Release())
		} else {
			assert.False(t, pr.Held(), "the prefill pick is let go")
		}
	}
	assert.Equal(t, map[uint64]Split{1: SplitOneWorker, 2: SplitLegs, 3: SplitLegs}, got)
	w1, _ := reg.Get(1)
	assert.EqualValues(t, 1, w1.Occupancy(), "worker 1 holds its whole request only")
	for _, r := range held {
		r.Release()
	}
	assertIdle(t, reg)

	// A worker's data-parallel ranks are engines of their own: a split
	// over two ranks of one worker keeps its legs.
	reg = NewRegistry()
	_, err := reg.Add(WorkerSpec{ID: 1, URL: "http://127.0.0.1:9001", Role: RoleBoth, DPSize: 2})
	require.NoError(t, err)
	sel = newSelector(t, reg, pickers.ModeLeastLoaded, 0)
	d, p := Request{Phase: PhaseDecode}, Request{Phase: PhasePrefill}
	var dr, pr Reservation
	split, err := sel.SelectSplit(&d, &p, &dr, &pr)
	require.NoError(t, err)
	assert.Equal(t, SplitLegs, split)
	assert.NotEqual(t, dr.Rank(), pr.Rank())
	dr.Release()
	pr.Release()
	assertIdle(t, reg)
}

// A split runs whole on its decode worker while every prefill worker is
// busy (fallback aggregated) and while its prefill pick's engine has
// MaxPrefillQueue requests waiting, as a decode engine prefills a request
// itself; a named prefill worker splits regardless.
func TestASplitRunsWholeWhileThePrefillPoolIsBusyOrQueued(t *testing.T) {
	reg := roleFleet(t, RolePrefill, RoleDecode)
	sel := newSelector(t, reg, pickers.ModeLeastLoaded, 1)
	// The prompt's prefixes are recorded where it is prefilled: at the
	// prefill worker when split, else at the decode worker.
	prefixes := affinity.NewPrefixes(64)
	routing := func(rt Routing) {
		rt.Prefixes, rt.PrefixSlack = prefixes, 4
		sel.SetRouting(rt)
	}
	routing(Routing{})
	keys := []uint64{7, 8, 9}
	split := func(preID uint64) (Split, error) {
		prefixes.Record(keys, 99) // no worker's: the holder below is this request's
		d, p := Request{Phase: PhaseDecode}, Request{Phase: PhasePrefill, WorkerID: preID, PrefixKeys: keys}
		var dr, pr Reservation
		s, err := sel.SelectSplit(&d, &p, &dr, &pr)
		if err == nil {
			assert.Equal(t, uint64(2), dr.Worker().ID())
			assert.Equal(t, s == SplitLegs, pr.Held())
			holder, _ := prefixes.Holder(keys)
			want := uint64(2)
			if s == SplitLegs {
				want = 1
			}
			assert.Equal(t, want, holder, "split %d: the prompt's prefixes are where it is prefilled", s)
			dr.Release()
			pr.Release()
		}
		return s, err
	}

	var busy Reservation // the prefill worker at its cap of 1
	require.NoError(t, sel.Select(&Request{WorkerID: 1, Phase: PhasePrefill}, &busy))
	_, err := split(0)
	assert.ErrorIs(t, err, ErrResourceExhausted, "fallback error: the 429")
	routing(Routing{PrefillFallback: true})
	_, err = split(0)
	assert.ErrorIs(t, err, ErrResourceExhausted, "SGLang's decode servers prefill nothing themselves: the 429")
	routing(Routing{PrefillFallback: true, DecodePrefills: true})
	got, err := split(0)
	require.NoError(t, err)
	assert.Equal(t, SplitNoPrefill, got)
	busy.Release()

	w1, _ := reg.Get(1)
	for _, c := range []struct {
		waiting float64
		reading bool
		limit   int
		named   uint64
		want    Split
	}{
		{waiting: 3, reading: true, limit: 2, want: SplitPrefillQueue},
		{waiting: 2, reading: true, limit: 2, want: SplitPrefillQueue},
		{waiting: 1, reading: true, limit: 2, want: SplitLegs},
		{waiting: 3, reading: false, limit: 2, want: SplitLegs}, // no fresh reading: no queue known
		{waiting: 3, reading: true, limit: 0, want: SplitLegs},  // off
		{waiting: 3, reading: true, limit: 2, named: 1, want: SplitLegs},
	} {
		routing(Routing{PrefillFallback: true, DecodePrefills: true, MaxPrefillQueue: c.limit})
		if c.reading {
			w1.SetEngine(&engine.Stats{Reading: engine.Reading{Running: 4, Waiting: c.waiting}})
		} else {
			w1.SetEngine(nil)
		}
		got, err := split(c.named)
		require.NoError(t, err)
		assert.Equal(t, c.want, got, "%+v", c)
	}
	assertIdle(t, reg)
}

// With prefix affinity and min_prefill_tokens (CachedSplits), a split
// request whose decode pick holds its prompt's longest known prefix, all
// but less than MinPrefillTokens of it, runs whole there: the next turn of
// a conversation that worker decoded.
func TestASplitRunsWholeOnADecodeWorkerHoldingMostOfItsPrompt(t *testing.T) {
	reg := roleFleet(t, RolePrefill, RoleDecode, RoleDecode)
	sel := newSelector(t, reg, pickers.ModeLeastLoaded, 0)
	prefixes := affinity.NewPrefixes(64)
	rt := Routing{Prefixes: prefixes, PrefixSlack: 4, PrefixBlock: 256, MinPrefillTokens: 100, PrefillFallback: true, DecodePrefills: true}
	sel.SetRouting(rt)
	keys := []uint64{101, 102, 103, 104, 105, 106, 107, 108} // a prompt's 256-byte blocks, in order
	// turn splits a prompt of its first blocks keys and bytes bytes.
	turn := func(blocks, bytes int, preID uint64) (Split, uint64) {
		d, p := Request{Phase: PhaseDecode, PromptBytes: bytes}, Request{Phase: PhasePrefill, WorkerID: preID}
		d.PrefixKeys = affinity.DecodeKeys(nil, keys[:blocks])
		p.PrefixKeys = keys[:blocks]
		var dr, pr Reservation
		split, err := sel.SelectSplit(&d, &p, &dr, &pr)
		require.NoError(t, err)
		assert.Equal(t, split == SplitLegs, pr.Held())
		dr.Release()
		pr.Release()
		return split, dr.Worker().ID()
	}
	split, decoder := turn(4, 1100, 0)
	require.Equal(t, SplitLegs, split, "nothing known yet")
	split, w := turn(5, 1300, 0) // 276 bytes more than the 4 blocks held: 69 tokens
	assert.Equal(t, SplitCached, split)
	assert.Equal(t, decoder, w, "on the worker that decoded the first turn")
	holder, blocks := prefixes.Holder(keys[:5])
	assert.Equal(t, [2]uint64{decoder, 5}, [2]uint64{holder, uint64(blocks)}, "its worker prefilled it: its own keys recorded there")
	split, w = turn(6, 1300+800, 0) // 5 blocks held, 820 bytes more: 205 tokens
	assert.Equal(t, SplitLegs, split)
	assert.Equal(t, decoder, w, "still preferred while within the slack")
	split, _ = turn(7, 1792+100, 1)
	assert.Equal(t, SplitLegs, split, "a named prefill worker splits regardless")
	rt.DecodePrefills = false // SGLang's decode servers prefill nothing
	sel.SetRouting(rt)
	split, _ = turn(7, 1792+100, 0)
	assert.Equal(t, SplitLegs, split)
	assertIdle(t, reg)
}

// SelectSplit allocates nothing, however it places a request: on two
// workers, whole on a decode worker holding the prompt, whole on a worker
// of role both that is both picks, whole while the prefill pick's engine
// has a queue, whole while no prefill worker is free; a session's two pins
// and prompt prefixes included.
func TestSelectSplitDoesNotAllocate(t *testing.T) {
	reg := roleFleet(t, RolePrefill, RoleBoth, RoleDecode, RoleDecode)
	sel := newSelector(t, reg, pickers.ModeRoundRobin, 64)
	tbl := affinity.NewTable(affinity.Options{TTL: time.Minute, MaxSessions: 1000})
	sel.SetRouting(Routing{Sessions: tbl, SessionMode: affinity.Soft, Prefixes: affinity.NewPrefixes(64), PrefixSlack: 4, PrefixBlock: 256,
		MinPrefillTokens: 1, PrefillFallback: true, DecodePrefills: true, MaxPrefillQueue: 2})
	session := []byte("0b7c1c3e-6f1a-4d43-9a57-3c2f0e1d5b9a")
	var dec, pre Request
	var dr, pr Reservation
	// place splits a request of bytes bytes (the three blocks of its keys,
	// and more) whose decode (and prefill, when not 0) worker is named, and
	// checks where it went.
	place := func(decID, preID uint64, bytes int, want Split) {
		n := testing.AllocsPerRun(200, func() {
			dec.Reset()
			pre.Reset()
			dec.Phase, pre.Phase, dec.WorkerID, pre.WorkerID = PhaseDecode, PhasePrefill, decID, preID
			dec.Session = append(dec.Session, session...)
			dec.PrefixKeys = affinity.DecodeKeys(dec.PrefixKeys, []uint64{11, 12, 13})
			dec.PromptBytes = bytes
			pre.PrefixKeys = append(pre.PrefixKeys, 11, 12, 13)
			split, err := sel.SelectSplit(&dec, &pre, &dr, &pr)
			if err != nil || split != want {
				t.Fatalf("split %d (%v), want %d", split, err, want)
			}
			sel.Answered(&dec, &dr)
			if split == SplitLegs {
				sel.Answered(&pre, &pr)
			}
			dr.Release()
			pr.Release()
		})
		assert.Zero(t, n, "placed %d", want)
	}
	place(3, 0, 3*256+4, SplitLegs)    // a token more than the blocks worker 3 comes to hold
	place(3, 0, 3*256, SplitCached)    // all of it held there
	place(2, 2, 3*256, SplitOneWorker) // named: neither held nor queued counts
	require.NoError(t, reg.Drain(2))   // worker 1 alone prefills, and its engine has a queue
	w1, _ := reg.Get(1)
	w1.SetEngine(&engine.Stats{Reading: engine.Reading{Running: 1, Waiting: 3}})
	place(3, 0, 3*256+4, SplitPrefillQueue)
	require.NoError(t, reg.Drain(1))
	place(3, 0, 3*256+4, SplitNoPrefill)
	assertIdle(t, reg)
}

// A request for an adapter whose holders are all busy, or none of them
// routable, is refused without allocating: its group's errors are made
// once.
func TestAnAdapterRefusalDoesNotAllocate(t *testing.T) {
	reg := NewRegistry()
	for id, loras := range map[uint64][]string{1: {"ad"}, 2: {"other"}} {
		_, err := reg.Add(WorkerSpec{ID: id, URL: fmt.Sprintf("http://127.0.0.1:%d", 9000+id), LoRAs: loras})
		require.NoError(t, err)
	}
	sel := newSelector(t, reg, pickers.ModeLeastLoaded, 1)
	var busy Reservation
	require.NoError(t, sel.Select(&Request{Model: []byte("ad")}, &busy))
	var req Request
	var res Reservation
	refused := func(want string) {
		t.Helper()
		var err error
		n := testing.AllocsPerRun(100, func() {
			req.Reset()
			req.Model = append(req.Model, "ad"...)
			err = sel.Select(&req, &res)
		})
		assert.ErrorContains(t, err, want)
		assert.Zero(t, n, want)
	}
	refused(`every worker holding adapter "ad" is busy`)
	busy.Release()
	reg.SetHealthy(1, false)
	refused(`no routable worker holds adapter "ad"`)
	assertIdle(t, reg)
}

func TestRoutedSelectDoesNotAllocate(t *testing.T) {
	reg := loraFleet(t, 64, 16)
	for _, w := range reg.All() {
		require.NoError(t, reg.SetAdapters(w.ID(), append(w.Spec().LoRAs, "x")))
	}
	sel := newSelector(t, reg, pickers.ModeWeighted, 64)
	tbl := affinity.NewTable(affinity.Options{TTL: time.Minute, MaxSessions: 1000})
	sel.SetRouting(Routing{Sessions: tbl, SessionMode: affinity.Soft, EmbedCache: affinity.NewCache(100)})
	session := []byte("0b7c1c3e-6f1a-4d43-9a57-3c2f0e1d5b9a")
	tbl.Put(session, affinity.Pin{Worker: 42, Rank: 1})
	var req Request
	var res Reservation
	n := testing.AllocsPerRun(1000, func() {
		req.Reset()
		req.Model = append(req.Model, "lora-5"...)
		req.Session = append(req.Session, session...)
		req.CacheKeys = append(req.CacheKeys, 7, 8)
		if err := sel.Select(&req, &res); err != nil {
			t.Fatal(err)
		}
		sel.Answered(&req, &res)
		res.Release()
	})
	assert.Zero(t, n)

	msel := newSelector(t, modelFleet(t), pickers.ModeWeighted, 64)
	msel.SetRouting(Routing{Sessions: tbl, SessionMode: affinity.Soft})
	n = testing.AllocsPerRun(1000, func() {
		req.Reset()
		req.Model = append(req.Model, "qwen"...)
		req.Session = append(req.Session, session...)
		if err := msel.Select(&req, &res); err != nil {
			t.Fatal(err)
		}
		msel.Answered(&req, &res)
		res.Release()
	})
	assert.Zero(t, n, "a base model's group")

	n = testing.AllocsPerRun(1000, func() {
		req.Reset()
		req.Session, req.SessionHint = append(req.Session, "app-key"...), true
		if err := msel.Select(&req, &res); err != nil {
			t.Fatal(err)
		}
		msel.Answered(&req, &res)
		res.Release()
	})
	assert.Zero(t, n, "a session hint, held to the slack")
}

// BenchmarkLoRAPick holds the "LoRA filter + pick ≤ 100 ns at 64 workers and
// 16 adapters" target: resolve the model to its group, pick, reserve, release.
func BenchmarkLoRAPick(b *testing.B) {
	for _, mode := range []pickers.Mode{pickers.ModeP2C, pickers.ModeLeastLoaded, pickers.ModeWeighted} {
		b.Run(string(mode), func(b *testing.B) {
			sel := newSelector(b, loraFleet(b, 64, 16), mode, 64)
			var req Request
			var r Reservation
			models := make([][]byte, 16)
			for i := range models {
				models[i] = fmt.Appendf(nil, "lora-%d", i)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				req.Reset()
				req.Model = append(req.Model, models[i&15]...)
				if err := sel.Select(&req, &r); err != nil {
					b.Fatal(err)
				}
				r.Release()
				i++
			}
		})
	}
}

// BenchmarkAffinityPick holds the "affinity lookup + pick ≤ 60 ns, 0 allocs
// for a known session" target (64 workers with 2 ranks, 10k sessions in the
// table): the soft pin's worker and rank, reserved and released.
func BenchmarkAffinityPick(b *testing.B) {
	reg := NewRegistry()
	for i := 1; i <= 64; i++ {
		_, err := reg.Add(WorkerSpec{ID: uint64(i), URL: fmt.Sprintf("http://127.0.0.1:%d", 9000+i), DPSize: 2})
		require.NoError(b, err)
	}
	sel := newSelector(b, reg, pickers.ModeP2C, 64)
	tbl := affinity.NewTable(affinity.Options{TTL: time.Minute, MaxSessions: 20000})
	sel.SetRouting(Routing{Sessions: tbl, SessionMode: affinity.Soft})
	for i := 0; i < 10000; i++ {
		tbl.Put(fmt.Appendf(nil, "session-%d", i), affinity.Pin{Worker: uint64(i%64 + 1)})
	}
	session := []byte("0b7c1c3e-6f1a-4d43-9a57-3c2f0e1d5b9a")
	tbl.Put(session, affinity.Pin{Worker: 42, Rank: 1})
	var req Request
	var res Reservation
	b.ReportAllocs()
	for b.Loop() {
		req.Reset()
		req.Session = append(req.Session, session...)
		if err := sel.Select(&req, &res); err != nil {
			b.Fatal(err)
		}
		if res.Worker().ID() != 42 || res.Rank() != 1 {
			b.Fatalf("pin not honoured: worker %d rank %d", res.Worker().ID(), res.Rank())
		}
		res.Release()
	}
}

func TestSplitsLongPromptsAndNamedPrefills(t *testing.T) {
	rt := Routing{MinPrefillTokens: 100}
	assert.False(t, rt.Splits(399, false), "99 tokens at 4 bytes a token")
	assert.True(t, rt.Splits(400, false))
	assert.True(t, rt.Splits(10, true), "a named prefill worker splits any prompt")
	assert.True(t, (&Routing{}).Splits(0, false), "no minimum: every generation request")
}

// responseSelector routes n workers' stored responses.
func responseSelector(t testing.TB, n int, mode pickers.Mode, busy int) (*Registry, *Selector, *affinity.Table) {
	reg := newFleet(t, n)
	sel := newSelector(t, reg, mode, busy)
	tbl := affinity.NewTable(affinity.Options{TTL: time.Minute, MaxSessions: 100})
	sel.SetRouting(Routing{Responses: tbl})
	return reg, sel, tbl
}

func TestAStoredResponseGoesToItsWorker(t *testing.T) {
	reg, sel, _ := responseSelector(t, 4, pickers.ModeRoundRobin, 1)
	id := []byte("resp_1")

	// Unknown: any worker, searching.
	req := Request{Response: id}
	var res Reservation
	require.NoError(t, sel.Select(&req, &res))
	assert.True(t, req.Searching())
	holder := res.Worker().ID()
	sel.Stored(id, &res)
	res.Release()

	for range 5 { // round-robin would rotate
		req = Request{Response: id}
		require.NoError(t, sel.Select(&req, &res))
		assert.Equal(t, holder, res.Worker().ID())
		assert.False(t, req.Searching())
		assert.ErrorContains(t, sel.Retry(&req, &res), "is bound to it", "the response is there only")
	}

	// Its worker busy: a 429 naming it, and the pin stays.
	var busy Reservation
	require.NoError(t, sel.Select(&Request{WorkerID: holder}, &busy))
	err := sel.Select(&Request{Response: id}, &res)
	assert.ErrorIs(t, err, ErrResourceExhausted)
	assert.ErrorContains(t, err, fmt.Sprintf(`response "resp_1" is stored on worker %d, which is busy`, holder))
	busy.Release()

	// x-worker-id names another worker: that one.
	other := holder%4 + 1
	req = Request{Response: id, WorkerID: other}
	require.NoError(t, sel.Select(&req, &res))
	assert.Equal(t, other, res.Worker().ID())
	res.Release()

	// Its worker answered 404 (it restarted): forgotten, searched for next.
	req = Request{Response: id}
	require.NoError(t, sel.Select(&req, &res))
	sel.NotStored(&req)
	res.Release()
	req = Request{Response: id}
	require.NoError(t, sel.Select(&req, &res))
	assert.True(t, req.Searching())
	sel.NotStored(&req) // a search's 404 has no pin to drop
	sel.Stored(id, &res)
	holder = res.Worker().ID()
	res.Release()

	// Its worker unhealthy: an error naming both, and again once it
	// drains; back: there again; removed: searched for.
	reg.SetHealthy(holder, false)
	err = sel.Select(&Request{Response: id}, &res)
	assert.ErrorIs(t, err, ErrNoEndpoints)
	assert.ErrorContains(t, err, fmt.Sprintf(`response "resp_1" is stored on worker %d: worker %d is not routable`, holder, holder))
	reg.SetHealthy(holder, true)
	req = Request{Response: id}
	require.NoError(t, sel.Select(&req, &res))
	assert.Equal(t, holder, res.Worker().ID())
	res.Release()
	require.NoError(t, reg.Drain(holder))
	assert.ErrorContains(t, sel.Select(&Request{Response: id}, &res), fmt.Sprintf(`response "resp_1" is stored on worker %d`, holder))
	require.Len(t, reg.SweepDrained(), 1)
	req = Request{Response: id}
	require.NoError(t, sel.Select(&req, &res))
	assert.True(t, req.Searching())
	assert.NotEqual(t, holder, res.Worker().ID())
	res.Release()

	assert.ErrorContains(t, sel.Select(&Request{Response: make([]byte, MaxResponseID+1)}, &res), "response id is longer than 256 bytes")
	assertIdle(t, reg)
}

func TestAStoredResponsePickDoesNotAllocate(t *testing.T) {
	_, sel, tbl := responseSelector(t, 8, pickers.ModeLeastLoaded, 64)
	id := []byte("resp_6a5fecc1ff1c2a6904f3966f")
	tbl.Put(id, affinity.Pin{Worker: 3})
	var req Request
	var res Reservation
	n := testing.AllocsPerRun(1000, func() {
		req.Reset()
		req.Response = append(req.Response, id...)
		if err := sel.Select(&req, &res); err != nil || res.Worker().ID() != 3 {
			t.Fatal(err)
		}
		sel.Stored(req.Response, &res)
		res.Release()
	})
	assert.Zero(t, n)
}

// prefixRequest keys text as the front end keys a prompt (blocks of 16
// bytes here).
func prefixRequest(text string) *Request {
	var h affinity.PrefixHasher
	h.Reset([]byte("m"), 16, 64, nil)
	h.Write([]byte(text))
	return &Request{PrefixKeys: h.Keys()}
}

// A conversation's turns go to the worker its earlier turns went to, while
// that worker is within the slack of the mode's pick; beyond it, or while
// the worker is not routable, the mode picks. A prompt of no whole block
// routes as any other.
func TestAPromptGoesWhereItsPrefixWent(t *testing.T) {
	reg := newFleet(t, 3)
	sel := newSelector(t, reg, pickers.ModeLeastLoaded, 0)
	sel.SetRouting(Routing{Prefixes: affinity.NewPrefixes(1024), PrefixSlack: 2})
	conversation := "system: be brief. user: what is the capital of France?"
	var res Reservation
	require.NoError(t, sel.Select(prefixRequest(conversation), &res))
	holder := res.Worker().ID()
	res.Release()

	conversation += " assistant: Paris. user: and of Spain?"
	var held []*Reservation
	for turn := range 3 { // the holder takes them while it is at most 2 ahead of the least loaded
		r := new(Reservation)
		require.NoError(t, sel.Select(prefixRequest(conversation), r))
		assert.Equal(t, holder, r.Worker().ID(), "turn %d", turn)
		held = append(held, r)
	}
	r := new(Reservation)
	require.NoError(t, sel.Select(prefixRequest(conversation), r))
	assert.NotEqual(t, holder, r.Worker().ID(), "3 ahead of the least loaded: the mode picks")
	moved := r.Worker().ID()
	r.Release()
	taken, passed, unknown := sel.PrefixRouted()
	assert.Equal(t, [3]uint64{3, 1, 1}, [3]uint64{taken, passed, unknown})
	for _, r := range held {
		r.Release()
	}
	require.NoError(t, sel.Select(prefixRequest(conversation), &res))
	assert.Equal(t, moved, res.Worker().ID(), "the prefix was last sent to the other worker: it holds it now")
	res.Release()

	reg.SetHealthy(moved, false)
	require.NoError(t, sel.Select(prefixRequest(conversation), &res))
	assert.NotEqual(t, moved, res.Worker().ID(), "an unhealthy holder is passed over")
	res.Release()

	short := prefixRequest("hi")
	assert.Empty(t, short.PrefixKeys)
	require.NoError(t, sel.Select(short, &res))
	res.Release()
	assertIdle(t, reg)
}

// With every engine priced, the slack is in the engines' cost: an idle slow
// engine does not make a fast holder with slack requests more than it
// look too busy, and an idle holder keeps its prefix unless it is much
// slower than the cheapest engine. Without readings it is in requests in
// flight.
func TestTheSlackIsInEngineCostWhenEveryEngineIsPriced(t *testing.T) {
	reg := newFleet(t, 3)
	fast, slow := engine.Stats{Slots: 16, TokenRate: 60}, engine.Stats{Slots: 4, TokenRate: 10}
	for id, st := range map[uint64]*engine.Stats{1: &fast, 2: &fast, 3: &slow} {
		w, _ := reg.Get(id)
		w.SetEngine(st)
	}
	sel := newSelector(t, reg, pickers.ModeLeastLoaded, 0)
	conversation := "system: be brief. user: what is the capital of France?"
	var held []*Reservation
	hold := func(id uint64, n int) {
		for range n {
			r := new(Reservation)
			require.NoError(t, sel.Select(&Request{WorkerID: id}, r))
			held = append(held, r)
		}
	}
	prefixed := func() uint64 {
		r := new(Reservation)
		require.NoError(t, sel.Select(prefixRequest(conversation), r))
		held = append(held, r)
		return r.Worker().ID()
	}
	sel.SetRouting(Routing{Prefixes: affinity.NewPrefixes(1024), PrefixSlack: 4})
	hold(1, 5)
	hold(2, 5)
	sel.routing.Load().Prefixes.Record(prefixRequest(conversation).PrefixKeys, 1)
	// Worker 1 holds 5, worker 2 holds 5, the slow worker 3 none: 5 is more
	// than 0 + 4 requests, but worker 1's 6/960 is below worker 2's with 4
	// more, 10/960 (and worker 3's 1/40 is no one's bound: it is not the
	// cheapest).
	assert.Equal(t, uint64(1), prefixed(), "taken: within the slack in cost")
	hold(1, 4) // 10 in flight: 11/960 is more than 10/960
	assert.NotEqual(t, uint64(1), prefixed(), "passed: beyond the slack in cost")
	taken, passed, _ := sel.PrefixRouted()
	assert.Equal(t, [2]uint64{1, 1}, [2]uint64{taken, passed})
	for _, r := range held {
		r.Release()
	}
	held = nil

	// All idle: a holder at half the speed keeps its prefix (1/480 is
	// below a fast engine's 5/960 with 4 more); one at 1/24 of it does not
	// (1/40 is above).
	w3, _ := reg.Get(3)
	half := engine.Stats{Slots: 16, TokenRate: 30}
	w3.SetEngine(&half)
	sel.routing.Load().Prefixes.Record(prefixRequest(conversation).PrefixKeys, 3)
	assert.Equal(t, uint64(3), prefixed(), "taken: a slower holder, idle")
	held[len(held)-1].Release()
	w3.SetEngine(&slow)
	assert.NotEqual(t, uint64(3), prefixed(), "passed: a much slower holder, idle")
	for _, r := range held {
		r.Release()
	}
	held = nil
	w3.SetEngine(nil) // one engine unpriced: requests in flight again
	hold(1, 5)
	hold(2, 5)
	sel.routing.Load().Prefixes.Record(prefixRequest(conversation).PrefixKeys, 1)
	assert.NotEqual(t, uint64(1), prefixed(), "passed: 5 is more than worker 3's 0 + 4")
	taken, passed, _ = sel.PrefixRouted()
	assert.Equal(t, [2]uint64{2, 3}, [2]uint64{taken, passed})
	for _, r := range held {
		r.Release()
	}
	held = nil

	// A holder whose speed is not known yet is priced as a probe (two
	// requests at the others' speed): in cost it would be passed even
	// idle, beside a fast engine with its 4 more (1/120 against 4/960).
	// Its slack is in requests in flight, as its speed says nothing yet.
	w3.SetEngine(&slow)
	reg.SetEngine(1, &engine.Stats{Slots: 1, Reading: engine.Reading{Dialect: "vllm"}})
	w1, _ := reg.Get(1)
	require.Positive(t, w1.Engine().StandIn, "priced at a stand-in")
	hold(2, 2)
	sel.routing.Load().Prefixes.Record(prefixRequest(conversation).PrefixKeys, 1)
	assert.Equal(t, uint64(1), prefixed(), "taken: idle, within 4 requests of the least busy")
	hold(1, 4)
	assert.NotEqual(t, uint64(1), prefixed(), "passed: 5 is more than worker 3's 0 + 4")
	taken, passed, _ = sel.PrefixRouted()
	assert.Equal(t, [2]uint64{3, 4}, [2]uint64{taken, passed})
	for _, r := range held {
		r.Release()
	}
	assertIdle(t, reg)
}

func TestAPrefixPickDoesNotAllocate(t *testing.T) {
	reg := newFleet(t, 8)
	sel := newSelector(t, reg, pickers.ModeLeastLoaded, 64)
	sel.SetRouting(Routing{Prefixes: affinity.NewPrefixes(1024), PrefixSlack: 4})
	keys := prefixRequest("a prompt of a few blocks, whose turns come back: " + strings.Repeat("x", 200)).PrefixKeys
	var req Request
	var res Reservation
	assert.Zero(t, testing.AllocsPerRun(1000, func() {
		req.Reset()
		req.PrefixKeys = append(req.PrefixKeys, keys...)
		if err := sel.Select(&req, &res); err != nil {
			t.Fatal(err)
		}
		res.Release()
	}))
	assertIdle(t, reg)
}

// An engine whose speed is not learned yet (one that just joined) is
// priced at the others' mean speed per request times a batch size, so the
// fleet keeps routing by engine cost: the new worker takes requests while
// it is the cheapest, and a slow engine is not fed as it would be by
// requests in flight. The batch is a probe of two requests (or the most
// it was seen running) for an engine that reports its load and its speed
// (a token counter or an inter-token latency histogram), the others' mean
// batch for the router's own reading of one that does not, and for one
// that never tells its speed. Before
// the others are priced, and without a reading, the fleet falls back as
// before.
func TestAnEngineNotLearnedYetIsPricedByTheOthers(t *testing.T) {
	reg := newFleet(t, 3)
	gpu := engine.Stats{Reading: engine.Reading{Running: 10}, Slots: 16, TokenRate: 50} // 800 tokens/s, 10 running
	cpu := engine.Stats{Slots: 4, TokenRate: 8}                                         // 32 tokens/s, idle
	joined := engine.Stats{Reading: engine.Reading{Running: 1}, Slots: 1}               // its speed not learned

	reg.SetEngine(3, &joined)
	w3, _ := reg.Get(3)
	require.NotNil(t, w3.Engine())
	assert.Zero(t, w3.Engine().StandIn, "no engine priced yet: nothing to stand in")
	_, priced := w3.Engine().Cost(0)
	assert.False(t, priced)

	reg.SetEngine(1, &gpu)
	reg.SetEngine(2, &cpu)
	reg.SetEngine(3, &joined)
	assert.InDelta(t, (50.0+8)/2*2, w3.Engine().StandIn, 1e-9, "the mean speed per request times a probe of two")
	c, priced := w3.Engine().Cost(0)
	require.True(t, priced)
	assert.InDelta(t, 2/58.0, c, 1e-12, "its running request and one more over the stand-in")
	routerRead := joined
	routerRead.Dialect = engine.DialectRouter
	reg.SetEngine(3, &routerRead)
	assert.InDelta(t, (50.0+8)/2*(16+4)/2, w3.Engine().StandIn, 1e-9, "the router's own reading: the mean speed per request times the mean batch")
	mute := joined
	mute.Tokens, mute.TokenGaps, mute.TokenGapSeconds = -1, -1, -1
	reg.SetEngine(3, &mute)
	assert.InDelta(t, (50.0+8)/2*(16+4)/2, w3.Engine().StandIn, 1e-9, "an engine that never tells its speed: no probe, which would never end")
	reg.SetEngine(1, &gpu)
	w1, _ := reg.Get(1)
	assert.Zero(t, w1.Engine().StandIn, "a learned engine is priced at its own capacity")
	queued := engine.Stats{Reading: engine.Reading{Running: 4, Waiting: 2}, Slots: 4}
	reg.SetEngine(3, &queued)
	assert.InDelta(t, 29.0*4, w3.Engine().StandIn, 1e-9, "a queue behind 4 running: its batch is 4")
	big := engine.Stats{Reading: engine.Reading{Running: 12}, Slots: 12}
	reg.SetEngine(3, &big)
	assert.InDelta(t, 29.0*12, w3.Engine().StandIn, 1e-9, "more running than the others' mean batch")
	three := engine.Stats{Reading: engine.Reading{Running: 3}, Slots: 3}
	reg.SetEngine(3, &three)
	assert.InDelta(t, 29.0*3, w3.Engine().StandIn, 1e-9, "more running than the probe")
	reg.SetEngine(3, &joined)

	// A worker added to the priced fleet is priced before its engine's
	// first reading as one request's slot at the others' mean speed (its
	// own reading, or a failed scrape's nil, replaces that); before any
	// engine is priced it is not.
	w4, err := reg.AddUnprobed(spec(4))
	require.NoError(t, err)
	require.NotNil(t, w4.Engine())
	c, priced = w4.Engine().Cost(0)
	require.True(t, priced)
	assert.InDelta(t, 1/29.0, c, 1e-12, "one request over (50 + 8) / 2 tokens a second")
	reg.SetEngine(4, nil)
	assert.Nil(t, w4.Engine())
	bare := newFleet(t, 1)
	w5, err := bare.AddUnprobed(spec(5))
	require.NoError(t, err)
	assert.Nil(t, w5.Engine(), "nothing to price it by")

	// Engines of another model run at other speeds: a worker is priced by
	// those serving a model it serves, where any is priced.
	models := NewRegistry()
	for id, m := range map[uint64]string{1: "big", 2: "small", 3: "big"} {
		s := spec(id)
		s.Models = []string{m}
		_, err := models.Add(s)
		require.NoError(t, err)
	}
	models.SetEngine(1, &engine.Stats{Slots: 8, TokenRate: 10})
	models.SetEngine(2, &engine.Stats{Slots: 32, TokenRate: 100})
	models.SetEngine(3, &engine.Stats{Slots: 1})
	joinedBig, _ := models.Get(3)
	assert.InDelta(t, 10.0*2, joinedBig.Engine().StandIn, 1e-9, "priced as the other big-model engine, not the fleet's mean")
	s := spec(4)
	s.Models = []string{"medium"}
	medium, err := models.AddUnprobed(s)
	require.NoError(t, err)
	assert.InDelta(t, 55.0, medium.Engine().StandIn, 1e-9, "no engine of its model priced: the fleet's mean speed, one request")

	for _, mode := range []pickers.Mode{pickers.ModeLoadAware, pickers.ModeWeighted} {
		for _, st := range []engine.Stats{{Slots: 1}, {Reading: engine.Reading{Dialect: engine.DialectRouter}, Slots: 1}} {
			reg.SetEngine(3, &st)
			sel := newSelector(t, reg, mode, 0)
			got, release := selectBurst(t, sel, 12)
			// Worker 1 at (10 + n + 1)/800; the idle CPU engine's 1/32 is
			// above it all along. An engine that reports its load probes:
			// (n + 1)/58 takes the fourth request, and the second it
			// would take only past the burst. The router's own reading,
			// (n + 1)/290, shares them.
			assert.Zero(t, got[2], "%s: the slow engine is not fed: %v", mode, got)
			if st.Dialect == engine.DialectRouter {
				assert.GreaterOrEqual(t, got[3], 4, "%s, router's reading: the new engine takes requests: %v", mode, got)
			} else {
				assert.Equal(t, 1, got[3], "%s: the new engine takes a probe: %v", mode, got)
			}
			assert.Positive(t, got[1], "%s: %v", mode, got)
			release()
		}
	}
	reg.SetEngine(3, &joined)
	assertIdle(t, reg)

	reg.SetEngine(3, nil) // no fresh reading: the fleet falls back to requests in flight
	sel := newSelector(t, reg, pickers.ModeLoadAware, 0)
	got, release := selectBurst(t, sel, 6)
	assert.Equal(t, map[uint64]int{1: 2, 2: 2, 3: 2}, got, "(occupancy + 1) / weight spreads them")
	release()
	assertIdle(t, reg)
}

// An engine whose batch size is not known yet (neither reported, nor
// given by max_inflight, nor seen full) is priced for the larger of the
// most requests it was seen running and the mean batch of the engines of
// its kind (a learned speed within a factor of 2 of its own): engines
// alike are priced alike whatever their busiest moment, and a slow engine
// beside fast ones keeps its own. The router's own reading of a worker
// whose engine gives no metrics (engine.DialectRouter), which counts the
// requests it had in flight there, is priced so too. While its last
// reading is the router's, the front end counts the tokens relayed from
// it.
func TestAnEngineOfUnknownBatchIsPricedForItsKindsBatch(t *testing.T) {
	reg := newFleet(t, 3)
	reg.SetEngine(1, &engine.Stats{Slots: 16, TokenRate: 50, Admit: 32})
	reg.SetEngine(2, &engine.Stats{Slots: 24, TokenRate: 50, Admit: 48})
	w3, _ := reg.Get(3)
	assert.False(t, w3.CountsTokens())
	own := engine.Stats{Reading: engine.Reading{Dialect: engine.DialectRouter}, Slots: 2, TokenRate: 40}
	reg.SetEngine(3, &own)
	assert.True(t, w3.CountsTokens())
	assert.InDelta(t, 20.0, w3.Engine().Slots, 1e-9, "the others' mean batch, not the 2 it was seen holding")
	c, priced := w3.Engine().Cost(0)
	require.True(t, priced)
	assert.InDelta(t, 1/800.0, c, 1e-12, "one request over 20 × 40 tokens a second")
	slow := own
	slow.TokenRate = 8
	reg.SetEngine(3, &slow)
	assert.InDelta(t, 2.0, w3.Engine().Slots, 1e-9, "6 times slower: of another kind, its own")
	seen := own
	seen.Slots = 30
	reg.SetEngine(3, &seen)
	assert.InDelta(t, 30.0, w3.Engine().Slots, 1e-9, "held more than the others' mean")
	fixed := own
	fixed.Slots, fixed.Admit = 4, 8 // max_inflight: 4
	reg.SetEngine(3, &fixed)
	assert.InDelta(t, 4.0, w3.Engine().Slots, 1e-9, "its max_inflight")
	vllm := engine.Stats{Reading: engine.Reading{Dialect: "vllm", Running: 11}, Slots: 11, TokenRate: 45}
	reg.SetEngine(3, &vllm)
	assert.InDelta(t, 20.0, w3.Engine().Slots, 1e-9, "an engine's reading below its batch too")
	assert.False(t, w3.CountsTokens(), "its engine's metrics are back")
	vllm.Waiting = 1
	reg.SetEngine(3, &vllm)
	assert.InDelta(t, 11.0, w3.Engine().Slots, 1e-9, "a queue behind its running requests: its batch")
	vllm.Waiting, vllm.Admit = 0, 22
	reg.SetEngine(3, &vllm)
	assert.InDelta(t, 11.0, w3.Engine().Slots, 1e-9, "seen full: its batch")
	reg.SetEngine(3, &own)
	reg.SetEngine(3, nil)
	assert.True(t, w3.CountsTokens(), "a reading gone stale changes nothing")

	sel, err := NewSelector(reg, pickers.ModeLeastLoaded, 0)
	require.NoError(t, err)
	var res Reservation
	require.NoError(t, sel.Select(&Request{WorkerID: 3}, &res))
	w3.AddRelayedTokens(5)
	w3.AddRelayedTokens(-3) // a usage that says fewer tokens than were counted
	counts := w3.Relayed()
	inFlight, tokens := counts.InFlight, counts.Tokens
	assert.EqualValues(t, 1, inFlight)
	assert.EqualValues(t, 5, tokens)
	res.Release()
	inFlight = w3.Relayed().InFlight
	assert.Zero(t, inFlight)
}

// A prefix holder whose engine's last reading does not show the two
// requests the router just sent it (sent, not yet taken in) is still two
// requests busier than an idle engine: beyond a slack of 1 it loses the
// turn, by engine cost as by requests in flight.
func TestRequestsNotYetTakenInCountAgainstTheHolder(t *testing.T) {
	reg := newFleet(t, 2)
	sel := newSelector(t, reg, pickers.ModeLoadAware, 0)
	sel.SetRouting(Routing{Prefixes: affinity.NewPrefixes(1024), PrefixSlack: 1})
	conversation := "system: be brief. user: what is the capital of France?"
	sel.routing.Load().Prefixes.Record(prefixRequest(conversation).PrefixKeys, 1)
	var held []*Reservation
	for range 2 {
		r := new(Reservation)
		require.NoError(t, sel.Select(&Request{WorkerID: 1}, r))
		held = append(held, r)
	}
	reg.SetEngine(1, &engine.Stats{Slots: 2, TokenRate: 50}) // its reading: nothing running yet
	reg.SetEngine(2, &engine.Stats{Slots: 1})                // idle, priced at a stand-in of 50 × 2
	r := new(Reservation)
	require.NoError(t, sel.Select(prefixRequest(conversation), r))
	assert.Equal(t, uint64(2), r.Worker().ID(), "3/100 against the idle engine's 1/100 with 1 more, 2/100")
	r.Release()
	for _, h := range held {
		h.Release()
	}
	assertIdle(t, reg)
}

// A backup worker takes a request only when no other candidate can: every
// other one busy at its cap, out of rotation, or tried already. Named, it
// takes the request; a soft preference for it (a session's, a prefix's)
// is passed while another may take the request.
func TestBackupWorkersTakeOnlyWhatTheOthersCannot(t *testing.T) {
	for _, mode := range []pickers.Mode{pickers.ModeRoundRobin, pickers.ModeLeastLoaded, pickers.ModeWeighted, pickers.ModeLoadAware} {
		t.Run(string(mode), func(t *testing.T) {
			reg := NewRegistry()
			for id := uint64(1); id <= 3; id++ {
				s := spec(id)
				s.Backup = id == 3
				_, err := reg.Add(s)
				require.NoError(t, err)
			}
			sel := newSelector(t, reg, mode, 2) // two requests in flight at most
			tbl := affinity.NewTable(affinity.Options{TTL: time.Minute, MaxSessions: 100})
			sel.SetRouting(Routing{Sessions: tbl, SessionMode: affinity.Soft, SessionHeader: "x-session-id"})
			w3, _ := reg.Get(3)
			var held []*Reservation
			take := func(req Request) (uint64, error) {
				res := new(Reservation)
				if err := sel.Select(&req, res); err != nil {
					return 0, err
				}
				held = append(held, res)
				return res.Worker().ID(), nil
			}
			for range 4 {
				id, err := take(Request{})
				require.NoError(t, err)
				assert.NotEqual(t, uint64(3), id, "the others are free")
			}
			var reused Request
			var onBackup Reservation
			assert.Zero(t, testing.AllocsPerRun(100, func() {
				reused.Reset()
				require.NoError(t, sel.Select(&reused, &onBackup))
				require.Equal(t, uint64(3), onBackup.Worker().ID())
				onBackup.Release()
			}), "the second pass allocates nothing")
			id, err := take(Request{})
			require.NoError(t, err)
			assert.Equal(t, uint64(3), id, "the others at their cap")
			id, err = take(Request{})
			require.NoError(t, err)
			assert.Equal(t, uint64(3), id)
			_, err = take(Request{})
			assert.ErrorIs(t, err, ErrResourceExhausted, "the backup busy too")
			for _, r := range held {
				r.Release()
			}
			held = held[:0]

			// A session placed on the backup (named) prefers it softly:
			// passed while the others are free.
			req := Request{Session: []byte("s"), WorkerID: 3}
			var res Reservation
			require.NoError(t, sel.Select(&req, &res), "named, the backup takes it")
			sel.Answered(&req, &res)
			res.Release()
			id, err = take(Request{Session: []byte("s")})
			require.NoError(t, err)
			assert.NotEqual(t, uint64(3), id, "a soft pin on the backup is passed while another is free")

			// The others tried (a retry), or out of rotation: the backup.
			retried := Request{}
			var r Reservation
			require.NoError(t, sel.Select(&retried, &r))
			require.NoError(t, sel.Retry(&retried, &r))
			require.NotEqual(t, uint64(3), r.Worker().ID())
			require.NoError(t, sel.Retry(&retried, &r))
			assert.Equal(t, uint64(3), r.Worker().ID(), "both others tried")
			r.Release()
			reg.SetHealthy(1, false)
			reg.SetHealthy(2, false)
			id, err = take(Request{})
			require.NoError(t, err)
			assert.Equal(t, uint64(3), id, "the others out of rotation")
			reg.SetHealthy(1, true)
			reg.SetHealthy(2, true)
			for _, r := range held {
				r.Release()
			}
			for _, w := range reg.All() {
				assert.Zero(t, w.Occupancy(), "worker %d", w.ID())
			}
			assert.Zero(t, w3.Occupancy())
		})
	}
}

// A request an engine refused as longer than its context moves to a
// backup of a longer one when no other worker has one.
func TestARefusedRequestMovesToABackupOfALongerContext(t *testing.T) {
	reg := NewRegistry()
	for id, ctxLen := range map[uint64]int{1: 4096, 2: 4096, 3: 32768} {
		s := spec(id)
		s.MaxModelLen, s.Backup = ctxLen, id == 3
		_, err := reg.Add(s)
		require.NoError(t, err)
	}
	sel := newSelector(t, reg, pickers.ModeLeastLoaded, 0)
	var req Request
	var res Reservation
	require.NoError(t, sel.Select(&req, &res))
	require.NotEqual(t, uint64(3), res.Worker().ID())
	require.True(t, sel.LongerContext(&req, res.Worker()), "the backup's context is longer")
	require.NoError(t, sel.Retry(&req, &res))
	assert.Equal(t, uint64(3), res.Worker().ID())
	res.Release()
	assertIdle(t, reg)
}

// Engines alike (the same speed, batches not known: none was seen full)
// are priced alike, whatever the most requests each was seen running: a
// burst spreads over them evenly, where pricing each for its own busiest
// moment (16, 11 and 15) gave them 11, 8 and 11 of 30. A slow engine
// beside them keeps its own batch and takes nothing of the burst.
func TestEnginesAlikeArePricedAlike(t *testing.T) {
	reg := newFleet(t, 4)
	for range 2 { // two scrapes: the first engine read had no peer yet
		for _, e := range []struct {
			id   uint64
			seen float64
		}{{2, 11}, {3, 15}, {1, 16}} {
			reg.SetEngine(e.id, &engine.Stats{Slots: e.seen, TokenRate: 50})
		}
	}
	reg.SetEngine(4, &engine.Stats{Slots: 4, TokenRate: 8})
	w4, _ := reg.Get(4)
	assert.InDelta(t, 4.0, w4.Engine().Slots, 1e-9)
	sel := newSelector(t, reg, pickers.ModeLoadAware, 0)
	got, release := selectBurst(t, sel, 30)
	assert.Equal(t, map[uint64]int{1: 10, 2: 10, 3: 10}, got)
	release()
	assertIdle(t, reg)
}

// selectBurst selects n requests at once, holding each, and returns how
// many each worker took and a function that releases them all.
func selectBurst(t *testing.T, sel *Selector, n int) (got map[uint64]int, release func()) {
	t.Helper()
	got = map[uint64]int{}
	held := make([]*Reservation, 0, n)
	for range n {
		r := new(Reservation)
		require.NoError(t, sel.Select(&Request{}, r))
		got[r.Worker().ID()]++
		held = append(held, r)
	}
	return got, func() {
		for _, r := range held {
			r.Release()
		}
	}
}
