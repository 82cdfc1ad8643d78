package engine

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/internal/bearer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// vllmPage is a vLLM v1 page as its Python Prometheus client writes it: two
// data-parallel engines, counters with their _created twins, a histogram,
// and lora_requests_info written once per change.
const vllmPage = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.91
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.25
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1000.0
vllm:generation_tokens_total{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 234.0
# HELP vllm:generation_tokens_created Number of generation tokens processed.
# TYPE vllm:generation_tokens_created gauge
vllm:generation_tokens_created{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.7646048e+09
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.52
# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.025",model_name="meta-llama/Llama-3.1-8B-Instruct"} 90.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 100.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 100.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
vllm:inter_token_latency_seconds_bucket{engine="1",le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 50.0
vllm:inter_token_latency_seconds_count{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 50.0
vllm:inter_token_latency_seconds_sum{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.5
# HELP vllm:time_per_output_token_seconds Histogram of time per output token in seconds. DEPRECATED: use vllm:inter_token_latency_seconds.
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{engine="0",le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 10.0
vllm:time_per_output_token_seconds_count{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 10.0
vllm:time_per_output_token_seconds_sum{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 9.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 6000.0
vllm:prefix_cache_queries_total{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4000.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3000.0
vllm:prefix_cache_hits_total{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1000.0
# HELP vllm:engine_sleep_state Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.
# TYPE vllm:engine_sleep_state gauge
vllm:engine_sleep_state{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct",sleep_state="awake"} 1.0
vllm:engine_sleep_state{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct",sleep_state="weights_offloaded"} 0.0
vllm:engine_sleep_state{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct",sleep_state="discard_all"} 0.0
vllm:engine_sleep_state{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct",sleep_state="awake"} 1.0
vllm:engine_sleep_state{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct",sleep_state="weights_offloaded"} 0.0
vllm:engine_sleep_state{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct",sleep_state="discard_all"} 0.0
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="old-lora",waiting_lora_adapters=""} 1.7646040e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql-lora,chat-lora",waiting_lora_adapters="sql-lora"} 1.7646048e+09
`

// vllmV0Page names the KV cache usage as vLLM's V0 engine did.
const vllmV0Page = `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 0.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 40.0
vllm:time_per_output_token_seconds_sum{model_name="m"} 1.0
vllm:time_per_output_token_seconds_count{model_name="m"} 40.0
`

// sglangPage is SGLang's /metrics with --enable-metrics.
const sglangPage = `# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 8.128902e+06
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.557572e+06
# HELP sglang:token_usage The token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.28
# HELP sglang:num_running_reqs The number of running requests
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
# HELP sglang:cache_hit_rate The cache hit rate
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.42
# HELP sglang:max_running_requests The maximum number of running requests
# TYPE sglang:max_running_requests gauge
sglang:max_running_requests{model_name="meta-llama/Llama-3.1-8B-Instruct"} 48.0
# HELP sglang:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE sglang:inter_token_latency_seconds histogram
sglang:inter_token_latency_seconds_sum{model_name="meta-llama/Llama-3.1-8B-Instruct"} 160.0
sglang:inter_token_latency_seconds_bucket{le="0.002",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
sglang:inter_token_latency_seconds_bucket{le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 8000.0
sglang:inter_token_latency_seconds_count{model_name="meta-llama/Llama-3.1-8B-Instruct"} 8000.0
`

// trtllmPage is TensorRT-LLM's trtllm-serve /prometheus/metrics with
// enable_iter_perf_stats (the labels its MetricsCollector is given), part
// of it: two of its histograms and a counter it does not read.
const trtllmPage = `# HELP trtllm_request_success_total Count of successfully processed requests.
# TYPE trtllm_request_success_total counter
trtllm_request_success_total{engine_type="trtllm",finished_reason="stop",model_name="nvidia/Llama-3.1-8B-Instruct-FP8"} 412.0
# HELP trtllm_e2e_request_latency_seconds Histogram of end to end request latency in seconds.
# TYPE trtllm_e2e_request_latency_seconds histogram
trtllm_e2e_request_latency_seconds_bucket{engine_type="trtllm",le="0.3",model_name="nvidia/Llama-3.1-8B-Instruct-FP8"} 3.0
trtllm_e2e_request_latency_seconds_bucket{engine_type="trtllm",le="+Inf",model_name="nvidia/Llama-3.1-8B-Instruct-FP8"} 412.0
trtllm_e2e_request_latency_seconds_count{engine_type="trtllm",model_name="nvidia/Llama-3.1-8B-Instruct-FP8"} 412.0
trtllm_e2e_request_latency_seconds_sum{engine_type="trtllm",model_name="nvidia/Llama-3.1-8B-Instruct-FP8"} 1877.2
# HELP trtllm_generation_tokens_total Cumulative number of generation (output) tokens produced.
# TYPE trtllm_generation_tokens_total counter
trtllm_generation_tokens_total{engine_type="trtllm",model_name="nvidia/Llama-3.1-8B-Instruct-FP8"} 98304.0
# HELP trtllm_kv_cache_hit_rate KV cache hit rate
# TYPE trtllm_kv_cache_hit_rate gauge
trtllm_kv_cache_hit_rate{engine_type="trtllm",model_name="nvidia/Llama-3.1-8B-Instruct-FP8"} 0.61
# HELP trtllm_kv_cache_utilization KV cache utilization
# TYPE trtllm_kv_cache_utilization gauge
trtllm_kv_cache_utilization{engine_type="trtllm",model_name="nvidia/Llama-3.1-8B-Instruct-FP8"} 0.47
# HELP trtllm_num_requests_running Number of active requests
# TYPE trtllm_num_requests_running gauge
trtllm_num_requests_running{engine_type="trtllm",model_name="nvidia/Llama-3.1-8B-Instruct-FP8"} 7.0
# HELP trtllm_num_requests_waiting Number of queued requests
# TYPE trtllm_num_requests_waiting gauge
trtllm_num_requests_waiting{engine_type="trtllm",model_name="nvidia/Llama-3.1-8B-Instruct-FP8"} 3.0
# HELP trtllm_max_num_active_requests Maximum number of active requests
# TYPE trtllm_max_num_active_requests gauge
trtllm_max_num_active_requests{engine_type="trtllm",model_name="nvidia/Llama-3.1-8B-Instruct-FP8"} 64.0
`

// tgiPage is text-generation-inference's /metrics (as its Prometheus
// exporter writes it: no labels, no HELP lines), part of it.
const tgiPage = `# TYPE tgi_request_count counter
tgi_request_count 52
# TYPE tgi_request_success counter
tgi_request_success 44
# TYPE tgi_queue_size gauge
tgi_queue_size 2
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 4
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 2048
# TYPE tgi_request_generated_tokens histogram
tgi_request_generated_tokens_bucket{le="1"} 0
tgi_request_generated_tokens_bucket{le="256"} 31
tgi_request_generated_tokens_bucket{le="+Inf"} 44
tgi_request_generated_tokens_sum 8123
tgi_request_generated_tokens_count 44
# TYPE tgi_request_input_length histogram
tgi_request_input_length_bucket{le="+Inf"} 44
tgi_request_input_length_sum 30211
tgi_request_input_length_count 44
# TYPE tgi_request_mean_time_per_token_duration histogram
tgi_request_mean_time_per_token_duration_bucket{le="0.01"} 0
tgi_request_mean_time_per_token_duration_bucket{le="+Inf"} 44
tgi_request_mean_time_per_token_duration_sum 1.1
tgi_request_mean_time_per_token_duration_count 44
`

// llamacppPage is llama.cpp's llama-server /metrics with --metrics, of a
// build that still reported its KV cache (before mid-2025): no labels.
const llamacppPage = `# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 5120
# HELP llamacpp:prompt_seconds_total Prompt process time
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 3.2
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 2048
# HELP llamacpp:tokens_predicted_seconds_total Predict process time
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total 81.9
# HELP llamacpp:n_decode_total Total number of llama_decode() calls
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 1910
# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call
# TYPE llamacpp:n_busy_slots_per_decode counter
llamacpp:n_busy_slots_per_decode 1.7
# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s.
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 1600
# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s.
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 25
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.35
# HELP llamacpp:kv_cache_tokens KV-cache tokens.
# TYPE llamacpp:kv_cache_tokens gauge
llamacpp:kv_cache_tokens 1434
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 3
`

func TestParseVLLM(t *testing.T) {
	at := time.Unix(100, 0)
	r, err := Parse([]byte(vllmPage), at)
	require.NoError(t, err)
	assert.Equal(t, Reading{At: at, Dialect: "vllm", Running: 5, Waiting: 4, KVUsage: 0.91, Tokens: 1234,
		Adapters: []string{"chat-lora", "sql-lora"}, PrefixQueries: 10000, PrefixHits: 4000, PrefixHitRate: -1,
		TokenGapSeconds: 3.5, TokenGaps: 150}, r, "the inter-token latency's current name wins over the deprecated one")

	r, err = Parse([]byte(vllmV0Page), at)
	require.NoError(t, err)
	assert.Equal(t, 0.5, r.KVUsage, "the V0 name of the KV cache usage")
	assert.Equal(t, [2]float64{1, 40}, [2]float64{r.TokenGapSeconds, r.TokenGaps}, "the time per output token of vLLM before 0.11")
	assert.Equal(t, -1.0, r.Tokens, "no token counter")
	assert.Equal(t, [3]float64{-1, -1, -1}, [3]float64{r.PrefixQueries, r.PrefixHits, r.PrefixHitRate}, "no prefix cache series")
}

// vLLM's sleep mode shows in its sleep state gauge: an engine whose
// "awake" series is 0 sleeps (either level), and one data-parallel engine
// asleep is enough. A page without the gauge (older vLLM, other engines)
// is awake.
func TestParseVLLMSleepState(t *testing.T) {
	awake0 := `vllm:engine_sleep_state{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct",sleep_state="awake"} 1.0`
	level1 := `vllm:engine_sleep_state{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct",sleep_state="weights_offloaded"} 0.0`
	awake1 := `vllm:engine_sleep_state{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct",sleep_state="awake"} 1.0`
	for _, c := range []struct {
		name   string
		edits  [][2]string
		asleep bool
	}{
		{"both awake", nil, false},
		{"engine 0 at level 2", [][2]string{{awake0, strings.Replace(awake0, "} 1.0", "} 0.0", 1)}}, true},
		{"engine 1 at level 1", [][2]string{{awake1, strings.Replace(awake1, "} 1.0", "} 0.0", 1)},
			{level1, strings.Replace(level1, "} 0.0", "} 1.0", 1)}}, true},
		{"a level without the awake series", [][2]string{{awake0, ""}, {awake1, ""}, {level1, strings.Replace(level1, "} 0.0", "} 1.0", 1)}}, false},
	} {
		page := vllmPage
		for _, e := range c.edits {
			require.Contains(t, page, e[0])
			page = strings.Replace(page, e[0], e[1], 1)
		}
		r, err := Parse([]byte(page), time.Now())
		require.NoError(t, err, c.name)
		assert.Equal(t, c.asleep, r.Asleep, c.name)
		assert.Equal(t, 5.0, r.Running, c.name)
	}
	r, err := Parse([]byte(vllmV0Page), time.Now())
	require.NoError(t, err)
	assert.False(t, r.Asleep, "no sleep state gauge")
}

func TestParseSGLang(t *testing.T) {
	r, err := Parse([]byte(sglangPage), time.Unix(1, 0))
	require.NoError(t, err)
	assert.Equal(t, "sglang", r.Dialect)
	assert.Equal(t, 12.0, r.Running)
	assert.Equal(t, 2.0, r.Waiting)
	assert.Equal(t, 0.28, r.KVUsage)
	assert.Equal(t, 7.557572e+06, r.Tokens)
	assert.Equal(t, 48.0, r.MaxRunning)
	assert.Equal(t, 0.42, r.PrefixHitRate)
	assert.Equal(t, -1.0, r.PrefixQueries)
	assert.Equal(t, [2]float64{160, 8000}, [2]float64{r.TokenGapSeconds, r.TokenGaps})
	var l Learner
	assert.Equal(t, 0.42, l.Observe(r, 0).PrefixHitRatio, "the rate SGLang reports")
	assert.Equal(t, 48.0, l.Observe(r, 0).Slots, "the batch size SGLang reports")
	assert.Equal(t, 8.0, l.Observe(r, 8).Slots, "max_inflight wins")
}

func TestParseTRTLLM(t *testing.T) {
	at := time.Unix(9, 0)
	r, err := Parse([]byte(trtllmPage), at)
	require.NoError(t, err)
	assert.Equal(t, Reading{At: at, Dialect: "trtllm", Running: 7, Waiting: 3, KVUsage: 0.47, Tokens: 98304, MaxRunning: 64,
		PrefixQueries: -1, PrefixHits: -1, PrefixHitRate: 0.61, TokenGapSeconds: -1, TokenGaps: -1}, r)
	var l Learner
	st := l.Observe(r, 0)
	assert.Equal(t, 64.0, st.Slots, "the most requests it keeps active")
	assert.Equal(t, 0.61, st.PrefixHitRatio)
	// Without iteration stats (enable_iter_perf_stats off) it reports no
	// load: the worker is routed on the router's own signals.
	var requestsOnly strings.Builder
	for _, line := range strings.SplitAfter(trtllmPage, "\n") {
		if strings.Contains(line, "trtllm_request_success_total") || strings.Contains(line, "trtllm_generation_tokens_total") {
			requestsOnly.WriteString(line)
		}
	}
	_, err = Parse([]byte(requestsOnly.String()), at)
	assert.ErrorIs(t, err, ErrNoLoadSeries)
	_, err = Parse([]byte(strings.Replace(trtllmPage, "} 64.0", "} 1e300", 1)), at)
	assert.ErrorContains(t, err, "trtllm_max_num_active_requests is 1e+300; want a count of requests")
}

func TestParseTGI(t *testing.T) {
	at := time.Unix(11, 0)
	r, err := Parse([]byte(tgiPage), at)
	require.NoError(t, err)
	assert.Equal(t, Reading{At: at, Dialect: "tgi", Running: 4, Waiting: 2, Tokens: 8123,
		PrefixQueries: -1, PrefixHits: -1, PrefixHitRate: -1, TokenGapSeconds: 1.1, TokenGaps: 44}, r)
	_, err = Parse([]byte(strings.Replace(tgiPage, "_sum 8123", "_sum -1", 1)), at)
	assert.ErrorContains(t, err, "tgi_request_generated_tokens_sum is -1; want a counter's value")
	_, err = Parse([]byte(strings.Replace(tgiPage, "_duration_count 44", "_duration_count NaN", 1)), at)
	assert.ErrorContains(t, err, "tgi_request_mean_time_per_token_duration_count is NaN; want a histogram's sum or count")
}

func TestParseLlamaCpp(t *testing.T) {
	at := time.Unix(7, 0)
	r, err := Parse([]byte(llamacppPage), at)
	require.NoError(t, err)
	assert.Equal(t, Reading{At: at, Dialect: "llamacpp", Running: 2, Waiting: 3, KVUsage: 0.35, Tokens: 2048,
		PrefixQueries: -1, PrefixHits: -1, PrefixHitRate: -1, TokenGapSeconds: -1, TokenGaps: -1}, r)
	// Recent builds report no KV cache series.
	recent := strings.Replace(llamacppPage, "llamacpp:kv_cache_usage_ratio 0.35", "", 1)
	r, err = Parse([]byte(recent), at)
	require.NoError(t, err)
	assert.Zero(t, r.KVUsage)
	assert.Equal(t, 2.0, r.Running)
	_, err = Parse([]byte(strings.Replace(llamacppPage, "llamacpp:requests_deferred 3", "llamacpp:requests_deferred -3", 1)), at)
	assert.ErrorContains(t, err, "llamacpp:requests_deferred is -3; want a count of requests")
}

func TestParseRefusesPagesWithoutLoad(t *testing.T) {
	_, err := Parse([]byte("# TYPE up gauge\nup 1\n"), time.Now())
	assert.ErrorIs(t, err, ErrNoLoadSeries)
	_, err = Parse([]byte("vllm:num_requests_running{ 3\n"), time.Now())
	assert.Error(t, err, "malformed text")
}

// A value no engine reports fails the reading, named: the worker is then
// routed on the router's own signals (and says why in GET /workers)
// instead of keeping a batch size of NaN or 1e300 in what it learned.
func TestParseRefusesValuesNoEngineReports(t *testing.T) {
	vllmRunning := `vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0`
	vllmTokens := `vllm:generation_tokens_total{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 234.0`
	vllmKV := `vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.91`
	vllmHits := `vllm:prefix_cache_hits_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3000.0`
	vllmAwake := `vllm:engine_sleep_state{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct",sleep_state="awake"} 1.0`
	sgWaiting := `sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0`
	sgMax := `sglang:max_running_requests{model_name="meta-llama/Llama-3.1-8B-Instruct"} 48.0`
	sgRate := `sglang:cache_hit_rate{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.42`
	for _, c := range []struct{ page, line, value, want string }{
		{vllmPage, vllmRunning, "NaN", "vllm:num_requests_running is NaN; want a count of requests, 0 to 1048576"},
		{vllmPage, vllmRunning, "+Inf", "vllm:num_requests_running is +Inf; want a count of requests"},
		{vllmPage, vllmRunning, "-1", "vllm:num_requests_running is -1; want a count of requests"},
		{vllmPage, vllmRunning, "1e300", "vllm:num_requests_running is 1e+300; want a count of requests"},
		{vllmPage, vllmTokens, "-Inf", "vllm:generation_tokens_total is -Inf; want a counter's value, 0 or more"},
		{vllmPage, vllmTokens, "-5", "vllm:generation_tokens_total is -5; want a counter's value"},
		{vllmPage, vllmKV, "NaN", "vllm:kv_cache_usage_perc is NaN; want a number"},
		{vllmPage, vllmHits, "NaN", "vllm:prefix_cache_hits_total is NaN; want a counter's value"},
		{vllmPage, vllmAwake, "NaN", "vllm:engine_sleep_state is NaN; want 0 or 1"},
		{vllmPage, vllmAwake, "2", "vllm:engine_sleep_state is 2; want 0 or 1"},
		{sglangPage, sgWaiting, "Inf", "sglang:num_queue_reqs is +Inf; want a count of requests"},
		{sglangPage, sgMax, "5e18", "sglang:max_running_requests is 5e+18; want a count of requests"},
		{sglangPage, sgRate, "NaN", "sglang:cache_hit_rate is NaN; want a number"},
	} {
		require.Contains(t, c.page, c.line)
		name, _, _ := strings.Cut(c.line, " ")
		page := strings.Replace(c.page, c.line, name+" "+c.value, 1)
		_, err := Parse([]byte(page), time.Now())
		require.Error(t, err, "%s %s", name, c.value)
		assert.Contains(t, err.Error(), c.want)
	}
	// The bounds themselves are values engines report.
	page := strings.Replace(sglangPage, sgMax, "sglang:max_running_requests 1048576", 1)
	page = strings.Replace(page, sgWaiting, "sglang:num_queue_reqs 0", 1)
	r, err := Parse([]byte(page), time.Now())
	require.NoError(t, err)
	assert.Equal(t, 1048576.0, r.MaxRunning)
}

// bigVLLMPage is vllmPage amid what else a vLLM server of two data-parallel
// engines exports: a dozen more histograms of 20 buckets, process and
// Python metrics, a plain comment and blank lines.
func bigVLLMPage() string {
	var b strings.Builder
	b.WriteString("# a comment\n\n" + vllmPage)
	for _, h := range []string{"e2e_request_latency_seconds", "request_queue_time_seconds",
		"request_inference_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds", "request_prompt_tokens",
		"request_generation_tokens", "iteration_tokens_total", "request_max_num_generation_tokens", "request_params_n",
		"request_params_max_tokens", "request_time_per_output_token_seconds"} {
		fmt.Fprintf(&b, "# HELP vllm:%s A histogram.\n# TYPE vllm:%s histogram\n", h, h)
		for e := range 2 {
			labels := fmt.Sprintf(`engine="%d",model_name="meta-llama/Llama-3.1-8B-Instruct"`, e)
			for i := range 20 {
				fmt.Fprintf(&b, "vllm:%s_bucket{%s,le=\"%g\"} %d.0\n", h, labels, 0.001*float64(int(1)<<i), i)
			}
			fmt.Fprintf(&b, "vllm:%s_bucket{%s,le=\"+Inf\"} 20.0\nvllm:%s_count{%s} 20.0\nvllm:%s_sum{%s} 3.5\n", h, labels, h, labels, h, labels)
		}
	}
	for _, m := range []string{"process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds", "python_gc_objects_collected_total"} {
		fmt.Fprintf(&b, "# HELP %s A process metric.\n# TYPE %s gauge\n%s 12.5\n\n", m, m, m)
	}
	return b.String()
}

// Only the lines of the series Parse reads reach the text parser: a full
// vLLM page gives the reading its load series alone give, and most of it
// is skipped. A sample whose name is quoted is left to the parser.
func TestParseReadsOnlyTheSeriesItNeeds(t *testing.T) {
	page := bigVLLMPage()
	at := time.Unix(100, 0)
	r, err := Parse([]byte(page), at)
	require.NoError(t, err)
	alone, err := Parse([]byte(vllmPage), at)
	require.NoError(t, err)
	assert.Equal(t, alone, r)

	kept := string(keepRead([]byte(page)))
	assert.Less(t, len(kept)*10, len(page), "under a tenth of the page reaches the parser")
	for _, l := range strings.SplitAfter(kept, "\n") {
		if l != "" {
			name, ok := seriesOf([]byte(l))
			assert.True(t, ok && read[string(name)], "kept: %q", l)
		}
	}

	for line, want := range map[string]string{"#  TYPE b gauge": "b",
		` c{x="y"} 1` + "\n": "c", "d 1\r\n": "d", "e": "e"} {
		name, ok := seriesOf([]byte(line))
		assert.True(t, ok, line)
		assert.Equal(t, want, string(name), line)
	}
	name, ok := seriesOf([]byte(`{"vllm:num_requests_running"} 1`))
	assert.True(t, ok && name == nil, "a quoted name: kept")
	for _, line := range []string{"# a comment\n", "#\n", "\n", "  \n", "# HELP\n", "# HELP vllm:num_requests_running Help.\n"} {
		_, ok := seriesOf([]byte(line))
		assert.False(t, ok, "%q", line)
	}
}

// BenchmarkParseVLLMPage parses a full page of a two-engine vLLM server
// (bigVLLMPage), as the scraper does every interval for every engine.
func BenchmarkParseVLLMPage(b *testing.B) {
	page := bigVLLMPage()
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	body := make([]byte, len(page)) // a scrape's answer, which Parse edits
	for b.Loop() {
		copy(body, page)
		if _, err := Parse(body, time.Time{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseUnchangedVLLMPage reads the page of BenchmarkParseVLLMPage
// as a scrape does when it is the last one again (an idle engine's): its
// lines of the series read are compared, not parsed.
func BenchmarkParseUnchangedVLLMPage(b *testing.B) {
	page := []byte(bigVLLMPage())
	var st target
	if _, err := st.parse(slices.Clone(page), time.Time{}); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	body := make([]byte, len(page))
	for b.Loop() {
		copy(body, page)
		if _, err := st.parse(body, time.Time{}); err != nil {
			b.Fatal(err)
		}
	}
}

func TestLearnerLearnsSpeedAndSlots(t *testing.T) {
	var l Learner
	t0 := time.Unix(1000, 0)
	// 4 requests running, 200 tokens a second between them: 50 tokens/s each.
	var st Stats
	for i := 0; i <= 40; i++ {
		st = l.Observe(Reading{At: t0.Add(time.Duration(i) * 50 * time.Millisecond), Running: 4, Tokens: float64(i * 10)}, 0)
	}
	assert.InDelta(t, 50, st.TokenRate, 0.01)
	assert.Equal(t, 4.0, st.Slots)
	assert.InDelta(t, 200, st.Capacity(), 0.1)
	assert.Equal(t, 7.0, l.Observe(Reading{At: t0.Add(3 * time.Second), Running: 7, Tokens: 400}, 0).Slots, "slots grow with what is seen")
	assert.Equal(t, 16.0, l.Observe(Reading{At: t0.Add(4 * time.Second), Running: 7, Tokens: 400}, 16).Slots, "max_inflight wins")

	restarted := l.Observe(Reading{At: t0.Add(5 * time.Second), Running: 1, Tokens: 3}, 0)
	assert.InDelta(t, 50, restarted.TokenRate, 5, "a counter that went back (engine restart) keeps the learned speed")
}

// An engine's inter-token latency histogram prices it from its first
// reading, before the router learned its speed (at a start, a join, or
// while it was idle): its tokens per second per running request are the
// gaps' count over their time. The first learned sample replaces it.
func TestAnEnginesOwnTokenGapsGiveItsSpeedUntilLearned(t *testing.T) {
	var l Learner
	t0 := time.Unix(1000, 0)
	// 400 gaps in 8 s of a life: 50 tokens a second per running request.
	st := l.Observe(Reading{At: t0, Running: 4, Tokens: 1000, TokenGapSeconds: 8, TokenGaps: 400}, 0)
	assert.InDelta(t, 50, st.TokenRate, 1e-9)
	assert.True(t, st.RateFromGaps)
	assert.InDelta(t, 200, st.Capacity(), 1e-9, "priced at once: 4 slots seen")

	var fresh Learner
	for _, r := range []Reading{
		{At: t0, Running: 4, Tokens: 1000, TokenGapSeconds: -1, TokenGaps: -1}, // not exported
		{At: t0, Running: 1, Tokens: 0, TokenGapSeconds: 0, TokenGaps: 0},      // a fresh engine
		{At: t0, Running: 1, Tokens: 9, TokenGapSeconds: 0, TokenGaps: 8},      // gaps of no time: no speed
	} {
		st := fresh.Observe(r, 0)
		assert.Zero(t, st.TokenRate, "%+v", r)
		assert.False(t, st.RateFromGaps)
	}

	// A second of 4 running at 30 tokens a second each: the learned
	// speed replaces the engine's own mean, not blended with it.
	for i := 1; i <= 20; i++ {
		gaps := 400 + float64(i)*6
		st = l.Observe(Reading{At: t0.Add(time.Duration(i) * 50 * time.Millisecond), Running: 4, Tokens: 1000 + float64(i)*6,
			TokenGapSeconds: 8 + float64(i)*0.2, TokenGaps: gaps}, 0)
	}
	assert.InDelta(t, 30, st.TokenRate, 0.01)
	assert.False(t, st.RateFromGaps)
}

// StillFor is how long the engine has run requests with its token
// counter unmoved: from the first such reading, until the counter moves
// (or goes back: a restart), nothing runs, or no counter is reported.
func TestLearnerTimesAnEngineThatRunsAndGeneratesNothing(t *testing.T) {
	var l Learner
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	for _, c := range []struct {
		ms      int
		running float64
		tokens  float64
		still   time.Duration
	}{
		{0, 0, 100, 0},                          // idle
		{50, 2, 100, 0},                         // running from here
		{100, 2, 100, 50 * time.Millisecond},    // nothing generated
		{1050, 2, 100, 1000 * time.Millisecond}, // still nothing
		{1100, 2, 110, 0},                       // it generated
		{1150, 2, 110, 50 * time.Millisecond},
		{1200, 0, 110, 0}, // it ran out
		{1250, 1, 110, 0},
		{1300, 1, 110, 50 * time.Millisecond},
		{1350, 1, -1, 0}, // no counter
		{1400, 1, 5, 0},  // a restart's counter
		{1450, 1, 5, 50 * time.Millisecond},
	} {
		st := l.Observe(Reading{At: at(c.ms), Running: c.running, Tokens: c.tokens}, 0)
		assert.Equal(t, c.still, st.StillFor, "at %d ms", c.ms)
		assert.False(t, st.Stalled, "the scraper sets it")
	}
}

// vLLM's prefix cache counters give the hit ratio of the last window of a
// second or more in which they moved.
func TestLearnerLearnsThePrefixCacheHitRatio(t *testing.T) {
	var l Learner
	t0 := time.Unix(1000, 0)
	reading := func(ms int, queries, hits float64) Reading {
		return Reading{At: t0.Add(time.Duration(ms) * time.Millisecond), Running: 1, Tokens: -1,
			PrefixQueries: queries, PrefixHits: hits, PrefixHitRate: -1}
	}
	assert.Equal(t, -1.0, l.Observe(reading(0, 1000, 100), 0).PrefixHitRatio, "one reading: unknown")
	assert.Equal(t, -1.0, l.Observe(reading(500, 1500, 400), 0).PrefixHitRatio, "half a second: still unknown")
	assert.InDelta(t, 0.6, l.Observe(reading(1000, 2000, 700), 0).PrefixHitRatio, 1e-9, "600 of 1000 tokens found over the second")
	assert.InDelta(t, 0.6, l.Observe(reading(2500, 2000, 700), 0).PrefixHitRatio, 1e-9, "no query since: the last window's")
	assert.InDelta(t, 0.1, l.Observe(reading(3000, 3000, 800), 0).PrefixHitRatio, 1e-9, "a window ends once queries move")
	assert.InDelta(t, 0.1, l.Observe(reading(3500, 10, 0), 0).PrefixHitRatio, 1e-9, "a restart starts a window and keeps the ratio")
	assert.InDelta(t, 1.0, l.Observe(reading(4600, 110, 100), 0).PrefixHitRatio, 1e-9)
	assert.Equal(t, -1.0, new(Learner).Observe(Reading{At: t0, PrefixQueries: -1, PrefixHitRate: -1}, 0).PrefixHitRatio, "no series: unknown")
}

func TestLearnerAdmitsTwoBatchesOnceTheBatchSizeIsKnown(t *testing.T) {
	var l Learner
	t0 := time.Unix(1000, 0)
	st := l.Observe(Reading{At: t0, Running: 5}, 0)
	assert.Zero(t, st.Admit, "five running says nothing of the batch size")
	st = l.Observe(Reading{At: t0.Add(time.Second), Running: 6, Waiting: 3}, 0)
	assert.Zero(t, st.Admit, "one reading of a queue may be requests the next step admits")
	st = l.Observe(Reading{At: t0.Add(2 * time.Second), Running: 8, Waiting: 3}, 0)
	assert.Zero(t, st.Admit, "the queue moved: still ramping")
	st = l.Observe(Reading{At: t0.Add(3 * time.Second), Running: 8, Waiting: 2}, 0)
	assert.EqualValues(t, 16, st.Admit, "a queue stayed behind eight running: the batch is eight")
	st = l.Observe(Reading{At: t0.Add(4 * time.Second), Running: 2}, 0)
	assert.EqualValues(t, 16, st.Admit, "learned once, kept")

	var sg Learner
	assert.EqualValues(t, 64, sg.Observe(Reading{At: t0, MaxRunning: 32}, 0).Admit, "SGLang says its batch size")
	var fixed Learner
	assert.EqualValues(t, 6, fixed.Observe(Reading{At: t0}, 3).Admit, "max_inflight is the batch size")
}

func TestCost(t *testing.T) {
	st := Stats{Reading: Reading{Running: 3, Waiting: 2}, Slots: 4, TokenRate: 10}
	_, ok := st.Cost(5)
	assert.False(t, ok, "not prepared")
	st.Prepare(5)
	c, ok := st.Cost(5)
	require.True(t, ok)
	assert.InDelta(t, 6.0/40, c, 1e-9, "(3 running + 2 waiting + 1) / (4 slots × 10 tokens/s)")
	c, _ = st.Cost(8)
	assert.InDelta(t, 9.0/40, c, 1e-9, "three dispatched since the reading")
	c, _ = st.Cost(0)
	assert.InDelta(t, 1.0/40, c, 1e-9, "completions since the reading; never below empty")
	transit := Stats{Reading: Reading{Running: 1}, Slots: 4, TokenRate: 10}
	transit.Prepare(3)
	c, _ = transit.Cost(3)
	assert.InDelta(t, 4.0/40, c, 1e-9, "two of the router's three not taken in yet by the engine: all three count")
	ended := Stats{Reading: Reading{Running: 1}, Slots: 4, TokenRate: 10, Occupancy: 1}
	ended.Prepare(0)
	c, _ = ended.Cost(0)
	assert.InDelta(t, 1.0/40, c, 1e-9, "the router's one request as the scrape left, ended as it came back: no one else's, idle")
	st.KVUsage = 0.9
	st.Prepare(5)
	c, _ = st.Cost(5)
	assert.InDelta(t, 3*6.0/40, c, 1e-9, "a cache 90% full triples the cost")
	unknown := Stats{Slots: 4}
	unknown.Prepare(0)
	_, ok = unknown.Cost(0)
	assert.False(t, ok, "no cost before the speed is learned")

	joined := Stats{Reading: Reading{Running: 3, Waiting: 2, KVUsage: 0.9}, Slots: 4, StandIn: 200}
	joined.Prepare(5)
	c, ok = joined.Cost(6)
	require.True(t, ok, "priced at its stand-in capacity")
	assert.InDelta(t, 3*7.0/200, c, 1e-9, "its queue, the router's one more and one, over the stand-in, the cache's penalty kept")
	joined.TokenRate = 10
	joined.Prepare(5)
	c, _ = joined.Cost(5)
	assert.InDelta(t, 3*6.0/40, c, 1e-9, "once learned, its own capacity")
}

// sink collects what the scraper publishes.
type sink struct {
	mu   sync.Mutex
	last map[uint64]*Stats
	seen map[uint64]int
}

func (s *sink) publish(id uint64, st *Stats) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last[id] = st
	s.seen[id]++
}

func (s *sink) get(id uint64) (*Stats, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last[id], s.seen[id]
}

func TestScraperAgainstSimulatedEngines(t *testing.T) {
	busy, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: 1, Tokens: 100000,
		Engine: mockworker.EngineOptions{MaxNumSeqs: 2, InterTokenLatency: 2 * time.Millisecond}})
	require.NoError(t, err)
	defer busy.Close()
	sg, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: 2, MetricsDialect: "sglang", Engine: mockworker.EngineOptions{MaxNumSeqs: 2}})
	require.NoError(t, err)
	plain, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: 3})
	require.NoError(t, err)
	defer plain.Close()
	llama, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: 4, MetricsDialect: "llamacpp"})
	require.NoError(t, err)
	defer llama.Close()
	trt, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: 5, MetricsDialect: "trtllm", Engine: mockworker.EngineOptions{MaxNumSeqs: 6}})
	require.NoError(t, err)
	defer trt.Close()
	tgi, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: 6, MetricsDialect: "tgi"})
	require.NoError(t, err)
	defer tgi.Close()

	// Three long requests: two run, one waits.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := 0; i < 3; i++ {
		go func() {
			if resp, err := post(ctx, busy.URL()+"/v1/completions", `{"prompt":"x","max_tokens":20000}`); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	sc, s := scraping(t, Options{Interval: 20 * time.Millisecond, Timeout: 200 * time.Millisecond, Targets: func() []Target {
		return []Target{{ID: 1, URL: busy.URL() + "/metrics"}, {ID: 2, URL: sg.URL() + "/metrics"}, {ID: 3, URL: plain.URL() + "/nope"},
			{ID: 4, URL: llama.URL() + "/metrics"}, {ID: 5, URL: trt.URL() + "/metrics"},
			{ID: 6, URL: tgi.URL() + "/metrics"}}
	}})

	// reading waits for a reading of engine id that ok accepts and returns
	// it (read once after the wait, a reading could be withdrawn as stale
	// meanwhile on a loaded machine).
	reading := func(id uint64, ok func(*Stats) bool, msg string) *Stats {
		t.Helper()
		var st *Stats
		require.Eventually(t, func() bool { st, _ = s.get(id); return st != nil && ok(st) }, 5*time.Second, 10*time.Millisecond, msg)
		return st
	}
	anyReading := func(*Stats) bool { return true }
	st := reading(1, func(st *Stats) bool { return st.Running == 2 && st.Waiting == 1 && st.TokenRate > 0 },
		"queue seen and speed learned over loopback")
	// Two running at a 2 ms step: at most 500 tokens/s each, less with timer
	// slack, and half that or less on a loaded machine (seen at 196 with
	// three busy loops beside this test under -race), which slows the engine
	// itself.
	assert.LessOrEqual(t, st.TokenRate, 550.0)
	assert.Greater(t, st.TokenRate, 50.0)
	assert.Equal(t, 2.0, st.Slots)
	st2 := reading(2, anyReading, "sglang read")
	assert.Equal(t, "sglang", st2.Dialect)
	assert.Equal(t, 2.0, st2.Slots, "from sglang:max_running_requests")
	st4 := reading(4, anyReading, "llama.cpp read")
	assert.Equal(t, "llamacpp", st4.Dialect)
	info4 := map[string]any{}
	sc.Describe(4, info4)
	assert.Equal(t, "llamacpp", info4["engine_source"])
	st5 := reading(5, anyReading, "trtllm-serve read")
	assert.Equal(t, "trtllm", st5.Dialect)
	assert.Equal(t, 6.0, st5.Slots, "from trtllm_max_num_active_requests")
	st6 := reading(6, anyReading, "TGI read")
	assert.Equal(t, "tgi", st6.Dialect)

	info := map[string]any{}
	sc.Describe(3, info)
	assert.Equal(t, "none", info["engine_source"])
	assert.Contains(t, info["engine_reason"], "status 404")

	// The SGLang engine goes away: its reading is withdrawn after 3 intervals.
	require.NoError(t, sg.Close())
	require.Eventually(t, func() bool {
		st, n := s.get(2)
		return st == nil && n > 1
	}, 5*time.Second, 10*time.Millisecond, "a stale reading is withdrawn (nil published)")
	info = map[string]any{}
	sc.Describe(2, info)
	assert.Equal(t, "none", info["engine_source"])
	// (The counts of readings lost are checked apart: on a loaded machine a
	// scrape of the busy engine may take longer than 3 intervals of 20 ms,
	// and its reading then goes stale and comes back, counted each time.)
}

// A worker whose metrics page never answers is counted once as having
// lost its engine reading, not once per scrape; one whose reading goes
// stale is counted again.
func TestScraperCountsEachLossOfAReadingOnce(t *testing.T) {
	plain, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: 3})
	require.NoError(t, err)
	defer plain.Close()
	vllm, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: 1})
	require.NoError(t, err)
	defer vllm.Close()
	targets := atomic.Pointer[[]Target]{}
	targets.Store(&[]Target{{ID: 3, URL: plain.URL() + "/nope"}})
	// 100 ms apart, a reading goes stale after 300 ms without a scrape:
	// more than a loaded machine takes for one over loopback.
	sc, s := scraping(t, Options{Interval: 100 * time.Millisecond, Timeout: time.Second, Targets: func() []Target { return *targets.Load() }})
	require.Eventually(t, func() bool {
		info := map[string]any{}
		sc.Describe(3, info)
		return info["engine_reason"] != nil && info["engine_reason"] != "no reading yet"
	}, 5*time.Second, 10*time.Millisecond)
	time.Sleep(time.Second) // ten intervals, ten failed scrapes
	st, n := s.get(3)
	assert.Nil(t, st)
	assert.Positive(t, n, "a failed scrape before any reading publishes nil: what stood in for one goes")
	fallbacks, without := sc.Counts()
	assert.EqualValues(t, 1, fallbacks, "the worker without metrics, counted once")
	assert.Equal(t, 1, without)

	// A second worker reads, then goes: counted once more.
	targets.Store(&[]Target{{ID: 3, URL: plain.URL() + "/nope"}, {ID: 1, URL: vllm.URL() + "/metrics"}})
	require.Eventually(t, func() bool { st, _ := s.get(1); return st != nil }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, vllm.Close())
	require.Eventually(t, func() bool { st, n := s.get(1); return st == nil && n > 1 }, 5*time.Second, 10*time.Millisecond)
	fallbacks, without = sc.Counts()
	assert.EqualValues(t, 2, fallbacks)
	assert.Equal(t, 2, without)
}

// A reading that said its engine sleeps is held past staleness (a sleeping
// engine's health answers 200: withdrawn, it put the worker back in
// rotation), for AsleepHeldFor intervals; an awake engine's goes at
// StaleAfter.
func TestAnAsleepReadingIsHeldWhenItsScrapesFail(t *testing.T) {
	asleep, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: 1})
	require.NoError(t, err)
	defer asleep.Close()
	awake, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: 2})
	require.NoError(t, err)
	defer awake.Close()
	resp, err := post(context.Background(), asleep.URL()+"/sleep?level=1", "")
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode)

	const interval = 20 * time.Millisecond // stale after 60 ms, held asleep for 2 s
	sc, s := scraping(t, Options{Interval: interval, Timeout: time.Second, Targets: func() []Target {
		return []Target{{ID: 1, URL: asleep.URL() + "/metrics"}, {ID: 2, URL: awake.URL() + "/metrics"}}
	}})
	require.Eventually(t, func() bool {
		st1, _ := s.get(1)
		st2, _ := s.get(2)
		return st1 != nil && st1.Asleep && st2 != nil && !st2.Asleep
	}, 5*time.Second, 10*time.Millisecond)

	require.NoError(t, asleep.Close())
	require.NoError(t, awake.Close())
	require.Eventually(t, func() bool { st, _ := s.get(2); return st == nil }, 5*time.Second, 5*time.Millisecond,
		"the awake engine's reading goes stale and is withdrawn")
	time.Sleep(10 * interval)
	st, _ := s.get(1)
	require.NotNil(t, st, "the asleep engine's reading is held past staleness")
	assert.True(t, st.Asleep)
	info := map[string]any{}
	sc.Describe(1, info)
	assert.Contains(t, info["engine_reason"], "connection refused", "why it is not fresh: its scrapes fail")
	assert.Greater(t, info["engine_age_seconds"], (StaleAfter * interval).Seconds())
	require.Eventually(t, func() bool { st, _ := s.get(1); return st == nil }, 10*time.Second, 10*time.Millisecond,
		"withdrawn after AsleepHeldFor intervals: its health probes judge it then")
	info = map[string]any{}
	sc.Describe(1, info)
	assert.Equal(t, "none", info["engine_source"])
}

func post(ctx context.Context, url, body string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	return http.DefaultClient.Do(req)
}

// slowPage serves vllmPage delay after each request (one that gives up
// ends it), counting them in requests (nil: not counted), and returns its
// URL.
func slowPage(t *testing.T, delay, requests *atomic.Int64) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if requests != nil {
			requests.Add(1)
		}
		select {
		case <-time.After(time.Duration(delay.Load())):
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, vllmPage)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/metrics"
}

// one is the targets of a Scraper of one engine, id 1, at url.
func one(url string) func() []Target {
	return func() []Target { return []Target{{ID: 1, URL: url}} }
}

// scraping runs a Scraper of o (logs discarded), publishing to the sink
// it returns, until the test ends.
func scraping(t *testing.T, o Options) (*Scraper, *sink) {
	s := &sink{last: map[uint64]*Stats{}, seen: map[uint64]int{}}
	o.Logger, o.Publish = slog.New(slog.NewTextHandler(io.Discard, nil)), s.publish
	sc := New(o)
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { sc.Run(runCtx); close(done) }()
	t.Cleanup(func() { stop(); <-done })
	return sc, s
}

// An engine that answers its metrics page more slowly than a reading stays
// fresh (busy, within the scrape's timeout) keeps its reading between two
// scrapes instead of losing it each time; one whose scrape times out loses
// it.
func TestASlowMetricsPageKeepsItsReading(t *testing.T) {
	var delay atomic.Int64
	delay.Store(int64(300 * time.Millisecond))
	// Fresh for 3 intervals of 50 ms; a scrape takes 300 ms. (A tick held
	// back over 150 ms past a scrape's end would still withdraw it.)
	_, s := scraping(t, Options{Interval: 50 * time.Millisecond, Timeout: time.Second, Targets: one(slowPage(t, &delay, nil))})
	require.Eventually(t, func() bool { st, _ := s.get(1); return st != nil }, 5*time.Second, 5*time.Millisecond)
	withdrawn := 0
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
		if st, _ := s.get(1); st == nil {
			withdrawn++
		}
	}
	_, published := s.get(1)
	assert.Zero(t, withdrawn, "the reading stays while the next scrape is under way")
	assert.GreaterOrEqual(t, published, 4, "a reading about every 300 ms")

	delay.Store(int64(time.Hour)) // past the scrape's timeout
	require.Eventually(t, func() bool { st, _ := s.get(1); return st == nil }, 5*time.Second, 5*time.Millisecond,
		"a scrape that timed out leaves the reading to go")
}

// SetTiming applies a new interval at once (the next tick one new
// interval from then, not after the old interval's wait) and a new
// timeout, longer or shorter, to the next scrape: the client's own read
// timeout with it.
func TestSetTimingAppliesToTheNextScrape(t *testing.T) {
	var delay, scrapes atomic.Int64
	sc, s := scraping(t, Options{Interval: time.Hour, Timeout: 100 * time.Millisecond, Targets: one(slowPage(t, &delay, &scrapes))})
	require.Eventually(t, func() bool { st, _ := s.get(1); return st != nil }, 5*time.Second, 5*time.Millisecond, "the first tick")

	sc.SetTiming(20*time.Millisecond, 100*time.Millisecond)
	require.Eventually(t, func() bool { return scrapes.Load() >= 4 }, 5*time.Second, 5*time.Millisecond,
		"ticks every 20 ms from now, not an hour after the first")

	delay.Store(int64(300 * time.Millisecond)) // past the timeout of 100 ms
	require.Eventually(t, func() bool { st, _ := s.get(1); return st == nil }, 5*time.Second, 5*time.Millisecond,
		"its scrapes time out, and the reading goes stale after three intervals of 20 ms")
	sc.SetTiming(20*time.Millisecond, 2*time.Second)
	require.Eventually(t, func() bool { st, _ := s.get(1); return st != nil }, 5*time.Second, 5*time.Millisecond,
		"within the new timeout (the client's own read timeout too: the start's 100 ms would cut it)")
}

// A worker whose engine says it gives no metrics (its page answers 404 or
// 501, or holds no engine's load series) is read by the router itself:
// its requests in flight and the tokens relayed from it, from which its
// speed is learned. An engine that fails otherwise (a 500, a refused
// connection) is not: its health judges it.
func TestAWorkerWithoutMetricsIsReadByTheRouter(t *testing.T) {
	var metricsOn atomic.Bool // the engine behind /later restarted with its metrics
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/later":
			if metricsOn.Load() {
				_, _ = io.WriteString(w, vllmPage)
				return
			}
			http.NotFound(w, r)
		case "/404":
			http.NotFound(w, r)
		case "/501":
			http.Error(w, "This server does not support metrics endpoint. Start it with `--metrics`", http.StatusNotImplemented)
		case "/other":
			_, _ = io.WriteString(w, "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 12\n")
		default:
			http.Error(w, "broken", http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	refused := httptest.NewServer(http.NotFoundHandler())
	refused.Close()

	// Worker 1 has 2 requests in flight and relays 100 tokens every
	// 10 ms: 10,000 tokens a second, 5,000 a request. The others have 2
	// in flight and relay none.
	var tokens atomic.Uint64
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	go func() {
		for range tick.C {
			tokens.Add(100)
		}
	}()
	generating := func() RelayedCounts { return RelayedCounts{InFlight: 2, Tokens: tokens.Load()} }
	still := func() RelayedCounts { return RelayedCounts{InFlight: 2, Tokens: 7} }
	targets := []Target{
		{ID: 1, URL: srv.URL + "/404", Relayed: generating},
		{ID: 2, URL: srv.URL + "/501", Relayed: still},
		{ID: 3, URL: srv.URL + "/other", Relayed: still},
		{ID: 4, URL: srv.URL + "/500", Relayed: still},
		{ID: 5, URL: refused.URL + "/metrics", Relayed: still},
		{ID: 6, URL: srv.URL + "/404"}, // nothing relayed to read
		{ID: 7, URL: srv.URL + "/later", Relayed: still},
	}
	sc, s := scraping(t, Options{Interval: 50 * time.Millisecond, Timeout: time.Second, Targets: func() []Target { return targets }, StallAfter: 100 * time.Millisecond})

	require.Eventually(t, func() bool { st, _ := s.get(1); return st != nil && st.TokenRate > 0 }, 5*time.Second, 10*time.Millisecond,
		"a speed learned from the relayed tokens over a window of a second")
	st, _ := s.get(1)
	assert.Equal(t, DialectRouter, st.Dialect)
	assert.InDelta(t, 2.0, st.Running, 1e-9, "its requests in flight")
	assert.Zero(t, st.Waiting)
	assert.InEpsilon(t, 5000.0, st.TokenRate, 0.3, "tokens a second per request in flight")
	assert.InDelta(t, 2.0, st.Slots, 1e-9, "the most requests seen in flight")
	assert.Zero(t, st.Admit, "its batch size is not known")
	for _, id := range []uint64{2, 3} {
		st, n := s.get(id)
		require.NotNil(t, st, "worker %d", id)
		assert.Positive(t, n)
		assert.Equal(t, DialectRouter, st.Dialect, "worker %d", id)
		assert.Zero(t, st.StillFor, "worker %d: a non-streamed answer's tokens count once it ended", id)
		assert.False(t, st.Stalled, "worker %d: past stall_after with requests in flight and no token relayed, not stalled", id)
		assert.Zero(t, st.TokenRate, "worker %d: nothing relayed, no speed", id)
	}
	for _, id := range []uint64{4, 5, 6} {
		st, n := s.get(id)
		assert.Nil(t, st, "worker %d", id)
		assert.Positive(t, n, "worker %d: its failed scrapes publish nil", id)
	}
	info := map[string]any{}
	sc.Describe(1, info)
	assert.Equal(t, DialectRouter, info["engine_source"])
	assert.Contains(t, info["engine_reason"], "status 404", "why the router reads it itself")
	assert.NotContains(t, info, "engine_kv_usage", "unseen")
	info = map[string]any{}
	sc.Describe(3, info)
	assert.Equal(t, ErrNoLoadSeries.Error(), info["engine_reason"])
	info = map[string]any{}
	sc.Describe(4, info)
	assert.Equal(t, "none", info["engine_source"])
	assert.Contains(t, info["engine_reason"], "status 500")
	_, without := sc.Counts()
	assert.Equal(t, 7, without, "the router's own readings are no engine's")

	// Its engine's metrics back (a restart with them on): its own
	// readings replace the router's.
	st, _ = s.get(7)
	require.NotNil(t, st)
	assert.Equal(t, DialectRouter, st.Dialect)
	metricsOn.Store(true)
	require.Eventually(t, func() bool { st, _ := s.get(7); return st != nil && st.Dialect == "vllm" }, 5*time.Second, 10*time.Millisecond)
	_, without = sc.Counts()
	assert.Equal(t, 6, without)
}

// A reading is stamped with the router's requests in flight as its scrape
// left: a request that ends while the engine writes its page, still
// counted there, is the router's, not another client's. Stamped only as
// the reading came back, an idle engine looked one request busier until
// its next reading (two replicas' demo passed an idle prefix holder so).
func TestAReadingCountsTheRequestsInFlightAsItsScrapeLeft(t *testing.T) {
	var inFlight atomic.Int64
	inFlight.Store(2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inFlight.Store(0) // the router's two requests end while the page is written
		_, _ = io.WriteString(w, vllmPage)
	}))
	defer srv.Close()
	_, s := scraping(t, Options{Interval: time.Hour, Timeout: time.Second, Targets: func() []Target {
		return []Target{{ID: 1, URL: srv.URL + "/metrics", Relayed: func() RelayedCounts { return RelayedCounts{InFlight: inFlight.Load()} }}}
	}})
	require.Eventually(t, func() bool { st, _ := s.get(1); return st != nil }, 5*time.Second, 5*time.Millisecond)
	st, _ := s.get(1)
	assert.EqualValues(t, 2, st.Occupancy, "in flight as the scrape left")
	cp := *st
	cp.Prepare(inFlight.Load())
	assert.EqualValues(t, 2, cp.Occupancy, "the larger count kept")
	withTwo, _ := cp.Cost(0)
	cp = *st
	cp.Occupancy = 0
	cp.Prepare(0)
	withNone, _ := cp.Cost(0)
	// The page: 5 running and 4 waiting; the router's 2 among them.
	assert.InDelta(t, 8.0/10, withTwo/withNone, 1e-9, "7 others' and one more, not 9 and one")
}

// A scrape follows a redirect (an engine whose /metrics answers 307 to
// /metrics/, as vLLM's mounted Prometheus app once did) within the
// worker's host, never to another (the worker's API key would go with
// it), asks for the page uncompressed (the engine's API server spends no
// CPU on gzip every interval), and fails on a page over MaxPageBytes, read
// no further.
func TestAScrapeFollowsRedirectsAndBoundsThePage(t *testing.T) {
	var encodings sync.Map
	var bigSent atomic.Int64
	var elsewhere atomic.Int64
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		_, _ = io.WriteString(w, vllmPage)
	}))
	defer other.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		encodings.Store(r.Header.Get("Accept-Encoding"), true)
		switch r.URL.Path {
		case "/metrics":
			http.Redirect(w, r, "/metrics/", http.StatusTemporaryRedirect)
		case "/metrics/":
			_, _ = io.WriteString(w, vllmPage)
		case "/loop":
			http.Redirect(w, r, "/loop", http.StatusFound)
		case "/away":
			http.Redirect(w, r, other.URL+"/metrics", http.StatusFound)
		case "/big":
			_, _ = io.WriteString(w, vllmPage)
			pad := []byte(strings.Repeat("# pad\n", 1<<14))
			for bigSent.Load() < MaxPageBytes+8<<20 {
				n, err := w.Write(pad)
				bigSent.Add(int64(n))
				if err != nil {
					return
				}
			}
		}
	}))
	defer srv.Close()
	s := &sink{last: map[uint64]*Stats{}, seen: map[uint64]int{}}
	sc := New(Options{Timeout: 5 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Publish: s.publish, APIKey: bearer.New("k"),
		Targets: func() []Target {
			return []Target{{ID: 1, URL: srv.URL + "/metrics"}, {ID: 2, URL: srv.URL + "/loop"}, {ID: 3, URL: srv.URL + "/big"},
				{ID: 4, URL: srv.URL + "/away"}}
		}})
	sc.Prime(context.Background())

	st, _ := s.get(1)
	require.NotNil(t, st, "read through the redirect")
	assert.Equal(t, 5.0, st.Running)
	encodings.Range(func(k, _ any) bool { assert.Empty(t, k, "Accept-Encoding"); return true })
	for id, want := range map[uint64]string{2: "status 302", 3: ErrPageTooLarge.Error(), 4: "redirected to " + other.URL + "/metrics, not " + srv.URL + ": not followed"} {
		st, n := s.get(id)
		assert.Nil(t, st)
		assert.Positive(t, n)
		info := map[string]any{}
		sc.Describe(id, info)
		assert.Contains(t, info["engine_reason"], want, "worker %d", id)
	}
	assert.Less(t, bigSent.Load(), int64(MaxPageBytes+8<<20), "the page was not read to its end")
	assert.Zero(t, elsewhere.Load(), "nothing asked of another host")
}

// When Run ends, a scrape under way (of an engine slow to answer its
// metrics) ends with it, not at its timeout, and its connection closes.
func TestRunEndsTheScrapesUnderWay(t *testing.T) {
	asked, gone, release := make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked <- struct{}{}
		select {
		case <-r.Context().Done(): // the scraper hung up
			close(gone)
		case <-release: // the test failed
		}
	}))
	defer srv.Close()
	defer close(release)
	sc := New(Options{Timeout: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Publish: func(uint64, *Stats) {},
		Targets: func() []Target { return []Target{{ID: 1, URL: srv.URL + "/metrics"}} }})
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { sc.Run(ctx); close(done) }()
	<-asked
	stop()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run still waits for its scrape")
	}
	<-gone
}

// A page whose lines of the series Parse reads are those of the last one
// (an idle engine's: its counters still, its gauges the same) gives the
// last reading at its own time, parsed not again: without an allocation.
// One that moved is parsed; one that failed is not kept.
func TestAnUnchangedPageIsNotParsedAgain(t *testing.T) {
	var st target
	scrape := func(page string, at time.Time) (Reading, error) { return st.parse([]byte(page), at) }
	t0 := time.Unix(100, 0)
	first, err := scrape(bigVLLMPage(), t0)
	require.NoError(t, err)
	again, err := scrape(strings.Replace(bigVLLMPage(), "process_cpu_seconds_total", "process_cpu_seconds_total_x", 1), t0.Add(time.Second))
	require.NoError(t, err)
	want := first
	want.At = t0.Add(time.Second)
	assert.Equal(t, want, again, "a series Parse does not read moved: the same reading")

	page := []byte(bigVLLMPage())
	body := make([]byte, len(page))
	assert.Zero(t, testing.AllocsPerRun(50, func() {
		copy(body, page)
		if _, err := st.parse(body, t0); err != nil {
			t.Fatal(err)
		}
	}), "an unchanged page is not parsed")

	running := `vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0`
	moved, err := scrape(strings.Replace(bigVLLMPage(), running, strings.Replace(running, "3.0", "9.0", 1), 1), t0)
	require.NoError(t, err)
	assert.Equal(t, first.Running+6, moved.Running)

	_, err = scrape(strings.Replace(bigVLLMPage(), running, running+".0", 1), t0)
	assert.Error(t, err)
	assert.Nil(t, st.kept, "a page that failed is not kept")
}

// An engine closes a kept-alive connection once it idled for its
// keep-alive timeout (uvicorn's 5 s, vLLM's and SGLang's): a scrape after
// a longer interval finds it closed, and is made again on a new one, not
// failed.
func TestAScrapeOnAConnectionTheEngineClosedIsMadeAgain(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, vllmPage)
	}))
	srv.Config.IdleTimeout = 50 * time.Millisecond
	var conns atomic.Int64
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	s := &sink{last: map[uint64]*Stats{}, seen: map[uint64]int{}}
	sc := New(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Publish: s.publish,
		Targets: func() []Target { return []Target{{ID: 1, URL: srv.URL + "/metrics"}} }})
	for range 4 {
		sc.Prime(context.Background()) // the reading of the last went stale meanwhile
		st, _ := s.get(1)
		require.NotNil(t, st, "every scrape reads the page")
		time.Sleep(200 * time.Millisecond) // past the engine's keep-alive
	}
	assert.GreaterOrEqual(t, conns.Load(), int64(4), "the engine closed each idle connection")
}
