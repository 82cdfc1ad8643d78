package router

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/telemetry/engine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A fleet whose engines serve the same model with different context
// lengths (a CPU engine's short one beside GPU engines'): a request an
// engine refuses as longer than its context (vLLM's 400) moves to a
// worker of a longer context, as often as it takes, instead of failing
// where the pick happened to send it; one longer than every context gets
// the engine's 400, as does one bound to its worker. The contexts are
// those the workers' /v1/models list, unless the config sets one; the
// router's /v1/models lists the longest.
func TestARequestLongerThanAContextMovesToALongerOne(t *testing.T) {
	f := startFleet(t, []mockworker.Options{{ID: 1, MaxModelLen: 256}, {ID: 2, MaxModelLen: 1024}, {ID: 3, MaxModelLen: 4096}},
		func(c *config.Config) { c.Workers[2].MaxModelLen = 0 }) // from its /v1/models
	require.Eventually(t, func() bool {
		code, text := adminDo(t, f, "GET", "/workers", "", "")
		var all []struct {
			Listed struct {
				MaxModelLen int `json:"max_model_len"`
			} `json:"listed"`
		}
		return code == http.StatusOK && json.Unmarshal([]byte(text), &all) == nil && len(all) == 3 &&
			all[0].Listed.MaxModelLen == 256 && all[1].Listed.MaxModelLen == 1024 && all[2].Listed.MaxModelLen == 4096
	}, 5*time.Second, 10*time.Millisecond, "GET /workers shows the contexts the workers list")
	// The router's listing gives the longest: what a request can have.
	_, listing := f.send("GET", "/v1/models/mock-model", "")
	assert.Contains(t, listing, `"max_model_len":4096`)

	// A prompt of 500 tokens (the mock's 4 bytes a token) fits workers 2
	// and 3: round robin sends some to worker 1, which refuses each (its
	// refusals count among its mock's requests); each moves on.
	moves := func() string { return metric(t, f, "fastroute_context_moves_total") }
	long := fmt.Sprintf(`{"model":"mock-model","prompt":%q,"max_tokens":4}`, strings.Repeat("x", 2000))
	served := map[string]int{}
	for range 6 {
		served[f.servedBy("/v1/completions", long)]++
	}
	assert.Zero(t, served["1"], "worker 1's context is too short")
	assert.Equal(t, 6, served["2"]+served["3"])
	refused := f.mocks[0].Served()
	assert.Positive(t, refused, "round robin started some on worker 1")
	assert.Equal(t, fmt.Sprint(refused), moves(), "one move for each refusal")

	// max_tokens 2000 fits worker 3 alone: from worker 1 it moves past
	// worker 2 too.
	longer := `{"model":"mock-model","prompt":"hi","max_tokens":2000}`
	before := f.mocks[0].Served() + f.mocks[1].Served()
	for range 3 {
		assert.Equal(t, "3", f.servedBy("/v1/completions", longer))
	}
	assert.Equal(t, fmt.Sprint(refused+f.mocks[0].Served()+f.mocks[1].Served()-before), moves())

	// Longer than every context: the engine's own 400 reaches the client.
	resp, body := f.send("POST", "/v1/completions", `{"model":"mock-model","prompt":"hi","max_tokens":5000}`)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, body, "This model's maximum context length is 4096 tokens")
	assert.Equal(t, "3", resp.Header.Get("x-fastroute-worker"))
	// Bound to its worker: no move.
	resp, body = f.send("POST", "/v1/completions", long, "x-worker-id", "1")
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, body, "This model's maximum context length is 256 tokens")
	// A streaming request moves the same way: the refusal is no stream.
	stream := fmt.Sprintf(`{"model":"mock-model","stream":true,"prompt":%q,"max_tokens":4}`, strings.Repeat("x", 2000))
	for range 3 {
		resp, body := f.send("POST", "/v1/completions", stream)
		assert.Equal(t, http.StatusOK, resp.StatusCode, body)
		assert.Contains(t, body, "data: [DONE]")
		assert.NotEqual(t, "1", resp.Header.Get("x-fastroute-worker"))
	}
	f.assertIdle()
}

// The config's max_model_len wins over what a worker lists: set longer
// than every other worker's, nothing is longer, and its refusals are the
// client's answers.
func TestAConfiguredContextLengthWins(t *testing.T) {
	f := startFleet(t, []mockworker.Options{{ID: 1, MaxModelLen: 256}, {ID: 2, MaxModelLen: 1024}},
		func(c *config.Config) { c.Workers[0].MaxModelLen = 100000 })
	require.Eventually(t, func() bool {
		_, text := adminDo(t, f, "GET", "/workers", "", "")
		return strings.Count(text, `"max_model_len":1024`) == 1 && strings.Contains(text, `"max_model_len":256`)
	}, 5*time.Second, 10*time.Millisecond, "both workers' /v1/models were read")
	_, text := adminDo(t, f, "GET", "/workers/1", "", "")
	assert.Contains(t, text, `"context_length":100000`, "the one routing uses: the config's")
	assert.Contains(t, text, `"max_model_len":256`, "beside the one it lists")
	long := fmt.Sprintf(`{"model":"mock-model","prompt":%q,"max_tokens":4}`, strings.Repeat("x", 2000))
	refused := 0
	for range 4 {
		resp, body := f.send("POST", "/v1/completions", long)
		if resp.StatusCode == http.StatusBadRequest {
			refused++
			assert.Equal(t, "1", resp.Header.Get("x-fastroute-worker"), body)
		}
	}
	assert.Equal(t, 2, refused, "round robin sent two of four to worker 1")
	assert.Equal(t, "0", metric(t, f, "fastroute_context_moves_total"))
	f.assertIdle()
}

// A llama.cpp worker's context is its /v1/models' meta.n_ctx, and its own
// refusal of a longer prompt moves the request to the vLLM worker beside
// it (a CPU engine's short context beside a GPU engine's long one).
func TestALlamaCppWorkersRefusalsMove(t *testing.T) {
	f := startFleet(t, []mockworker.Options{{ID: 1, MaxModelLen: 256, MetricsDialect: "llamacpp"}, {ID: 2, MaxModelLen: 4096}}, nil)
	require.Eventually(t, func() bool {
		_, text := adminDo(t, f, "GET", "/workers", "", "")
		return strings.Contains(text, `"max_model_len":256`) && strings.Contains(text, `"max_model_len":4096`)
	}, 5*time.Second, 10*time.Millisecond, "both workers' contexts learned")
	long := fmt.Sprintf(`{"model":"mock-model","messages":[{"role":"user","content":%q}]}`, strings.Repeat("x", 2000))
	for range 4 {
		assert.Equal(t, "2", f.servedBy("/v1/chat/completions", long))
	}
	refused := f.mocks[0].Served()
	assert.Positive(t, refused)
	assert.Equal(t, fmt.Sprint(refused), metric(t, f, "fastroute_context_moves_total"))
	resp, body := f.send("POST", "/v1/chat/completions", long, "x-worker-id", "1")
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, body, "exceed_context_size_error", "llama-server's own refusal, when bound to it")
	f.assertIdle()
}

// The prefill leg of a split request (vLLM's protocol) that its worker
// refuses as longer than its context moves to a prefill worker of a longer
// one, as a whole request moves; a leg bound to its worker does not.
func TestAPrefillLegRefusedAsLongerMovesToALongerContext(t *testing.T) {
	f := startFleet(t, []mockworker.Options{{ID: 1, MaxModelLen: 256}, {ID: 2, MaxModelLen: 4096}, {ID: 3, MaxModelLen: 4096}}, func(c *config.Config) {
		c.Router.Disaggregation.Protocol = config.DisaggVLLM
		for i, role := range []dataplane.Role{dataplane.RolePrefill, dataplane.RolePrefill, dataplane.RoleDecode} {
			c.Workers[i].Role, c.Workers[i].MaxModelLen = role, []int{256, 4096, 4096}[i]
		}
	})
	long := fmt.Sprintf(`{"model":"mock-model","prompt":%q,"max_tokens":4}`, strings.Repeat("x", 2000)) // 500 tokens
	for range 4 {
		assert.Equal(t, "3", f.servedBy("/v1/completions", long))
	}
	refused := f.mocks[0].Served()
	assert.Positive(t, refused, "round robin started some prefills on worker 1")
	assert.EqualValues(t, 4, f.mocks[1].Served(), "every prefill ended on worker 2")
	assert.Equal(t, fmt.Sprint(refused), metric(t, f, "fastroute_context_moves_total"), "one move for each refusal")
	m := f.r.Frontend.Metrics()
	assert.EqualValues(t, 4, m.Phase("prefill", "ok"))
	assert.EqualValues(t, 4, m.Phase("decode", "ok"))

	resp := f.post("/v1/completions", long, "x-prefill-worker-id", "1")
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, readAll(t, resp), "maximum context length", "bound to worker 1: its refusal")
	f.assertIdle()
}

// GET /workers shows the capacity a worker whose engine speed is not
// learned yet is priced at (the mean of the learned ones), and none for a
// learned one; /metrics shows every priced worker's capacity and cost.
func TestWorkersShowAStandInCapacity(t *testing.T) {
	f := startFleet(t, []mockworker.Options{{ID: 1}, {ID: 2}, {ID: 3}, {ID: 4}},
		func(c *config.Config) { c.Telemetry.Engine.Enabled = false }) // the readings are the test's
	f.r.Registry.SetEngine(1, &engine.Stats{Slots: 16, TokenRate: 50, Admit: 32}) // batches known (seen full)
	f.r.Registry.SetEngine(2, &engine.Stats{Reading: engine.Reading{Running: 6, KVUsage: 0.9}, Slots: 8, TokenRate: 50, Admit: 16})
	f.r.Registry.SetEngine(3, &engine.Stats{Reading: engine.Reading{Running: 2}})
	f.r.Registry.SetEngine(4, nil)
	for id, want := range map[string][3]string{
		"1": {"800", "0", "0.00125"}, // (0 + 1) / 800
		"2": {"400", "0", "0.0525"},  // (6 + 1) / 400 × (1 + 20 × 0.1)
		"3": {"100", "1", "0.03"},    // (2 + 1) / 100
		"4": {"", "", ""},            // no reading: unpriced
	} {
		for i, name := range []string{"fastroute_worker_engine_capacity", "fastroute_worker_engine_stand_in", "fastroute_worker_engine_cost"} {
			got := metric(t, f, name+`{worker="`+id+`"}`)
			if want[i] == "" {
				assert.Empty(t, got, "%s of worker %s", name, id)
				continue
			}
			v, err := strconv.ParseFloat(got, 64)
			require.NoError(t, err, "%s of worker %s: %q", name, id, got)
			w, _ := strconv.ParseFloat(want[i], 64)
			assert.InDelta(t, w, v, 1e-9, "%s of worker %s", name, id)
		}
	}
	_, text := adminDo(t, f, "GET", "/workers", "", "")
	var all []map[string]any
	require.NoError(t, json.Unmarshal([]byte(text), &all))
	require.Len(t, all, 4)
	assert.NotContains(t, all[0], "engine_stand_in_capacity")
	assert.NotContains(t, all[1], "engine_stand_in_capacity")
	assert.Equal(t, 100.0, all[2]["engine_stand_in_capacity"], "50 tokens a second a request, times a probe of two")
}
