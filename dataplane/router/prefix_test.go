package router

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fastroute/fastroute/affinity"
	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/internal/loopback"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// cachingEngines are n simulated engines with vLLM's prefix caching.
func cachingEngines(n int) []mockworker.Options {
	out := mocks(n, 2, 0)
	for i := range out {
		out[i].Engine = mockworker.EngineOptions{MaxNumSeqs: 8, InterTokenLatency: time.Millisecond, PrefixCache: true}
	}
	return out
}

func prefixAffinity(on bool) func(*config.Config) {
	return func(c *config.Config) {
		c.Router.PrefixAffinity.Enabled = on
		c.Router.PrefixAffinity.BlockBytes = 64
	}
}

// prefixByInFlight is prefixAffinity(on) with a holder's slack counted in
// requests in flight: engine telemetry off. The tests that count where
// each turn went need it: on a loaded machine the speeds learned of
// identical mock engines came out up to 4x apart, and the engine-priced
// slack then passed a holder (that rule has its own tests in package
// dataplane).
func prefixByInFlight(on bool) func(*config.Config) {
	return func(c *config.Config) {
		prefixAffinity(on)(c)
		c.Telemetry.Engine.Enabled = false
	}
}

// converse runs conversations of turns each, one request a turn, every
// turn repeating the conversation so far as a chat client does; it
// returns the workers each conversation's turns went to.
func (f *fleet) converse(conversations, turns int) [][]string {
	return converseVia([]*fleet{f}, conversations, turns, nil)
}

// converseVia is converse with turn i of every conversation sent through
// replica i mod len(via), then settle called (when not nil) before the
// next turn.
func converseVia(via []*fleet, conversations, turns int, settle func()) [][]string {
	via[0].t.Helper()
	went := make([][]string, conversations)
	history := make([]string, conversations)
	for c := range history {
		history[c] = fmt.Sprintf(`{"role":"user","content":"Student %d asks: why is the sky blue, what makes sunsets red, and why are clouds white?"}`, c)
	}
	for turn := range turns {
		f := via[turn%len(via)]
		for c := range history {
			went[c] = append(went[c], f.servedBy("/v1/chat/completions", `{"model":"mock-model","messages":[`+history[c]+`]}`))
			history[c] += fmt.Sprintf(`,{"role":"assistant","content":"Answer %d, at some length, about light and the air."},{"role":"user","content":"Follow-up question %d?"}`, turn, turn)
		}
		if settle != nil {
			settle()
		}
	}
	return went
}

// stayedPut asserts that each conversation's turns went where its first
// did, and returns the workers the first turns went to.
func stayedPut(t *testing.T, went [][]string) map[string]bool {
	t.Helper()
	firsts := map[string]bool{}
	for c, workers := range went {
		firsts[workers[0]] = true
		for turn, w := range workers {
			assert.Equal(t, workers[0], w, "conversation %d, turn %d", c, turn)
		}
	}
	return firsts
}

// cacheHits sums the prefix cache hits (tokens) of the fleet's engines.
func (f *fleet) cacheHits() float64 {
	total := 0.0
	for _, m := range f.mocks {
		total += m.PrefixCacheHits()
	}
	return total
}

// With prefix affinity on, each conversation's turns stay on the worker
// its first turn went to, though the mode (round-robin) would rotate
// them, and the engines find the conversations in their prefix caches.
// Off, the turns rotate and most of what the engines cached is never
// asked for again where it is. Conversations that share nothing spread
// as the mode has them.
func TestConversationsStayWhereTheirPrefixIs(t *testing.T) {
	on := startFleet(t, cachingEngines(3), prefixByInFlight(true))
	assert.Len(t, stayedPut(t, on.converse(5, 4)), 3, "the first turns went round the workers")
	taken, passed, unknown := on.r.Selector.PrefixRouted()
	assert.Equal(t, [3]uint64{15, 0, 5}, [3]uint64{taken, passed, unknown}, "each first turn is new; every later one goes to its holder")
	_, page := adminDo(t, on, "GET", "/metrics", "", "")
	assert.Contains(t, page, `fastroute_prefix_requests_total{outcome="taken"} 15`)
	assert.Contains(t, page, `fastroute_prefix_requests_total{outcome="unknown"} 5`)
	on.assertIdle()

	off := startFleet(t, cachingEngines(3), prefixByInFlight(false))
	moved := 0
	for _, workers := range off.converse(5, 4) {
		for _, w := range workers[1:] {
			if w != workers[0] {
				moved++
			}
		}
	}
	assert.Positive(t, moved, "round-robin alone moves turns")
	_, page = adminDo(t, off, "GET", "/metrics", "", "")
	assert.NotContains(t, page, "fastroute_prefix_requests_total")
	assert.Greater(t, on.cacheHits(), 2*off.cacheHits(), "the engines reuse more of their caches (tokens: %v with, %v without)", on.cacheHits(), off.cacheHits())
}

// Every generation route keys its prompt: completions' prompt, the
// Responses API's instructions and input, a chat message's content
// parts, SGLang's /generate's text. A prompt of token ids, an embedding and a short prompt are not
// keyed, and route as the mode has them.
func TestEachRouteKeysItsPrompt(t *testing.T) {
	f := startFleet(t, cachingEngines(3), prefixByInFlight(true))
	long := strings.Repeat("a long shared document, read again and again; ", 8)
	for _, c := range []struct{ path, first, next string }{
		{"/v1/completions", `{"model":"mock-model","prompt":%q}`, `{"model":"mock-model","prompt":%q}`},
		{"/v1/responses", `{"model":"mock-model","store":false,"instructions":%q,"input":"q1"}`, `{"model":"mock-model","store":false,"instructions":%q,"input":"q2"}`},
		{"/v1/chat/completions", `{"model":"mock-model","messages":[{"role":"user","content":[{"type":"text","text":%q}]}]}`,
			`{"model":"mock-model","messages":[{"role":"user","content":[{"type":"text","text":%q},{"type":"text","text":"and more"}]}]}`},
	} {
		first := f.servedBy(c.path, fmt.Sprintf(c.first, c.path+long))
		for range 3 {
			assert.Equal(t, first, f.servedBy(c.path, fmt.Sprintf(c.next, c.path+long)), c.path)
		}
	}
	// SGLang's native /generate keys its text (the mock engine does not
	// serve it: its 404 still names the worker the request went to).
	var went []string
	for i := range 3 {
		resp, _ := f.send("POST", "/generate", fmt.Sprintf(`{"text":%q,"sampling_params":{"max_new_tokens":%d}}`, "/generate"+long, i+1))
		went = append(went, resp.Header.Get("x-fastroute-worker"))
	}
	assert.Equal(t, []string{went[0], went[0], went[0]}, went, "/generate")
	taken, _, unknown := f.r.Selector.PrefixRouted()
	assert.Equal(t, [2]uint64{11, 4}, [2]uint64{taken, unknown})

	// A query-only request is told where its prompt would go and records
	// nothing: the next request with that prompt is as new as it was.
	fresh := fmt.Sprintf(`{"model":"mock-model","prompt":%q}`, "a prompt only asked about: "+long)
	resp, text := f.send("POST", "/v1/completions", fresh, "x-query-instance-id", "true")
	require.Equal(t, 200, resp.StatusCode, text)
	f.servedBy("/v1/completions", fresh)
	_, _, unknownAfter := f.r.Selector.PrefixRouted()
	assert.Equal(t, unknown+2, unknownAfter, "the query found nothing and left nothing")
	taken, _, unknown = f.r.Selector.PrefixRouted()

	for _, c := range []struct{ path, body string }{
		{"/v1/completions", `{"model":"mock-model","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30]}`},
		{"/v1/embeddings", `{"model":"mock-model","input":"` + long + `"}`},
		{"/v1/chat/completions", `{"model":"mock-model","messages":[{"role":"user","content":"hi"}]}`},
	} {
		f.servedBy(c.path, c.body)
	}
	again, _, unknownAgain := f.r.Selector.PrefixRouted()
	assert.Equal(t, [2]uint64{taken, unknown}, [2]uint64{again, unknownAgain}, "none of them was keyed")
	f.assertIdle()
}

// A worker that holds a conversation but is busier than the slack allows
// does not get its next turn.
func TestABusyHolderLosesTheTurn(t *testing.T) {
	engines := cachingEngines(2)
	for i := range engines {
		engines[i].Engine.InterTokenLatency = 20 * time.Millisecond
		engines[i].Tokens = 50
	}
	f := startFleet(t, engines, func(c *config.Config) {
		prefixByInFlight(true)(c)
		c.Router.PrefixAffinity.Slack = 1
	})
	body := `{"model":"mock-model","messages":[{"role":"user","content":"` + strings.Repeat("the same long question ", 12) + `"}]}`
	holder := f.servedBy("/v1/chat/completions", body)
	// Hold two requests open on the holder (1 s each), then ask again.
	done := make(chan struct{}, 2)
	for range 2 {
		go func() {
			defer func() { done <- struct{}{} }()
			resp := f.post("/v1/chat/completions", body, "x-worker-id", holder)
			_ = readAll(t, resp)
		}()
	}
	require.Eventually(t, func() bool {
		id, _ := strconv.ParseUint(holder, 10, 64)
		w, ok := f.r.Registry.Get(id)
		return ok && w.Occupancy() == 2
	}, 5*time.Second, 5*time.Millisecond)
	assert.NotEqual(t, holder, f.servedBy("/v1/chat/completions", body), "2 in flight against 0: beyond a slack of 1")
	_, passed, _ := f.r.Selector.PrefixRouted()
	assert.Equal(t, uint64(1), passed)
	<-done
	<-done
	f.assertIdle()
}

// A split request keys its prefill leg, where the prefix cache is: the
// turns of a conversation prefill on one prefill worker, though the
// prefill pool's round-robin would alternate them.
func TestAConversationPrefillsOnOneWorker(t *testing.T) {
	p1, p2, decode := startEngine(t, vllmPrefill), startEngine(t, vllmPrefill), startEngine(t, sseDecode)
	f := startPD(t, config.DisaggVLLM, []pdWorker{{dataplane.RolePrefill, p1.URL}, {dataplane.RolePrefill, p2.URL}, {dataplane.RoleDecode, decode.URL}},
		prefixAffinity(true))
	history := `{"role":"user","content":"Summarize the following report about the quarterly figures of the company, please."}`
	for turn := range 4 {
		resp := f.post("/v1/chat/completions", `{"model":"m","stream":true,"messages":[`+history+`]}`)
		text := readAll(t, resp)
		require.Equal(t, 200, resp.StatusCode, text)
		history += fmt.Sprintf(`,{"role":"assistant","content":"Summary %d."},{"role":"user","content":"More detail on point %d?"}`, turn, turn)
	}
	assert.ElementsMatch(t, []int{0, 4}, []int{len(p1.received()), len(p2.received())}, "every prefill on one worker")
	assert.Len(t, decode.received(), 4)
	taken, _, unknown := f.r.Selector.PrefixRouted()
	assert.Equal(t, [2]uint64{3, 1}, [2]uint64{taken, unknown})
	f.assertIdle()
}

// The router shows what each engine says of its prefix cache: the share
// of prompt tokens found there over the last second or more in which it
// was asked (vLLM's counters), in GET /workers and /metrics.
func TestTheEnginesPrefixCacheHitRatioIsShown(t *testing.T) {
	f := startFleet(t, cachingEngines(1), prefixAffinity(true))
	_, page := adminDo(t, f, "GET", "/metrics", "", "")
	assert.NotContains(t, page, "fastroute_worker_prefix_cache_hit_ratio{", "unknown before any prompt")
	turn := `{"role":"user","content":"` + strings.Repeat("Tell me about the history of the printing press. ", 6) + `"}`
	f.servedBy("/v1/chat/completions", `{"model":"mock-model","messages":[`+turn+`]}`)
	time.Sleep(1100 * time.Millisecond) // a window of a second
	f.servedBy("/v1/chat/completions", `{"model":"mock-model","messages":[`+turn+`,{"role":"assistant","content":"It began with Gutenberg."}]}`)
	var ratio float64
	require.Eventually(t, func() bool {
		_, body := adminDo(t, f, "GET", "/workers/1", "", "")
		var w struct {
			Ratio *float64 `json:"engine_prefix_cache_hit_ratio"`
		}
		if json.Unmarshal([]byte(body), &w) != nil || w.Ratio == nil {
			return false
		}
		ratio = *w.Ratio
		return ratio > 0 // the window of the first prompt alone says 0
	}, 3*time.Second, 20*time.Millisecond, "the second prompt found its first part cached")
	assert.Less(t, ratio, 1.0)
	_, page = adminDo(t, f, "GET", "/metrics", "", "")
	assert.Regexp(t, `fastroute_worker_prefix_cache_hit_ratio\{worker="1"\} 0\.\d+`, page)
}

// freeAdminAddrs reserves n loopback addresses for replicas that name each
// other before they start.
func freeAdminAddrs(t *testing.T, n int) []string {
	t.Helper()
	out := make([]string, n)
	for i := range out {
		var err error
		out[i], err = loopback.FreeAddr() // below the ephemeral range: no client's port meanwhile
		require.NoError(t, err)
	}
	return out
}

// sharingReplicas starts two routers with prefix affinity in front of the
// same three caching engines; with share, each sends what it records to
// the other. Their slack is in requests in flight (prefixByInFlight).
// tweaks apply last to each replica's config.
func sharingReplicas(t *testing.T, share bool, tweaks ...func(*config.Config)) (a, b *fleet) {
	admin := freeAdminAddrs(t, 2)
	replica := func(i int, workers []dataplane.WorkerSpec) func(*config.Config) {
		return func(c *config.Config) {
			prefixByInFlight(true)(c)
			c.AdminListen = admin[i]
			c.Router.PrefixAffinity.ShareInterval = 5 * time.Millisecond
			if share {
				c.Router.PrefixAffinity.Peers = []string{"http://" + admin[1-i]}
			}
			if workers != nil {
				c.Workers = workers
			}
			for _, tweak := range tweaks {
				tweak(c)
			}
		}
	}
	a = startFleet(t, cachingEngines(3), replica(0, nil))
	b = startFleet(t, nil, replica(1, a.r.Config.Workers))
	b.mocks = a.mocks
	return a, b
}

// settled returns what waits until each of two replicas took in every
// prefix record the other made. It waits up to 15 s (under -race beside
// other packages on two CPUs a post can take seconds), and a replica that
// never does fails the test with each side's counts and its senders' (a
// failed post drops its records: sharing is best effort).
func settled(t *testing.T, a, b *fleet) func() {
	return func() {
		t.Helper()
		done := func() bool {
			return b.r.PrefixesLearned() == a.r.Prefixes().Recorded() && a.r.PrefixesLearned() == b.r.Prefixes().Recorded()
		}
		for deadline := time.Now().Add(15 * time.Second); !done(); time.Sleep(2 * time.Millisecond) {
			if time.Now().After(deadline) {
				var senders []string
				for _, f := range []*fleet{a, b} {
					_, page := adminDo(t, f, "GET", "/metrics", "", "")
					for _, line := range strings.Split(page, "\n") {
						if strings.HasPrefix(line, "fastroute_prefix_share") && !strings.HasSuffix(line, " 0") {
							senders = append(senders, line)
						}
					}
				}
				t.Fatalf("each replica takes in every record the other made: a recorded %d, learned %d; b recorded %d, learned %d; %v",
					a.r.Prefixes().Recorded(), a.r.PrefixesLearned(), b.r.Prefixes().Recorded(), b.r.PrefixesLearned(), senders)
			}
		}
	}
}

// Two replicas in front of the same engines: a conversation's turns
// alternate between them (a plain load balancer in front), and each turn
// still goes to the worker its first turn went to, since each replica
// takes in what the other records. Without sharing, each replica knows
// only its own turns and the other's are new to it.
func TestReplicasShareThePrefixesTheyRecord(t *testing.T) {
	a, b := sharingReplicas(t, true)
	assert.Len(t, stayedPut(t, converseVia([]*fleet{a, b}, 5, 4, settled(t, a, b))), 3, "the first turns went round the workers")
	taken, passed, unknown := b.r.Selector.PrefixRouted()
	assert.Equal(t, [3]uint64{10, 0, 0}, [3]uint64{taken, passed, unknown}, "replica b knew every conversation it saw from a's records")
	assert.NotZero(t, a.r.Prefixes().Recorded())
	sent := fmt.Sprintf(`fastroute_prefix_shared_records_total{peer="http://%s",outcome="sent"} %d`, b.r.AdminAddr(), a.r.Prefixes().Recorded())
	var page string
	require.Eventually(t, func() bool { // counted when b's 204 is back, after b took the records in
		_, page = adminDo(t, a, "GET", "/metrics", "", "")
		return strings.Contains(page, sent)
	}, 5*time.Second, 10*time.Millisecond, "%s", sent)
	assert.Contains(t, page, fmt.Sprintf(`fastroute_prefix_learned_records_total %d`, b.r.Prefixes().Recorded()))
	a.assertIdle()
	b.assertIdle()

	a, b = sharingReplicas(t, false)
	converseVia([]*fleet{a, b}, 5, 4, nil)
	_, _, unknown = b.r.Selector.PrefixRouted()
	assert.Equal(t, uint64(5), unknown, "unshared, replica b's first turn of each conversation is new to it")
	assert.Zero(t, a.r.PrefixesLearned())
}

// POST /prefixes takes a peer's records behind the admin token and refuses
// what it cannot take with a clear error; a router without prefix
// affinity says so.
func TestThePrefixRecordsRoute(t *testing.T) {
	f := startFleet(t, cachingEngines(1), func(c *config.Config) {
		prefixAffinity(true)(c)
		c.AdminToken = "s3cret"
	})
	keys := []uint64{0xAAAA_0000_0000_0001, 0xBBBB_0000_0000_0002}
	var records []byte
	for _, k := range keys {
		records = affinity.AppendPrefixRecord(records, k, 1)
	}
	code, body := adminDo(t, f, "POST", "/prefixes", string(records), "")
	assert.Equal(t, http.StatusUnauthorized, code, body)
	code, body = adminDo(t, f, "POST", "/prefixes", string(records[:13]), "s3cret")
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, "not a multiple of 12 bytes")
	code, body = adminDo(t, f, "POST", "/prefixes", strings.Repeat("x", 12<<17), "s3cret")
	assert.Equal(t, http.StatusRequestEntityTooLarge, code)
	assert.Contains(t, body, "larger than 1 MiB")
	w, _ := f.r.Prefixes().Holder(keys)
	assert.Zero(t, w, "nothing refused was learned")

	code, body = adminDo(t, f, "POST", "/prefixes", string(records), "s3cret")
	assert.Equal(t, http.StatusNoContent, code, body)
	w, blocks := f.r.Prefixes().Holder(keys)
	assert.Equal(t, [2]uint64{1, 2}, [2]uint64{w, uint64(blocks)})
	assert.Equal(t, uint64(2), f.r.PrefixesLearned())

	off := startFleet(t, cachingEngines(1), nil)
	code, body = adminDo(t, off, "POST", "/prefixes", string(records), "")
	assert.Equal(t, http.StatusConflict, code)
	assert.Contains(t, body, "prefix affinity is off")
}

// A peer that is down costs the requests nothing: they are routed and
// answered, and the records it misses are counted as failed.
func TestAnAbsentPeerLosesOnlyItsRecords(t *testing.T) {
	gone := freeAdminAddrs(t, 1)[0]
	f := startFleet(t, cachingEngines(3), func(c *config.Config) {
		prefixByInFlight(true)(c) // its turns counted where they went (stayedPut)
		c.Router.PrefixAffinity.Peers = []string{"http://" + gone}
		c.Router.PrefixAffinity.ShareInterval = 5 * time.Millisecond
	})
	stayedPut(t, f.converse(3, 3))
	require.Eventually(t, func() bool {
		_, page := adminDo(t, f, "GET", "/metrics", "", "")
		return strings.Contains(page, fmt.Sprintf(`fastroute_prefix_shared_records_total{peer="http://%s",outcome="failed"} %d`, gone, f.r.Prefixes().Recorded()))
	}, 5*time.Second, 10*time.Millisecond, "every record the peer missed is counted")
	f.assertIdle()
}

// A reload turns prefix affinity on and off on a replica that does not
// share its records, and gives it a new, empty table when a table's key
// changes: turned on, conversations stay on their workers; a new block
// size keys them anew; turned off, its metrics go and a peer's records
// are refused. On a replica that shares, the table's keys wait for a
// restart (its peers' records are keyed by the block size they share).
func TestAReloadTurnsPrefixAffinityOnAndOff(t *testing.T) {
	f := startFleet(t, cachingEngines(3), prefixByInFlight(false))
	cfg := f.r.CurrentConfig()
	cfg.Router.PrefixAffinity.Enabled = true
	applied, needRestart, err := f.r.Reload(cfg)
	require.NoError(t, err)
	assert.Equal(t, []string{"router.prefix_affinity.enabled=true table_size=262144 block_bytes=64 max_blocks=128 (a new, empty table)"}, applied)
	assert.Empty(t, needRestart)
	assert.Len(t, stayedPut(t, f.converse(5, 3)), 3, "the first turns went round the workers")
	taken, _, unknown := f.r.Selector.PrefixRouted()
	assert.Equal(t, [2]uint64{10, 5}, [2]uint64{taken, unknown})
	assert.Same(t, f.r.Selector.Routing().Prefixes, f.r.Prefixes())
	_, page := adminDo(t, f, "GET", "/metrics", "", "")
	assert.Contains(t, page, `fastroute_prefix_requests_total{outcome="taken"} 10`)
	code, body := adminDo(t, f, "POST", "/prefixes", "", "")
	assert.Equal(t, http.StatusNoContent, code, "a peer's records taken in: %s", body)

	cfg.Router.PrefixAffinity.BlockBytes = 32
	applied, _, err = f.r.Reload(cfg)
	require.NoError(t, err)
	assert.Equal(t, []string{"router.prefix_affinity.enabled=true table_size=262144 block_bytes=32 max_blocks=128 (a new, empty table)"}, applied)
	assert.Equal(t, 32, f.r.Selector.Routing().PrefixBlock)
	stayedPut(t, f.converse(5, 3))
	taken, _, unknown = f.r.Selector.PrefixRouted()
	assert.Equal(t, [2]uint64{20, 10}, [2]uint64{taken, unknown}, "each conversation keyed anew, then found")

	cfg.Router.PrefixAffinity.Enabled = false
	applied, _, err = f.r.Reload(cfg)
	require.NoError(t, err)
	assert.Equal(t, []string{"router.prefix_affinity.enabled=false"}, applied)
	assert.Nil(t, f.r.Prefixes())
	assert.Nil(t, f.r.Selector.Routing().Prefixes)
	_, page = adminDo(t, f, "GET", "/metrics", "", "")
	assert.NotContains(t, page, "fastroute_prefix_requests_total")
	code, body = adminDo(t, f, "POST", "/prefixes", "", "")
	assert.Equal(t, http.StatusConflict, code, body)
	assert.Contains(t, body, "prefix affinity is off on this router")
	f.converse(2, 2)
	taken, _, unknown = f.r.Selector.PrefixRouted()
	assert.Equal(t, [2]uint64{20, 10}, [2]uint64{taken, unknown}, "no request keyed")
	f.assertIdle()

	sharing := startFleet(t, cachingEngines(1), func(c *config.Config) {
		prefixByInFlight(true)(c)
		c.Router.PrefixAffinity.Peers = []string{"http://127.0.0.1:1"}
	})
	cfg = sharing.r.CurrentConfig()
	cfg.Router.PrefixAffinity.BlockBytes, cfg.Router.PrefixAffinity.Slack = 128, 3
	applied, needRestart, err = sharing.r.Reload(cfg)
	require.NoError(t, err)
	assert.Empty(t, applied)
	assert.Equal(t, []string{"router.prefix_affinity"}, needRestart)
	assert.Equal(t, 64, sharing.r.Selector.Routing().PrefixBlock)
}
