package router

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/pickers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// servedBy sends one request and returns the worker that answered it.
func (f *fleet) servedBy(path, body string, headers ...string) string {
	f.t.Helper()
	resp := f.post(path, body, headers...)
	text := readAll(f.t, resp)
	require.Equal(f.t, http.StatusOK, resp.StatusCode, text)
	return resp.Header.Get("x-fastroute-worker")
}

func affinityMode(mode string) func(*config.Config) {
	return func(c *config.Config) { c.Router.SessionAffinity.Mode = mode }
}

func TestSoftAffinityPinsAndRepins(t *testing.T) {
	f := startFleet(t, mocks(3, 1, 0), affinityMode("soft"))
	first := f.servedBy("/v1/chat/completions", chatBody, "x-session-id", "s1")
	for i := 0; i < 6; i++ { // round-robin would rotate; the pin holds
		assert.Equal(t, first, f.servedBy("/v1/chat/completions", chatBody, "x-session-id", "s1"))
	}
	other := f.servedBy("/v1/chat/completions", chatBody, "x-session-id", "s2")
	code, _ := adminDo(t, f, "DELETE", "/workers/"+first, "", "")
	require.Equal(t, http.StatusAccepted, code)
	moved := f.servedBy("/v1/chat/completions", chatBody, "x-session-id", "s1")
	assert.NotEqual(t, first, moved, "re-pinned off the drained worker")
	for i := 0; i < 4; i++ {
		assert.Equal(t, moved, f.servedBy("/v1/chat/completions", chatBody, "x-session-id", "s1"))
	}
	if other != first {
		assert.Equal(t, other, f.servedBy("/v1/chat/completions", chatBody, "x-session-id", "s2"), "an unaffected session stays")
	}
	_, metrics := adminDo(t, f, "GET", "/metrics", "", "")
	assert.Contains(t, metrics, "\nfastroute_affinity_sessions 2\n")
	f.assertIdle()
}

func TestHardAffinityErrorsOnceWhenTheWorkerLeaves(t *testing.T) {
	f := startFleet(t, mocks(3, 4, 30*time.Millisecond), func(c *config.Config) {
		c.Router.SessionAffinity.Mode = "hard"
		c.Router.BusyThreshold = 1
	})
	pinned := f.servedBy("/v1/chat/completions", chatBody, "x-session-id", "h1")
	for i := 0; i < 3; i++ {
		assert.Equal(t, pinned, f.servedBy("/v1/chat/completions", chatBody, "x-session-id", "h1"))
	}
	// Busy pinned worker: 429, and the pin stays.
	stream := f.post("/v1/chat/completions", streamBody, "x-session-id", "h1")
	busy := f.post("/v1/chat/completions", chatBody, "x-session-id", "h1")
	text := readAll(t, busy)
	assert.Equal(t, http.StatusTooManyRequests, busy.StatusCode, text)
	assert.Contains(t, readAll(t, stream), "data: [DONE]")
	assert.Equal(t, pinned, f.servedBy("/v1/chat/completions", chatBody, "x-session-id", "h1"))

	code, _ := adminDo(t, f, "DELETE", "/workers/"+pinned, "", "")
	require.Equal(t, http.StatusAccepted, code)
	gone := f.post("/v1/chat/completions", chatBody, "x-session-id", "h1")
	text = readAll(t, gone)
	assert.Equal(t, http.StatusServiceUnavailable, gone.StatusCode)
	assert.Contains(t, text, `\"h1\" was pinned to worker `+pinned)
	assert.Contains(t, text, "dropped")
	again := f.servedBy("/v1/chat/completions", chatBody, "x-session-id", "h1")
	assert.NotEqual(t, pinned, again)
	assert.Equal(t, again, f.servedBy("/v1/chat/completions", chatBody, "x-session-id", "h1"), "pinned anew")
	f.assertIdle()
}

func TestAffinityOffIgnoresTheHeader(t *testing.T) {
	f := startFleet(t, mocks(3, 1, 0), affinityMode("off"))
	seen := map[string]bool{}
	for i := 0; i < 6; i++ {
		seen[f.servedBy("/v1/chat/completions", chatBody, "x-session-id", "s1")] = true
	}
	assert.Len(t, seen, 3)
	long := strings.Repeat("x", 300)
	f2 := startFleet(t, mocks(1, 1, 0), nil)
	resp := f2.post("/v1/chat/completions", chatBody, "x-session-id", long)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, readAll(t, resp), "x-session-id: session id is longer than 256 bytes")
}

// TestLoRARouting: worker 1 holds sql-lora by config, worker 2 advertises
// chat-lora in /v1/models, worker 3 holds nothing until the admin API says so.
func TestLoRARouting(t *testing.T) {
	opts := mocks(3, 4, 30*time.Millisecond)
	opts[0].LoRAs = []string{"sql-lora"}
	opts[1].LoRAs = []string{"chat-lora"}
	f := startFleet(t, opts, func(c *config.Config) {
		c.Router.BusyThreshold = 1
		c.Workers[1].LoRAs = nil // known from the worker's /v1/models only
	})
	require.Eventually(t, func() bool { return f.r.Registry.Snapshot().Group([]byte("chat-lora")) != nil },
		5*time.Second, 20*time.Millisecond, "health refresh reads the advertised adapter")
	body := func(model string) string { return fmt.Sprintf(`{"model":%q,"prompt":"x"}`, model) }
	for i := 0; i < 4; i++ {
		assert.Equal(t, "1", f.servedBy("/v1/completions", body("sql-lora")))
		assert.Equal(t, "2", f.servedBy("/v1/completions", body("chat-lora")))
	}
	resp := f.post("/v1/completions", body("nope-lora"))
	text := readAll(t, resp)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Contains(t, text, `model \"nope-lora\" is neither a base model nor a LoRA adapter`)
	resp = f.post("/v1/completions", `{"model":7,"prompt":"x"}`)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, readAll(t, resp), `field \"model\" must be a string`)
	seen := map[string]bool{}
	for i := 0; i < 6; i++ {
		seen[f.servedBy("/v1/completions", body("mock-model"))] = true
	}
	assert.Len(t, seen, 3, "the base model goes anywhere")

	// The only holder busy: 429; the adapter's load is exported meanwhile.
	stream := f.post("/v1/completions", `{"model":"sql-lora","prompt":"x","stream":true}`)
	resp = f.post("/v1/completions", body("sql-lora"))
	readAll(t, resp)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	_, metrics := adminDo(t, f, "GET", "/metrics", "", "")
	assert.Contains(t, metrics, `fastroute_lora_inflight{lora="sql-lora"} 1`)
	readAll(t, stream)

	code, text := adminDo(t, f, "PUT", "/workers/3/loras", `{"loras":["sql-lora"]}`, "")
	require.Equal(t, http.StatusOK, code, text)
	seen = map[string]bool{}
	for i := 0; i < 6; i++ {
		seen[f.servedBy("/v1/completions", body("sql-lora"))] = true
	}
	assert.Equal(t, map[string]bool{"1": true, "3": true}, seen)
	code, _ = adminDo(t, f, "PUT", "/workers/99/loras", `{"loras":["x"]}`, "")
	assert.Equal(t, http.StatusNotFound, code)
	code, _ = adminDo(t, f, "PUT", "/workers/3/loras", `{"adapters":["x"]}`, "")
	assert.Equal(t, http.StatusBadRequest, code)
	_, workers := adminDo(t, f, "GET", "/workers", "", "")
	assert.Contains(t, workers, `"resident_loras":["chat-lora"]`)
	_, metrics = adminDo(t, f, "GET", "/metrics", "", "")
	assert.Contains(t, metrics, `fastroute_lora_inflight{lora="sql-lora"} 0`)
	f.assertIdle()
}

func TestEmbeddingCachePrefersTheWorkerThatServedTheInputs(t *testing.T) {
	f := startFleet(t, mocks(3, 1, 0), nil)
	holder := f.servedBy("/v1/embeddings", `{"model":"mock-model","input":["alpha","beta"]}`)
	for i := 0; i < 5; i++ { // round-robin would rotate
		assert.Equal(t, holder, f.servedBy("/v1/embeddings", `{"model":"mock-model","input":["beta","alpha"]}`))
		assert.Equal(t, holder, f.servedBy("/v1/embeddings", `{"model":"mock-model","input":"alpha"}`))
	}
	seen := map[string]bool{}
	for i := 0; i < 6; i++ {
		seen[f.servedBy("/v1/embeddings", fmt.Sprintf(`{"model":"mock-model","input":["new %d"]}`, i))] = true
	}
	assert.Len(t, seen, 3, "new inputs are not steered")
	_, metrics := adminDo(t, f, "GET", "/metrics", "", "")
	assert.Contains(t, metrics, "\nfastroute_embedding_cache_hits_total 15\n")
	assert.Contains(t, metrics, "\nfastroute_embedding_cache_misses_total 8\n")

	// A reload turns it off (nothing steered, no metrics), and on again
	// with a table that starts empty.
	next := f.r.CurrentConfig()
	next.Router.EmbeddingCacheSize = 0
	applied, needRestart, err := f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"router.embedding_cache_size=0 (the table starts empty)"}, applied)
	assert.Empty(t, needRestart)
	seen = map[string]bool{}
	for range 6 {
		seen[f.servedBy("/v1/embeddings", `{"model":"mock-model","input":"alpha"}`)] = true
	}
	assert.Len(t, seen, 3, "off: round robin")
	_, metrics = adminDo(t, f, "GET", "/metrics", "", "")
	assert.NotContains(t, metrics, "fastroute_embedding_cache_hits_total")
	next.Router.EmbeddingCacheSize = 1024
	_, _, err = f.r.Reload(next)
	require.NoError(t, err)
	holder = f.servedBy("/v1/embeddings", `{"model":"mock-model","input":"alpha"}`)
	for range 3 {
		assert.Equal(t, holder, f.servedBy("/v1/embeddings", `{"model":"mock-model","input":"alpha"}`))
	}
	_, metrics = adminDo(t, f, "GET", "/metrics", "", "")
	assert.Contains(t, metrics, "\nfastroute_embedding_cache_keys 1\n", "a new table")
	f.assertIdle()
}

func TestDPRankRotatesPinsAndForwards(t *testing.T) {
	f := startFleet(t, mocks(1, 1, 0), func(c *config.Config) { c.Workers[0].DPSize = 4 })
	// The rank reaches the worker as vLLM and SGLang read it
	// (X-Data-Parallel-Rank) and in the router's own x-dp-rank, the same.
	rank := func(headers ...string) string {
		resp := f.post("/v1/chat/completions", chatBody, headers...)
		readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, resp.Header.Get("x-mock-dp-rank"), resp.Header.Get("x-mock-x-dp-rank"))
		return resp.Header.Get("x-mock-dp-rank")
	}
	var got []string
	for i := 0; i < 8; i++ {
		got = append(got, rank())
	}
	assert.Equal(t, []string{"0", "1", "2", "3", "0", "1", "2", "3"}, got)
	assert.Equal(t, "2", rank("x-worker-id", "1", "x-dp-rank", "2"))
	assert.Equal(t, "2", rank("x-worker-id", "1", "x-dp-rank", "2", "X-Data-Parallel-Rank", "3"), "the rank is the router's to set")
	assert.Equal(t, "0", rank("X-Data-Parallel-Rank", "3"), "the rank is the router's to set: the next in turn")
	pinned := rank("x-session-id", "dp")
	for i := 0; i < 5; i++ {
		assert.Equal(t, pinned, rank("x-session-id", "dp"), "a session keeps its rank")
	}
	f.assertIdle()
	code, body := adminDo(t, f, "GET", "/workers/1", "", "")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `"rank_occupancy":[0,0,0,0]`)
}

// A request without a pinned rank goes to a rank with none of the router's
// requests in flight: a long stream holds its rank until it ends, and
// short requests meanwhile go to the other two, in turn.
func TestDPRankAvoidsTheBusyRank(t *testing.T) {
	eng := mockworker.Options{ID: 1, Engine: mockworker.EngineOptions{MaxNumSeqs: 8, InterTokenLatency: 10 * time.Millisecond}}
	f := startFleet(t, []mockworker.Options{eng}, func(c *config.Config) { c.Workers[0].DPSize = 3 })
	long := f.post("/v1/chat/completions", `{"model":"mock-model","stream":true,"max_tokens":200,"messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, http.StatusOK, long.StatusCode)
	busy := long.Header.Get("x-mock-dp-rank")
	require.NotEmpty(t, busy)
	ranks := map[string]int{}
	for range 6 {
		resp, body := f.send(http.MethodPost, "/v1/chat/completions", `{"model":"mock-model","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		ranks[resp.Header.Get("x-mock-dp-rank")]++
	}
	assert.Zero(t, ranks[busy], "no short request went to the rank the stream holds: %v", ranks)
	assert.Len(t, ranks, 2, "the two other ranks took them: %v", ranks)
	code, body := adminDo(t, f, "GET", "/workers/1", "", "")
	require.Equal(t, http.StatusOK, code, body)
	want := []string{"0", "0", "0"}
	want[busy[0]-'0'] = "1"
	assert.Contains(t, body, `"rank_occupancy":[`+strings.Join(want, ",")+`]`, "the stream's rank holds it")
	readAll(t, long)
	f.assertIdle()
}

// A hard session whose worker fails at the transport gets the documented
// 503 naming the session and the worker (no client library text), the pin
// is dropped, and the session's next request is pinned anew.
func TestHardAffinityDropsThePinWhenTheWorkerFails(t *testing.T) {
	f := startFleet(t, mocks(2, 1, 0), func(c *config.Config) {
		c.Router.SessionAffinity.Mode = "hard"
		c.Health.Interval = time.Hour // only the request path notices the failure
	})
	pinned := f.servedBy("/v1/chat/completions", chatBody, "x-session-id", "h2")
	for _, m := range f.mocks {
		if fmt.Sprint(m.Served()) == "1" {
			m.Kill()
		}
	}
	resp := f.post("/v1/chat/completions", chatBody, "x-session-id", "h2")
	text := readAll(t, resp)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, text)
	assert.Contains(t, text, `session \"h2\" is pinned to worker `+pinned+", which failed before answering (")
	assert.NotContains(t, text, "Make sure the server", "fasthttp's advice to servers is not the client's business")
	again := f.servedBy("/v1/chat/completions", chatBody, "x-session-id", "h2")
	assert.NotEqual(t, pinned, again, "pinned anew on a live worker")
	f.assertIdle()
}

// Two routers in front of the same workers place each new session on the
// same worker (rendezvous hashing), without talking to each other.
func TestReplicasPlaceSessionsAlike(t *testing.T) {
	a := startFleet(t, mocks(3, 1, 0), nil)
	b := startFleet(t, nil, func(c *config.Config) { c.Workers = a.r.Config.Workers })
	used := map[string]bool{}
	for i := 0; i < 20; i++ {
		session := fmt.Sprintf("s%d", i)
		onA := a.servedBy("/v1/chat/completions", chatBody, "x-session-id", session)
		onB := b.servedBy("/v1/chat/completions", chatBody, "x-session-id", session)
		assert.Equal(t, onA, onB, "session %s", session)
		used[onA] = true
	}
	assert.Len(t, used, 3, "sessions spread over the workers")
	a.assertIdle()
	b.assertIdle()
}

// With lora_placement rendezvous, an adapter no worker holds goes to the
// worker its name hashes to, the same through every replica; off, it is
// the documented 404.
func TestUnheldAdaptersArePlacedAlikeByReplicas(t *testing.T) {
	placed := func(c *config.Config) { c.Router.LoRAPlacement = "rendezvous" }
	a := startFleet(t, mocks(3, 1, 0), placed)
	b := startFleet(t, nil, func(c *config.Config) { placed(c); c.Workers = a.r.Config.Workers })
	for _, f := range []*fleet{a, b} {
		require.Eventually(t, func() bool { return f.r.Registry.Snapshot().Catalog().ListsModels() }, 5*time.Second, 10*time.Millisecond)
	}
	used := map[string]bool{}
	for i := 0; i < 12; i++ {
		body := fmt.Sprintf(`{"model":"adapter-%d","messages":[]}`, i)
		onA, onB := a.servedBy("/v1/chat/completions", body), b.servedBy("/v1/chat/completions", body)
		assert.Equal(t, onA, onB, "adapter-%d", i)
		assert.Equal(t, onA, a.servedBy("/v1/chat/completions", body), "adapter-%d stays on its worker", i)
		used[onA] = true
	}
	assert.Len(t, used, 3, "adapters spread over the workers")

	off := startFleet(t, nil, func(c *config.Config) { c.Workers = a.r.Config.Workers })
	require.Eventually(t, func() bool { return off.r.Registry.Snapshot().Catalog().ListsModels() }, 5*time.Second, 10*time.Millisecond)
	resp := off.post("/v1/chat/completions", `{"model":"adapter-1","messages":[]}`)
	assert.Equal(t, 404, resp.StatusCode)
	readAll(t, resp)

	// A reload places them from the next request on.
	next := off.r.CurrentConfig()
	placed(&next)
	applied, needRestart, err := off.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"router.lora_placement=rendezvous"}, applied)
	assert.Empty(t, needRestart)
	body := `{"model":"adapter-1","messages":[]}`
	assert.Equal(t, a.servedBy("/v1/chat/completions", body), off.servedBy("/v1/chat/completions", body))
	off.assertIdle()
}

// A reload changes session affinity's header and mode for the next
// request, its table's bound at once, and its TTL from the next sweep.
func TestAReloadChangesSessionAffinity(t *testing.T) {
	f := startFleet(t, mocks(3, 1, 0), affinityMode("soft"))
	workers := func(header string) map[string]bool {
		seen := map[string]bool{}
		for range 6 {
			seen[f.servedBy("/v1/chat/completions", chatBody, header, "conversation-7")] = true
		}
		return seen
	}
	assert.Len(t, workers("x-conversation"), 3, "not the session header: round robin")
	next := f.r.CurrentConfig()
	next.Router.SessionAffinity.Header = "x-conversation"
	applied, needRestart, err := f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"router.session_affinity.header=x-conversation"}, applied)
	assert.Empty(t, needRestart)
	assert.Len(t, workers("x-conversation"), 1, "pinned by the new header")

	next.Router.SessionAffinity.Mode = "off"
	applied, _, err = f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"router.session_affinity.mode=off"}, applied)
	assert.Len(t, workers("x-conversation"), 3, "off: round robin again")

	// The table's bound applies too: the sessions created more than it
	// ago go at once, and each new one evicts by it.
	next.Router.SessionAffinity.Mode, next.Router.SessionAffinity.MaxSessions = "soft", 10
	applied, needRestart, err = f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"router.session_affinity.mode=soft", "router.session_affinity.max_sessions=10"}, applied)
	assert.Empty(t, needRestart)
	assert.Len(t, workers("x-conversation"), 1, "pinned again")
	for i := range 12 {
		f.servedBy("/v1/chat/completions", chatBody, "x-conversation", fmt.Sprintf("c%d", i))
	}
	assert.Equal(t, 10, f.r.Sessions.Len(), "the reload's bound")
	next.Router.SessionAffinity.MaxSessions = 4
	applied, _, err = f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"router.session_affinity.max_sessions=4"}, applied)
	assert.Equal(t, 4, f.r.Sessions.Len(), "shrunk at once")

	// The TTL applies from the next sweep: the idle pins of a ten-minute
	// one go within a sweep of a 200 ms one (swept every 100 ms).
	next.Router.SessionAffinity.TTL = 200 * time.Millisecond
	applied, needRestart, err = f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"router.session_affinity.ttl=200ms"}, applied)
	assert.Empty(t, needRestart)
	assert.Eventually(t, func() bool { return f.r.Sessions.Len() == 0 }, 2*time.Second, 10*time.Millisecond)
	assert.Equal(t, 200*time.Millisecond, f.r.CurrentConfig().Router.SessionAffinity.TTL)
	f.assertIdle()
}

// OpenAI's prompt_cache_key (chat completions, the Responses API), or an
// Anthropic request's metadata.user_id, pins a request without a session
// header as its session id would: the turns of
// a conversation an agent names so go to the worker whose engine caches
// its prefix. The header wins over it; one longer than a session id may
// be, or with session affinity off, routes as if absent.
func TestSessionKeysInTheBody(t *testing.T) {
	keyed := func(key string) string {
		return `{"model":"mock-model","prompt_cache_key":"` + key + `","messages":[{"role":"user","content":"hi"}]}`
	}
	f := startFleet(t, mocks(3, 1, 0), affinityMode("soft"))
	first := f.servedBy("/v1/chat/completions", keyed("conversation-1"))
	for range 5 { // round-robin would rotate; the pin holds
		assert.Equal(t, first, f.servedBy("/v1/chat/completions", keyed("conversation-1")))
		assert.Equal(t, first, f.servedBy("/v1/responses", `{"model":"mock-model","prompt_cache_key":"conversation-1","input":"hi"}`))
	}
	byHeader := f.servedBy("/v1/chat/completions", chatBody, "x-session-id", "s1")
	for range 3 {
		assert.Equal(t, byHeader, f.servedBy("/v1/chat/completions", keyed("conversation-1"), "x-session-id", "s1"), "the header's session")
	}
	// Claude Code's metadata.user_id names its session: an Anthropic
	// request's user is its session id.
	claude := func(session string) string {
		return `{"model":"mock-model","max_tokens":8,"metadata":{"user_id":"user_5dd07c33da27e6d2968d94ea20bf47a7b090b6b158b82328d54da2909a108e84_account__session_` +
			session + `"},"messages":[{"role":"user","content":"hi"}]}`
	}
	pinned := f.servedBy("/v1/messages", claude("d2e70091-3007-41a3-a916-cb8b0d3098de"))
	for range 4 {
		assert.Equal(t, pinned, f.servedBy("/v1/messages", claude("d2e70091-3007-41a3-a916-cb8b0d3098de")))
	}
	long := map[string]bool{}
	for range 3 {
		long[f.servedBy("/v1/chat/completions", keyed(strings.Repeat("k", 257)))] = true
	}
	assert.Len(t, long, 3, "an over-long key pins nothing: round-robin")
	_, metrics := adminDo(t, f, "GET", "/metrics", "", "")
	assert.Contains(t, metrics, "\nfastroute_affinity_sessions 3\n")
	f.assertIdle()

	off := startFleet(t, mocks(3, 1, 0), affinityMode("off"))
	seen := map[string]bool{}
	for range 3 {
		seen[off.servedBy("/v1/chat/completions", keyed("conversation-1"))] = true
	}
	assert.Len(t, seen, 3, "affinity off: the key is not read")
}

// A key many clients share (one per application, as OpenAI's documentation
// allows) does not pile their requests on one worker: its worker takes them
// only while it is within router.prefix_affinity.slack (4) requests of the
// least loaded, and least-loaded places the rest. Even in hard mode.
func TestASharedPromptCacheKeyDoesNotPileUp(t *testing.T) {
	f := startFleet(t, mocks(3, 100, 25*time.Millisecond), func(c *config.Config) {
		c.Router.SessionAffinity.Mode = "hard"
		c.Router.Mode = pickers.ModeLeastLoaded
	})
	// Streams of 2.5 s: all twelve are open at once however slowly they start.
	body := `{"model":"mock-model","prompt_cache_key":"rag-app-v1","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	const n = 12
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			resp := f.post("/v1/chat/completions", body)
			text := readAll(t, resp)
			assert.Equal(t, http.StatusOK, resp.StatusCode, text)
		})
	}
	occupancy := func() (total, most int64) {
		for _, w := range f.r.Registry.All() {
			total += w.Occupancy()
			most = max(most, w.Occupancy())
		}
		return total, most
	}
	require.Eventually(t, func() bool { total, _ := occupancy(); return total == n }, 5*time.Second, time.Millisecond)
	_, most := occupancy()
	assert.LessOrEqual(t, most, int64(n/3+4), "no worker holds more than its share and the slack")
	wg.Wait()
	f.assertIdle()
}
