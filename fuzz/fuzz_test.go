package fuzz

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fastroute/fastroute/affinity"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/http/frontend"
	"github.com/fastroute/fastroute/pickers"
	"github.com/fastroute/fastroute/telemetry/engine"
	"github.com/valyala/fasthttp"
)

// state is a pickers.State over fuzzed loads and weights.
type state struct {
	occ    []*atomic.Int64
	weight []float64
	table  pickers.WeightTable
}

func (s *state) Occupancy() []*atomic.Int64    { return s.occ }
func (s *state) Weights() *pickers.WeightTable { return &s.table }

func newState(data []byte) *state {
	st := &state{}
	for _, b := range data {
		c := new(atomic.Int64)
		c.Store(int64(b & 0x0f))
		w := float64(b >> 4)
		st.occ = append(st.occ, c)
		st.weight = append(st.weight, w)
		st.table.Append(w)
	}
	st.table.Build()
	return st
}

// FuzzPickers: every pick lies in the candidate set; least-loaded picks a
// minimum; p2c never picks a unique busiest worker (its winner was compared
// with another candidate at least as busy); weighted never picks weight 0.
func FuzzPickers(f *testing.F) {
	f.Add([]byte{1, 2, 3})
	f.Add([]byte{0x10, 0x21, 0x05, 0x00})
	f.Add([]byte{0xff})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		st := newState(data)
		ids := make([]uint64, len(data))
		for i := range ids {
			ids[i] = uint64(i + 1)
		}
		minLoad, maxLoad, maxCount := int64(1<<62), int64(-1), 0
		for _, c := range st.occ {
			v := c.Load()
			minLoad = min(minLoad, v)
			if v > maxLoad {
				maxLoad, maxCount = v, 1
			} else if v == maxLoad {
				maxCount++
			}
		}
		for name, p := range map[string]pickers.Picker{
			"rr": &pickers.RoundRobin{}, "random": pickers.Random{}, "p2c": pickers.P2C{},
			"ll": &pickers.LeastLoaded{}, "weighted": pickers.Weighted{},
		} {
			for k := 0; k < 4; k++ {
				i := p.Pick(ids, st)
				if len(ids) == 0 {
					if i != -1 {
						t.Fatalf("%s picked %d from nothing", name, i)
					}
					continue
				}
				if i < 0 || i >= len(ids) {
					t.Fatalf("%s picked %d of %d", name, i, len(ids))
				}
				load := st.occ[i].Load()
				switch name {
				case "ll":
					if load != minLoad {
						t.Fatalf("least-loaded picked load %d, min is %d", load, minLoad)
					}
				case "p2c":
					// The winner was compared with another candidate at least as busy,
					// so a unique strict maximum never wins.
					if len(ids) > 1 && load == maxLoad && maxCount == 1 && minLoad < maxLoad {
						t.Fatalf("p2c picked the unique busiest worker (load %d)", load)
					}
				case "weighted":
					if st.table.Total() > 0 && st.weight[i] == 0 {
						t.Fatalf("weighted picked a zero-weight worker %d", i)
					}
				}
			}
		}
	})
}

// FuzzSelectSequence runs random operation sequences on a live registry and
// checks: occupancy never negative, a drained, unhealthy or down worker is never
// selected (nor by prefix affinity), the busy threshold is never passed,
// everything returns to 0, and a peer replica's table that takes in what
// the prefix table shares (after every operation) names the same worker
// for every prompt's prefixes (and their decode keys). Split
// (disaggregated) selections hold their decode worker, and their prefill
// worker only when they run split: each leg in its pool, never both on one
// worker's rank, never a prefill on an engine reporting a queue of
// Routing.MaxPrefillQueue, and a request run whole as held only on the
// worker holding its prompt's decode keys, with less than
// MinPrefillTokens of it not held.
func FuzzSelectSequence(f *testing.F) {
	f.Add([]byte{0, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1})
	f.Add([]byte{4, 4, 4, 0, 0, 0, 0, 0, 2, 2, 6})
	f.Add([]byte{0x13, 0x25, 0x37, 0x49, 0x5b, 0x6d, 0x7f, 0x81})
	f.Add([]byte{0xc0, 0xc0, 0xd0, 0xe0, 0xf0, 0xc0, 0x02, 0x35, 0xc0, 0xc8, 0x02, 0x02})
	f.Add([]byte{0xc8, 0xc8, 0x02, 0xc8, 0xd8, 0x02, 0x02})
	f.Fuzz(func(t *testing.T, ops []byte) {
		const busy = 3
		reg := dataplane.NewRegistry()
		roles := []dataplane.Role{dataplane.RolePrefill, dataplane.RoleDecode, dataplane.RoleBoth, dataplane.RoleBoth}
		for id := uint64(1); id <= 4; id++ {
			if _, err := reg.Add(dataplane.WorkerSpec{ID: id, URL: fmt.Sprintf("http://127.0.0.1:%d", 9000+id), DPSize: int(id), Role: roles[id-1]}); err != nil {
				t.Fatal(err)
			}
		}
		// Worker 1's engine has a learned speed; worker 2's gives no
		// metrics and is read by the router, priced for worker 1's batch;
		// worker 3's has a request waiting and no speed, so it is priced
		// at a stand-in, and so are workers 5 and 6 when they join: a
		// split whose prefill pick is worker 3 runs whole (MaxPrefillQueue
		// 1).
		reg.SetEngine(1, &engine.Stats{Slots: 4, TokenRate: 20})
		reg.SetEngine(2, &engine.Stats{Reading: engine.Reading{Dialect: engine.DialectRouter}, Slots: 1, TokenRate: 5})
		reg.SetEngine(3, &engine.Stats{Reading: engine.Reading{Running: 1, Waiting: 1}})
		modes := []pickers.Mode{pickers.ModeRoundRobin, pickers.ModeRandom, pickers.ModeP2C, pickers.ModeLeastLoaded, pickers.ModeWeighted, pickers.ModeLoadAware}
		sel, err := dataplane.NewSelector(reg, modes[len(ops)%len(modes)], busy)
		if err != nil {
			t.Fatal(err)
		}
		// Some selections carry one of three prompts' prefix keys, which
		// prefix affinity routes by (slack 1).
		prefixes, peer := affinity.NewPrefixes(64), affinity.NewPrefixes(64)
		prefixes.Share(64)
		sel.SetRouting(dataplane.Routing{Prefixes: prefixes, PrefixSlack: 1, PrefixBlock: 256, MinPrefillTokens: 100,
			PrefillFallback: true, DecodePrefills: true, MaxPrefillQueue: 1})
		prompts := [3][]uint64{{11, 12, 13}, {11, 12, 14, 15}, {21}}
		var records []byte
		var held []*dataplane.Reservation
		var req dataplane.Request
		for _, op := range ops {
			id := uint64(op>>4)%6 + 1 // 5 and 6 are never registered at first
			switch op % 8 {
			case 0, 1: // select (a split request when no prompt is named)
				if op>>6 == 3 && op%16 != 1 {
					// A prompt's decode keys, and bytes a few tokens past its
					// blocks (op&8) or many: a worker holding them may take
					// the request whole (MinPrefillTokens 100).
					keys := prompts[id%3]
					bytes := len(keys)*256 + 1000
					if op&0x08 != 0 {
						bytes = len(keys)*256 + 50
					}
					held = append(held, split(t, sel, busy, prefixes, keys, bytes)...)
					break
				}
				req.Reset()
				if op%16 == 1 {
					req.WorkerID = id
				}
				if p := op >> 6; p < 3 {
					req.PrefixKeys = append(req.PrefixKeys, prompts[p]...)
				}
				res := new(dataplane.Reservation)
				if err := sel.Select(&req, res); err == nil {
					w := res.Worker()
					if !w.Routable() {
						t.Fatalf("selected non-routable worker %d", w.ID())
					}
					if w.Occupancy() > busy {
						t.Fatalf("worker %d occupancy %d over threshold", w.ID(), w.Occupancy())
					}
					if w.Spec().Backup && req.WorkerID == 0 && req.Phase == dataplane.PhaseAny {
						for _, o := range reg.Snapshot().Workers() {
							if !o.Spec().Backup && o.Occupancy() < busy && o.Models() == nil && req.Attempts() == 0 {
								t.Fatalf("backup %d taken while worker %d had room (%d in flight)", w.ID(), o.ID(), o.Occupancy())
							}
						}
					}
					if res.Rank() < 0 || res.Rank() >= w.Spec().DPSize {
						t.Fatalf("rank %d outside worker %d", res.Rank(), w.ID())
					}
					held = append(held, res)
				} else if res.Held() {
					t.Fatal("failed select holds a reservation")
				}
			case 2: // release the oldest (twice: the second is a no-op)
				if len(held) > 0 {
					held[0].Release()
					held[0].Release()
					held = held[1:]
				}
			case 3: // retry the newest
				if len(held) > 0 {
					r := held[len(held)-1]
					req.Reset()
					_ = sel.Retry(&req, r)
				}
			case 4:
				_ = reg.Drain(id)
			case 5:
				reg.SetHealthy(id, op&0x08 == 0)
			case 6: // sweep, or put a worker down or back by hand
				if op&0x08 == 0 {
					reg.SweepDrained()
				} else {
					_, _ = reg.SetDown(id, op&0x80 != 0)
				}
			case 7: // worker 6 joins as a backup
				_, _ = reg.Add(dataplane.WorkerSpec{ID: id, URL: "http://127.0.0.1:9999", Backup: id == 6})
			}
			for _, w := range reg.All() {
				if w.Occupancy() < 0 {
					t.Fatalf("worker %d occupancy %d", w.ID(), w.Occupancy())
				}
				var onRanks int64
				for r, n := range w.RankOccupancy() {
					if n < 0 {
						t.Fatalf("worker %d rank %d occupancy %d", w.ID(), r, n)
					}
					onRanks += n
				}
				if onRanks > w.Occupancy() {
					t.Fatalf("worker %d: %d in flight on its ranks, %d on it", w.ID(), onRanks, w.Occupancy())
				}
			}
			records, _ = prefixes.Changed(records[:0])
			if _, err := peer.Learn(records); err != nil {
				t.Fatal(err)
			}
			for _, keys := range append(prompts[:], affinity.DecodeKeys(nil, prompts[0]), affinity.DecodeKeys(nil, prompts[1])) {
				for i := range keys {
					mine, _ := prefixes.Holder(keys[i : i+1])
					theirs, _ := peer.Holder(keys[i : i+1])
					if mine != theirs {
						t.Fatalf("key %d: worker %d here, %d at the peer", keys[i], mine, theirs)
					}
				}
			}
		}
		for _, r := range held {
			r.Release()
		}
		for _, w := range reg.All() {
			if w.Occupancy() != 0 {
				t.Fatalf("worker %d left at %d", w.ID(), w.Occupancy())
			}
			for r, n := range w.RankOccupancy() {
				if n != 0 {
					t.Fatalf("worker %d rank %d left at %d", w.ID(), r, n)
				}
			}
		}
	})
}

// split selects a split request and checks what it holds (FuzzSelectSequence).
func split(t *testing.T, sel *dataplane.Selector, busy int64, prefixes *affinity.Prefixes, keys []uint64, bytes int) []*dataplane.Reservation {
	t.Helper()
	dec, pre := new(dataplane.Reservation), new(dataplane.Reservation)
	d, p := dataplane.Request{Phase: dataplane.PhaseDecode, PromptBytes: bytes}, dataplane.Request{Phase: dataplane.PhasePrefill, PrefixKeys: keys}
	d.PrefixKeys = affinity.DecodeKeys(nil, keys)
	heldBy, blocks := prefixes.Holder(d.PrefixKeys)
	placed, err := sel.SelectSplit(&d, &p, dec, pre)
	if err != nil {
		if dec.Held() || pre.Held() {
			t.Fatalf("a failed split holds a reservation: %v", err)
		}
		return nil
	}
	check := func(r *dataplane.Reservation, not dataplane.Role) {
		w := r.Worker()
		if !w.Routable() || w.Spec().Role == not || w.Occupancy() > busy {
			t.Fatalf("split leg on worker %d (routable %v, role %s, occupancy %d)", w.ID(), w.Routable(), w.Spec().Role, w.Occupancy())
		}
	}
	check(dec, dataplane.RolePrefill)
	if placed == dataplane.SplitCached && (dec.Worker().ID() != heldBy || (bytes-blocks*256)/4 >= 100) {
		t.Fatalf("run whole on worker %d as holding the prompt, held by %d in %d blocks of %d bytes", dec.Worker().ID(), heldBy, blocks, bytes)
	}
	if placed != dataplane.SplitLegs {
		if pre.Held() {
			t.Fatalf("a split run whole (%d) holds its prefill pick", placed)
		}
		return []*dataplane.Reservation{dec}
	}
	check(pre, dataplane.RoleDecode)
	if pre.Worker() == dec.Worker() && pre.Rank() == dec.Rank() {
		t.Fatalf("both legs on worker %d rank %d", dec.Worker().ID(), dec.Rank())
	}
	if st := pre.Worker().Engine(); st != nil && st.Waiting >= 1 {
		t.Fatalf("prefill on worker %d, whose engine has %v waiting", pre.Worker().ID(), st.Waiting)
	}
	return []*dataplane.Reservation{dec, pre}
}

// FuzzRequestParsing drives the real front-end handler with fuzzed bodies
// (JSON, forms, prompts keyed for prefix routing), routing headers,
// methods and paths (a stored response's among them, and WebSocket
// sessions' opening requests): no panic, only the statuses of the contract, and no
// reservation left behind. Nothing is dispatched: a request that is not
// query-only names a worker the registry does not hold.
func FuzzRequestParsing(f *testing.F) {
	// websocket as the content type stands for a WebSocket session's
	// opening request (its Connection and Upgrade headers).
	const json, form, websocket = "application/json", "multipart/form-data; boundary=x", "websocket"
	f.Add([]byte(`{"model":"m","stream":true}`), "1", "0", "true", "POST", "/v1/chat/completions", json)
	f.Add([]byte(`{not json`), "x", "-1", "maybe", "POST", "/v1/chat/completions", "")
	f.Add([]byte(``), "", "", "", "GET", "/v1/responses/resp_1", "")
	f.Add([]byte(`[1,2]`), "18446744073709551615", "99999999999999999999", "1", "POST", "/v1/chat/completions", json)
	f.Add([]byte(`{"model":"m","previous_response_id":"resp_1"}`), "", "", "true", "POST", "/v1/responses", json)
	f.Add([]byte(`{"previous_response_id":null}`), "", "", "1", "DELETE", "/v1/responses/resp_2/cancel", json)
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a prompt of a few blocks"},{"type":"image_url","image_url":{"url":"data:x"}}]}]}`), "", "", "true", "POST", "/v1/chat/completions", json)
	f.Add([]byte(`{"model":"m","instructions":"be brief, be clear, be kind","input":[{"role":"user","content":"hi there, how are you"}]}`), "", "", "1", "POST", "/v1/responses", json)
	f.Add([]byte("--x\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--x--\r\n"), "", "", "true", "POST", "/v1/audio/transcriptions", form)
	f.Add([]byte(``), "1", "", "", "GET", "/v1/realtime?model=m&intent=transcription", websocket)
	f.Add([]byte(``), "", "", "true", "GET", "/v1/responses", websocket)
	reg := dataplane.NewRegistry()
	if _, err := reg.Add(dataplane.WorkerSpec{ID: 1, URL: "http://127.0.0.1:1", DPSize: 2}); err != nil {
		f.Fatal(err)
	}
	sel, err := dataplane.NewSelector(reg, pickers.ModeDirect, 1)
	if err != nil {
		f.Fatal(err)
	}
	stored := affinity.NewTable(affinity.Options{TTL: time.Minute, MaxSessions: 16})
	stored.Put([]byte("resp_1"), affinity.Pin{Worker: 1, Rank: 1})
	sel.SetRouting(dataplane.Routing{Responses: stored, Prefixes: affinity.NewPrefixes(64), PrefixBlock: 16, PrefixBlocks: 8})
	srv := frontend.New(frontend.Options{Selector: sel, ClientLimits: frontend.ClientLimits{MaxBodyBytes: 1 << 20}})
	allowed := map[int]bool{200: true, 400: true, 404: true, 405: true, 429: true, 502: true, 503: true}
	f.Fuzz(func(t *testing.T, body []byte, workerID, rank, query, method, path, contentType string) {
		var req fasthttp.Request
		req.Header.SetMethod(method)
		req.SetRequestURI(path)
		req.Header.SetContentType(contentType)
		req.Header.Set("x-worker-id", workerID)
		req.Header.Set("x-dp-rank", rank)
		req.Header.Set("x-query-instance-id", query)
		if contentType == websocket {
			req.Header.Set("Connection", "Upgrade")
			req.Header.Set("Upgrade", "websocket")
		}
		req.SetBody(body)
		var ctx fasthttp.RequestCtx
		ctx.Init(&req, nil, nil)
		// Only query-only requests may reach selection: a dispatch would dial.
		if query != "true" && query != "1" {
			ctx.Request.Header.Set("x-worker-id", "7") // unknown: selection fails before dispatch
		}
		srv.Handle(&ctx)
		if code := ctx.Response.StatusCode(); !allowed[code] {
			t.Fatalf("status %d for body %q", code, body)
		}
		if code := ctx.Response.StatusCode(); code != 200 && len(ctx.Response.Body()) > 0 && ctx.Response.Body()[0] != '{' {
			t.Fatalf("error body is not JSON: %q", ctx.Response.Body())
		}
		if occ := reg.Snapshot().Workers()[0].Occupancy(); occ != 0 {
			t.Fatalf("reservation leaked: occupancy %d", occ)
		}
	})
}

// storedOn returns the worker a stored response id is known to be on, one
// still registered (a request naming it goes there or fails).
func storedOn(reg *dataplane.Registry, responses *affinity.Table, id []byte) (uint64, bool) {
	if len(id) == 0 {
		return 0, false
	}
	pin, st := responses.Get(id)
	_, registered := reg.Get(pin.Worker)
	return pin.Worker, st != affinity.Missing && registered
}

// FuzzStickySelection drives the selector's own routing — LoRA adapters,
// hard session pins and stored responses — with random residency changes,
// drains and releases: a LoRA pick always holds the adapter, a hard-pinned
// request, and one naming a response stored on a registered worker, gets
// that worker or an error (never another worker), a session hint's pin is
// no hard pin, and every occupancy and adapter load returns to 0.
func FuzzStickySelection(f *testing.F) {
	f.Add([]byte{0x01, 0x12, 0x23, 0x34, 0x45, 0x56, 0x67, 0x78})
	f.Add([]byte{0xf0, 0xe1, 0xd2, 0xc3, 0xb4, 0xa5, 0x96, 0x87, 0x00, 0x11})
	f.Add([]byte{0x05, 0x05, 0x05, 0x15, 0x25, 0x35, 0x06, 0x07})
	f.Add([]byte{0x80, 0x90, 0xa1, 0x83, 0x86, 0x90, 0xb7, 0xa0, 0x80})
	f.Fuzz(func(t *testing.T, ops []byte) {
		const workers, adapters, busy = 6, 4, 2
		reg := dataplane.NewRegistry()
		for id := uint64(1); id <= workers; id++ {
			// Worker id holds adapter a when bit a of id is set.
			var loras []string
			for a := 0; a < adapters; a++ {
				if id&(1<<a) != 0 {
					loras = append(loras, fmt.Sprintf("a%d", a))
				}
			}
			if _, err := reg.Add(dataplane.WorkerSpec{ID: id, URL: fmt.Sprintf("http://127.0.0.1:%d", 9000+id), LoRAs: loras}); err != nil {
				t.Fatal(err)
			}
		}
		sel, err := dataplane.NewSelector(reg, pickers.ModeP2C, busy)
		if err != nil {
			t.Fatal(err)
		}
		sessions := affinity.NewTable(affinity.Options{TTL: time.Hour, MaxSessions: 4})
		responses := affinity.NewTable(affinity.Options{TTL: time.Hour, MaxSessions: 4})
		sel.SetRouting(dataplane.Routing{Sessions: sessions, SessionMode: affinity.Hard, SessionHeader: "x-session-id", Responses: responses})
		var held []*dataplane.Reservation
		for _, op := range ops {
			arg := int(op >> 4)
			switch op & 0x07 {
			case 0, 1, 2: // select for adapter arg%adapters under session arg%5, naming stored response arg%3 when arg&8
				name := fmt.Sprintf("a%d", arg%adapters)
				if reg.Snapshot().Group([]byte(name)) == nil {
					// Every holder of it was re-declared away: with no base
					// model listed, the name would count as one.
					continue
				}
				req := dataplane.Request{Model: []byte(name), Session: fmt.Appendf(nil, "s%d", arg%5)}
				if arg&4 != 0 { // a session hint (prompt_cache_key): never a hard pin
					req.Session, req.SessionHint = fmt.Appendf(nil, "h%d", arg%5), true
				}
				if arg&8 != 0 {
					req.Response = fmt.Appendf(nil, "r%d", arg%3)
				}
				pin, st := sessions.Get(req.Session)
				stored, known := storedOn(reg, responses, req.Response)
				r := &dataplane.Reservation{}
				if err := sel.Select(&req, r); err != nil {
					continue
				}
				w := r.Worker()
				if !slices.Contains(w.Adapters(), name) {
					t.Fatalf("worker %d does not hold %s", w.ID(), name)
				}
				switch {
				case known && w.ID() != stored:
					t.Fatalf("response %s stored on %d answered by %d", req.Response, stored, w.ID())
				case !known && st == affinity.Pinned && !req.SessionHint && w.ID() != pin.Worker:
					t.Fatalf("hard pin to %d answered by %d", pin.Worker, w.ID())
				}
				sel.Answered(&req, r)
				sel.Stored(req.Response, r) // its worker found it (no 404)
				held = append(held, r)
			case 3, 4: // release one
				if len(held) > 0 {
					i := arg % len(held)
					held[i].Release()
					held = append(held[:i], held[i+1:]...)
				}
			case 5: // re-declare a worker's adapters
				id := uint64(arg%workers + 1)
				if _, ok := reg.Get(id); ok {
					_ = reg.SetAdapters(id, []string{fmt.Sprintf("a%d", arg%adapters)})
				}
			case 6: // drain a worker
				_ = reg.Drain(uint64(arg%workers + 1))
			case 7: // health flip
				reg.SetHealthy(uint64(arg%workers+1), arg%2 == 0)
			}
		}
		for _, r := range held {
			r.Release()
		}
		for _, w := range reg.All() {
			if w.Occupancy() != 0 {
				t.Fatalf("worker %d occupancy %d", w.ID(), w.Occupancy())
			}
		}
		reg.GroupLoads(func(name string, n int64) {
			if n != 0 {
				t.Fatalf("adapter %s load %d", name, n)
			}
		})
	})
}

// FuzzPrefixRecords feeds a peer's POST /prefixes body to a prefix table:
// a body that is not whole records is refused and changes nothing; whole
// ones are taken in, each naming its worker unless a later record took its
// slot, and records of worker 0 are skipped.
func FuzzPrefixRecords(f *testing.F) {
	f.Add(affinity.AppendPrefixRecord(affinity.AppendPrefixRecord(nil, 0xAAAA_0000_0000_0001, 3), 0xBBBB_0000_0000_0041, 0))
	f.Add([]byte("not records"))
	f.Fuzz(func(t *testing.T, body []byte) {
		const slots = 64
		p := affinity.NewPrefixes(slots)
		n, err := p.Learn(body)
		if len(body)%affinity.PrefixRecordBytes != 0 {
			if err == nil || n != 0 {
				t.Fatalf("%d bytes taken in (%d records, err %v)", len(body), n, err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		last := map[uint64]int{} // slot -> index of the last record written there
		nonzero := 0
		for i := 0; i+affinity.PrefixRecordBytes <= len(body); i += affinity.PrefixRecordBytes {
			key, worker := binary.LittleEndian.Uint64(body[i:]), binary.LittleEndian.Uint32(body[i+8:])
			if worker != 0 {
				last[key%slots], nonzero = i, nonzero+1
			}
		}
		if n != nonzero {
			t.Fatalf("%d records taken in, want %d", n, nonzero)
		}
		for _, i := range last {
			key, worker := binary.LittleEndian.Uint64(body[i:]), binary.LittleEndian.Uint32(body[i+8:])
			if got, _ := p.Holder([]uint64{key}); got != uint64(worker) {
				t.Fatalf("key %#x: worker %d, want %d", key, got, worker)
			}
		}
	})
}
