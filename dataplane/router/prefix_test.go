package router

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/config"
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

// converse runs conversations of turns each, one request a turn, every
// turn repeating the conversation so far as a chat client does; it
// returns the workers each conversation's turns went to.
func (f *fleet) converse(conversations, turns int) [][]string {
	f.t.Helper()
	went := make([][]string, conversations)
	history := make([]string, conversations)
	for c := range history {
		history[c] = fmt.Sprintf(`{"role":"user","content":"Student %d asks: why is the sky blue, what makes sunsets red, and why are clouds white?"}`, c)
	}
	for turn := range turns {
		for c := range history {
			went[c] = append(went[c], f.servedBy("/v1/chat/completions", `{"model":"mock-model","messages":[`+history[c]+`]}`))
			history[c] += fmt.Sprintf(`,{"role":"assistant","content":"Answer %d, at some length, about light and the air."},{"role":"user","content":"Follow-up question %d?"}`, turn, turn)
		}
	}
	return went
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
	on := startFleet(t, cachingEngines(3), prefixAffinity(true))
	firsts := map[string]bool{}
	for c, workers := range on.converse(5, 4) {
		firsts[workers[0]] = true
		for turn, w := range workers {
			assert.Equal(t, workers[0], w, "conversation %d, turn %d", c, turn)
		}
	}
	assert.Len(t, firsts, 3, "the first turns went round the workers")
	taken, passed, unknown := on.r.Selector.PrefixRouted()
	assert.Equal(t, [3]uint64{15, 0, 5}, [3]uint64{taken, passed, unknown}, "each first turn is new; every later one goes to its holder")
	_, page := adminDo(t, on, "GET", "/metrics", "", "")
	assert.Contains(t, page, `fastroute_prefix_requests_total{outcome="taken"} 15`)
	assert.Contains(t, page, `fastroute_prefix_requests_total{outcome="unknown"} 5`)
	on.assertIdle()

	off := startFleet(t, cachingEngines(3), prefixAffinity(false))
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
	f := startFleet(t, cachingEngines(3), prefixAffinity(true))
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
		prefixAffinity(true)(c)
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
