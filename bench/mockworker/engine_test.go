package mockworker

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func startEngine(t *testing.T, o Options) *Worker {
	t.Helper()
	w, err := Start("127.0.0.1:0", o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Close() })
	return w
}

// scrape reads one series of the worker's /metrics.
func scrape(t *testing.T, w *Worker, name string) float64 {
	t.Helper()
	resp, err := http.Get(w.URL() + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `(?:\{[^}]*\})? (\S+)$`).FindSubmatch(b)
	require.NotNil(t, m, "series %s in\n%s", name, b)
	v, err := strconv.ParseFloat(string(m[1]), 64)
	require.NoError(t, err)
	return v
}

func post(ctx context.Context, url, path, body string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+path, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return http.DefaultClient.Do(req)
}

func TestEngineQueuesBeyondItsSlotsAndFreesThemOnDisconnect(t *testing.T) {
	w := startEngine(t, Options{ID: 1, Tokens: 1000, Engine: EngineOptions{MaxNumSeqs: 2, InterTokenLatency: 5 * time.Millisecond}})
	ctx, cancel := context.WithCancel(context.Background())
	body := `{"model":"mock-model","stream":true,"max_tokens":1000,"messages":[{"role":"user","content":"hi"}]}`
	errs := make(chan error, 5)
	for i := 0; i < 5; i++ {
		go func() {
			resp, err := post(ctx, w.URL(), "/v1/chat/completions", body)
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			errs <- err
		}()
	}
	require.Eventually(t, func() bool {
		return scrape(t, w, "vllm:num_requests_running") == 2 && scrape(t, w, "vllm:num_requests_waiting") == 3
	}, 5*time.Second, 10*time.Millisecond, "two run, three wait")
	assert.Positive(t, scrape(t, w, "vllm:kv_cache_usage_perc"))
	cancel() // every client gives up: the running ones mid-answer, the waiting ones before any byte
	for i := 0; i < 5; i++ {
		<-errs
	}
	// Each series is read in a scrape of its own: a waiting request can
	// be admitted between two of them (running read 0 before, waiting 0
	// after) until its own disconnect drops it, so all three are awaited.
	require.Eventually(t, func() bool {
		return scrape(t, w, "vllm:num_requests_running") == 0 && scrape(t, w, "vllm:num_requests_waiting") == 0 &&
			scrape(t, w, "vllm:kv_cache_usage_perc") == 0
	}, 5*time.Second, 10*time.Millisecond, "slots, queue and cache blocks freed by the disconnects")
	// The handler counts itself out after the engine freed its slot.
	require.Eventually(t, func() bool { return w.Active() == 0 }, 5*time.Second, 10*time.Millisecond)
}

func TestEngineNonStreamingDisconnectWhileQueued(t *testing.T) {
	w := startEngine(t, Options{ID: 1, Engine: EngineOptions{MaxNumSeqs: 1, InterTokenLatency: 5 * time.Millisecond}})
	long, cancelLong := context.WithCancel(context.Background())
	defer cancelLong()
	go func() {
		if resp, err := post(long, w.URL(), "/v1/completions", `{"prompt":"x","max_tokens":10000}`); err == nil {
			resp.Body.Close()
		}
	}()
	require.Eventually(t, func() bool { return scrape(t, w, "vllm:num_requests_running") == 1 }, 5*time.Second, 10*time.Millisecond,
		"the long request runs before the second one queues")
	queued, cancelQueued := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := post(queued, w.URL(), "/v1/completions", `{"prompt":"y","max_tokens":4}`); err == nil {
			resp.Body.Close()
		}
	}()
	require.Eventually(t, func() bool {
		return scrape(t, w, "vllm:num_requests_waiting") == 1 && scrape(t, w, "vllm:num_requests_running") == 1
	}, 5*time.Second, 10*time.Millisecond)
	cancelQueued()
	<-done
	require.Eventually(t, func() bool { return scrape(t, w, "vllm:num_requests_waiting") == 0 }, 5*time.Second, 10*time.Millisecond)
	assert.EqualValues(t, 1, scrape(t, w, "vllm:num_requests_running"), "the long request still runs")
}

// timeToAnswer measures a non-streaming answer of n tokens while load
// requests of the same size run beside it.
func timeToAnswer(t *testing.T, w *Worker, load int) time.Duration {
	t.Helper()
	body := `{"model":"mock-model","max_tokens":20,"messages":[]}`
	done := make(chan time.Duration, load+1)
	for i := 0; i <= load; i++ {
		go func() {
			start := time.Now()
			resp, err := post(context.Background(), w.URL(), "/v1/chat/completions", body)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			done <- time.Since(start)
		}()
	}
	var worst time.Duration
	for i := 0; i <= load; i++ {
		worst = max(worst, <-done)
	}
	return worst
}

func TestEngineSlowsWithBatchQueueAndSpeed(t *testing.T) {
	o := EngineOptions{MaxNumSeqs: 4, InterTokenLatency: 2 * time.Millisecond, LoadFactor: 0.5, PrefillPerToken: time.Microsecond}
	fast := startEngine(t, Options{ID: 1, Engine: o})
	alone := timeToAnswer(t, fast, 0)
	batch := timeToAnswer(t, fast, 3)  // 4 running: steps 2.5× as long
	queued := timeToAnswer(t, fast, 7) // 4 more wait for a whole answer
	o.Speed = 0.25
	slow := timeToAnswer(t, startEngine(t, Options{ID: 2, Engine: o}), 0)
	t.Logf("alone %v, batch of 4 %v, 8 on 4 slots %v, alone at speed 1/4 %v", alone, batch, queued, slow)
	// The model's floors, which a busy machine can only exceed: 20 tokens
	// (counted as 19 steps, a step's margin) of 2 ms, times 2.5 with 4
	// running (load factor 0.5), twice over for the 4 that wait, times 4 at
	// speed 1/4. (Ratios to the time alone failed when load stretched that
	// one.)
	steps := 19 * o.InterTokenLatency
	assert.Less(t, alone, batch, "a fuller batch decodes slower")
	assert.GreaterOrEqual(t, batch, steps*5/2, "4 running: each step 2.5× as long")
	assert.GreaterOrEqual(t, queued, 2*steps*5/2, "requests beyond the slots wait for a whole answer")
	assert.GreaterOrEqual(t, slow, steps*4, "speed scales the step")
}

func TestEngineWaitsForKVCache(t *testing.T) {
	// 10 blocks of 4 tokens: one request of ~21 prompt tokens and 8 answer
	// tokens takes 6 of them to start, so a second must wait although a slot is free.
	w := startEngine(t, Options{ID: 1, Engine: EngineOptions{MaxNumSeqs: 4, KVBlocks: 10, BlockSize: 4, InterTokenLatency: 20 * time.Millisecond}})
	body := `{"model":"mock-model","max_tokens":8,"prompt":"0123456789012345678901234567890123456789012345678901234567"}`
	for i := 0; i < 2; i++ {
		go func() {
			if resp, err := post(context.Background(), w.URL(), "/v1/completions", body); err == nil {
				resp.Body.Close()
			}
		}()
	}
	require.Eventually(t, func() bool {
		return scrape(t, w, "vllm:num_requests_running") == 1 && scrape(t, w, "vllm:num_requests_waiting") == 1
	}, 5*time.Second, 5*time.Millisecond, "the second waits for cache blocks")
	require.Eventually(t, func() bool {
		return scrape(t, w, "vllm:num_requests_running")+scrape(t, w, "vllm:num_requests_waiting") == 0
	}, 5*time.Second, 10*time.Millisecond)
	resp, err := post(context.Background(), w.URL(), "/v1/completions", `{"max_tokens":100,"prompt":"x"}`)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "a request larger than the whole cache is refused")
}

func TestEngineOpenAIShapes(t *testing.T) {
	w := startEngine(t, Options{ID: 3, Model: "m", LoRAs: []string{"sql"}, Engine: EngineOptions{MaxNumSeqs: 4, InterTokenLatency: time.Millisecond}})
	resp, err := post(context.Background(), w.URL(), "/v1/completions", `{"model":"m","prompt":"hello","max_tokens":3}`)
	require.NoError(t, err)
	var c struct {
		Object  string
		Choices []struct {
			Text         string
			FinishReason string `json:"finish_reason"`
		}
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		}
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&c))
	resp.Body.Close()
	assert.Equal(t, "text_completion", c.Object)
	require.Len(t, c.Choices, 1)
	assert.Equal(t, "tok0 tok1 tok2 ", c.Choices[0].Text)
	assert.Equal(t, "length", c.Choices[0].FinishReason)
	assert.Equal(t, 3, c.Usage.CompletionTokens)

	resp, err = post(context.Background(), w.URL(), "/v1/chat/completions",
		`{"model":"sql","stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":2,"messages":[]}`)
	require.NoError(t, err)
	var events []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			events = append(events, line)
		}
	}
	resp.Body.Close()
	require.Len(t, events, 4, "two tokens, the usage chunk, [DONE]")
	assert.Contains(t, events[0], `"delta":{"content":"tok0 "}`)
	assert.Contains(t, events[2], `"choices":[]`)
	assert.Contains(t, events[2], `"completion_tokens":2`)
	assert.Equal(t, "[DONE]", events[3])

	resp, err = post(context.Background(), w.URL(), "/v1/embeddings", `{"model":"m","input":["a","b"],"encoding_format":"base64"}`)
	require.NoError(t, err)
	var e struct{ Data []struct{ Embedding string } }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
	resp.Body.Close()
	require.Len(t, e.Data, 2)
	raw, err := base64.StdEncoding.DecodeString(e.Data[0].Embedding)
	require.NoError(t, err)
	require.Len(t, raw, 12, "three float32s")
	assert.InDelta(t, 0.3, math.Float32frombits(binary.LittleEndian.Uint32(raw)), 1e-6)
}

func TestMetricsDialectsAndLoRAInfo(t *testing.T) {
	w := startEngine(t, Options{ID: 1, LoRAs: []string{"sql", "chat"}, Engine: EngineOptions{MaxNumSeqs: 1, InterTokenLatency: 5 * time.Millisecond}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, model := range []string{"sql", "chat"} {
		go func() {
			if resp, err := post(ctx, w.URL(), "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":"x","max_tokens":10000}`, model)); err == nil {
				resp.Body.Close()
			}
		}()
		time.Sleep(20 * time.Millisecond) // sql arrives first and runs; chat waits
	}
	require.Eventually(t, func() bool {
		return scrape(t, w, "vllm:num_requests_waiting") == 1 && scrape(t, w, "vllm:num_requests_running") == 1
	}, 5*time.Second, 10*time.Millisecond)
	resp, err := http.Get(w.URL() + "/metrics")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Regexp(t, `vllm:lora_requests_info\{max_lora="4",running_lora_adapters="sql",waiting_lora_adapters="chat"\} \d+`, string(b))
	assert.Contains(t, string(b), `vllm:num_requests_running{model_name="mock-model"} 1`)

	sg := startEngine(t, Options{ID: 2, MetricsDialect: "sglang", Engine: EngineOptions{MaxNumSeqs: 1}})
	assert.Zero(t, scrape(t, sg, "sglang:num_running_reqs"))
	assert.Zero(t, scrape(t, sg, "sglang:num_queue_reqs"))
	assert.Zero(t, scrape(t, sg, "sglang:token_usage"))

	// trtllm-serve's names and labels, its active-request limit the batch size.
	tr := startEngine(t, Options{ID: 4, MetricsDialect: "trtllm", Engine: EngineOptions{MaxNumSeqs: 3}})
	assert.Zero(t, scrape(t, tr, "trtllm_num_requests_running"))
	assert.Equal(t, 3.0, scrape(t, tr, "trtllm_max_num_active_requests"))
	resp, err = http.Get(tr.URL() + "/metrics")
	require.NoError(t, err)
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(b), `trtllm_num_requests_waiting{engine_type="trtllm",model_name="mock-model"} 0`)

	// TGI's, the tokens generated a histogram's sum.
	tg := startEngine(t, Options{ID: 5, MetricsDialect: "tgi", Engine: EngineOptions{MaxNumSeqs: 2}})
	if resp, err := post(ctx, tg.URL(), "/v1/completions", `{"prompt":"x","max_tokens":5}`); assert.NoError(t, err) {
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	assert.Equal(t, 5.0, scrape(t, tg, "tgi_request_generated_tokens_sum"))
	assert.Zero(t, scrape(t, tg, "tgi_batch_current_size"))

	// llama-server's names, without labels: a request in its one slot
	// processing, the next deferred.
	ll := startEngine(t, Options{ID: 3, MetricsDialect: "llamacpp", Engine: EngineOptions{MaxNumSeqs: 1, InterTokenLatency: 5 * time.Millisecond}})
	for range 2 {
		go func() {
			if resp, err := post(ctx, ll.URL(), "/v1/completions", `{"prompt":"x","max_tokens":10000}`); err == nil {
				resp.Body.Close()
			}
		}()
	}
	// A request arrives deferred until the engine's next step takes it
	// into the slot: wait for both counts, not the first alone.
	require.Eventually(t, func() bool {
		return scrape(t, ll, "llamacpp:requests_deferred") == 1 && scrape(t, ll, "llamacpp:requests_processing") == 1
	}, 5*time.Second, 10*time.Millisecond)
	resp, err = http.Get(ll.URL() + "/metrics")
	require.NoError(t, err)
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(b), "\nllamacpp:requests_processing 1\n")
}

// With a prefix cache, a prompt that repeats an earlier one's beginning
// finds those blocks cached, as vLLM counts it in its prefix cache series;
// another prompt finds nothing.
func TestEnginePrefixCacheFindsRepeatedPrefixes(t *testing.T) {
	w := startEngine(t, Options{ID: 1, Tokens: 2, Engine: EngineOptions{MaxNumSeqs: 4, InterTokenLatency: time.Millisecond, PrefixCache: true}})
	system := strings.Repeat("You are a careful assistant. ", 20) // 580 bytes: 9 blocks of 64
	ask := func(messages string) {
		resp, err := post(context.Background(), w.URL(), "/v1/chat/completions", `{"model":"mock-model","messages":[`+messages+`]}`)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	first := `{"role":"system","content":"` + system + `"},{"role":"user","content":"What is the tallest mountain?"}`
	ask(first)
	assert.Zero(t, scrape(t, w, "vllm:prefix_cache_hits_total"))
	queries := scrape(t, w, "vllm:prefix_cache_queries_total")
	assert.Positive(t, queries)

	ask(first + `,{"role":"assistant","content":"Everest."},{"role":"user","content":"And the second?"}`)
	hits := scrape(t, w, "vllm:prefix_cache_hits_total")
	assert.Equal(t, float64(9*16), hits, "the first prompt's 9 whole blocks (623 bytes of text: its last 47 make no block)")

	ask(`{"role":"system","content":"` + strings.Repeat("Answer in French. ", 40) + `"}`)
	assert.Equal(t, hits, scrape(t, w, "vllm:prefix_cache_hits_total"), "another prompt shares nothing")
	assert.Greater(t, scrape(t, w, "vllm:prefix_cache_queries_total"), queries)

	// A decode leg (vLLM's do_remote_prefill) caches the prompt its KV
	// connector brought, as vLLM's decode engine does, without counting
	// it; the next turn, run whole, finds it.
	other := `{"role":"system","content":"` + strings.Repeat("You are a terse assistant. ", 20) + `"},{"role":"user","content":"Why?"}`
	hits, queries = scrape(t, w, "vllm:prefix_cache_hits_total"), scrape(t, w, "vllm:prefix_cache_queries_total")
	resp, err := post(context.Background(), w.URL(), "/v1/chat/completions", `{"model":"mock-model","messages":[`+other+`],`+
		`"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1]}}`)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	assert.Equal(t, [2]float64{hits, queries}, [2]float64{scrape(t, w, "vllm:prefix_cache_hits_total"), scrape(t, w, "vllm:prefix_cache_queries_total")})
	ask(other + `,{"role":"assistant","content":"Because."},{"role":"user","content":"Go on."}`)
	assert.Greater(t, scrape(t, w, "vllm:prefix_cache_hits_total"), hits, "the decoded prompt's blocks are found")
}

// vLLM's sleep mode in miniature: POST /sleep puts the engine to sleep at a
// level, its metrics say so as vLLM's do, requests under /v1/ are refused
// until POST /wake_up, and GET /is_sleeping tells.
func TestSleepMode(t *testing.T) {
	w := startEngine(t, Options{ID: 1})
	ctx := context.Background()
	sleepState := func() string {
		resp, err := http.Get(w.URL() + "/metrics")
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var on []string
		for _, m := range regexp.MustCompile(`(?m)^vllm:engine_sleep_state\{engine="0",model_name="mock-model",sleep_state="(\w+)"\} (\d)$`).FindAllSubmatch(b, -1) {
			if string(m[2]) == "1" {
				on = append(on, string(m[1]))
			}
		}
		require.Len(t, on, 1, "one state at a time in\n%s", b)
		return on[0]
	}
	isSleeping := func() string {
		resp, err := http.Get(w.URL() + "/is_sleeping")
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	chat := func() int {
		resp, err := post(ctx, w.URL(), "/v1/chat/completions", `{"model":"mock-model","messages":[]}`)
		require.NoError(t, err)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	do := func(path string) int {
		resp, err := post(ctx, w.URL(), path, "")
		require.NoError(t, err)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	assert.Equal(t, "awake", sleepState())
	assert.Equal(t, `{"is_sleeping":false}`, isSleeping())
	assert.Equal(t, http.StatusOK, chat())

	assert.Equal(t, http.StatusOK, do("/sleep"))
	assert.Equal(t, "weights_offloaded", sleepState(), "level 1 by default")
	assert.Equal(t, `{"is_sleeping":true}`, isSleeping())
	assert.Equal(t, http.StatusServiceUnavailable, chat())
	assert.True(t, w.Asleep())
	assert.Equal(t, http.StatusOK, do("/sleep?level=2"))
	assert.Equal(t, "discard_all", sleepState())
	assert.Equal(t, http.StatusBadRequest, do("/sleep?level=3"))
	assert.Equal(t, "discard_all", sleepState(), "a bad level changes nothing")

	assert.Equal(t, http.StatusOK, do("/wake_up?tags=weights&tags=kv_cache"))
	assert.Equal(t, "awake", sleepState())
	assert.Equal(t, `{"is_sleeping":false}`, isSleeping())
	assert.Equal(t, http.StatusOK, chat())
	assert.False(t, w.Asleep())
}

// With a context length set, /v1/models reports it and a request that does
// not fit is refused as vLLM refuses it: a 400 naming the maximum context
// length, for a prompt too long or a max_tokens too large.
func TestContextLength(t *testing.T) {
	w := startEngine(t, Options{ID: 1, MaxModelLen: 100})
	ctx := context.Background()
	resp, err := http.Get(w.URL() + "/v1/models")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(b), `"max_model_len":100`)
	for _, c := range []struct {
		body   string
		status int
		says   string
	}{
		{`{"model":"mock-model","prompt":"hi","max_tokens":50}`, http.StatusOK, ""},
		{`{"model":"mock-model","prompt":"hi","max_tokens":99}`, http.StatusBadRequest, "'max_tokens' or 'max_completion_tokens' is too large: 99. This model's maximum context length is 100 tokens"},
		{`{"model":"mock-model","prompt":"` + strings.Repeat("x", 400) + `"}`, http.StatusBadRequest, "This model's maximum context length is 100 tokens. However, your request has 108 input tokens."},
	} {
		resp, err := post(ctx, w.URL(), "/v1/completions", c.body)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, c.status, resp.StatusCode, string(b))
		assert.Contains(t, string(b), c.says)
	}

	// As llama-server: its slot's context under meta, only a prompt too
	// long refused, in its own words.
	ll := startEngine(t, Options{ID: 2, MaxModelLen: 100, MetricsDialect: "llamacpp"})
	resp, err = http.Get(ll.URL() + "/v1/models")
	require.NoError(t, err)
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(b), `"owned_by":"llamacpp","meta":{"n_ctx":100,`)
	for body, status := range map[string]int{
		`{"model":"mock-model","prompt":"hi","max_tokens":99}`:               http.StatusOK,
		`{"model":"mock-model","prompt":"` + strings.Repeat("x", 400) + `"}`: http.StatusBadRequest,
	} {
		resp, err := post(ctx, ll.URL(), "/v1/completions", body)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, status, resp.StatusCode, string(b))
		if status == http.StatusBadRequest {
			assert.Contains(t, string(b), `"type":"exceed_context_size_error","n_prompt_tokens":108,"n_ctx":100`)
		}
	}
}

// With MetricsDelay the metrics page answers that long after it is asked,
// with the figures of that moment.
func TestMetricsDelay(t *testing.T) {
	w := startEngine(t, Options{MetricsDelay: 150 * time.Millisecond})
	start := time.Now()
	resp, err := http.Get(w.URL() + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond)
	assert.Contains(t, string(body), "vllm:num_requests_running")
}

// With NoMetrics the metrics page is a 404, as SGLang's without
// --enable-metrics is; the engine still answers.
func TestNoMetrics(t *testing.T) {
	w := startEngine(t, Options{NoMetrics: true})
	resp, err := http.Get(w.URL() + "/metrics")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	resp, err = http.Post(w.URL()+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"mock-model","max_tokens":2,"messages":[]}`))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

// The simulated engine reports the gaps between a request's tokens as
// vLLM and SGLang do, in an inter-token latency histogram: one gap a token
// after the first, each at least a step long.
func TestEngineReportsItsInterTokenLatency(t *testing.T) {
	for _, c := range []struct{ dialect, name string }{
		{"", "vllm:inter_token_latency_seconds"},
		{"sglang", "sglang:inter_token_latency_seconds"},
	} {
		w := startEngine(t, Options{ID: 1, MetricsDialect: c.dialect, Engine: EngineOptions{MaxNumSeqs: 2, InterTokenLatency: 2 * time.Millisecond}})
		assert.Zero(t, scrape(t, w, c.name+"_count"), "none before a request")
		for range 2 {
			resp, err := post(context.Background(), w.URL(), "/v1/completions", `{"model":"mock-model","prompt":"hi","max_tokens":21}`)
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		assert.Equal(t, 40.0, scrape(t, w, c.name+"_count"), c.name)
		secs := scrape(t, w, c.name+"_sum")
		assert.GreaterOrEqual(t, secs, 40*0.002, "%s: no gap shorter than a step", c.name)
		assert.Less(t, secs, 40*0.1, c.name)
		assert.Equal(t, 40.0, scrape(t, w, c.name+"_bucket"), c.name)
	}
}
