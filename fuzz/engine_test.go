package fuzz

import (
	"math"
	"testing"
	"time"

	"github.com/fastroute/fastroute/telemetry/engine"
)

// FuzzEngineMetricsPage: any page a worker serves at its metrics_path
// either fails to parse or gives a reading of counts within bounds, and
// what the router learns from it, read again and again, stays finite: a
// batch size of 1 or more, a speed of 0 or more (learned, or from the
// engine's inter-token latency histogram), an admit limit of 0 or
// more, a cost, when there is one, of 0 or more (what GET /workers shows,
// and what the load-aware pickers compare), and a time still within the
// readings' span, 0 while nothing runs.
func FuzzEngineMetricsPage(f *testing.F) {
	f.Add("vllm:num_requests_running 3\nvllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc 0.9\nvllm:generation_tokens_total 1000\n"+
		"vllm:prefix_cache_queries_total 100\nvllm:prefix_cache_hits_total 40\n", 7.0, int64(2))
	f.Add("sglang:num_running_reqs{model_name=\"m\"} 12\nsglang:num_queue_reqs 2\nsglang:max_running_requests 48\nsglang:token_usage 0.28\n"+
		"sglang:generation_tokens_total 7.5e6\nsglang:cache_hit_rate 0.42\n", 1e6, int64(0))
	f.Add("trtllm_num_requests_running{engine_type=\"trtllm\"} 7\ntrtllm_num_requests_waiting 3\ntrtllm_max_num_active_requests 64\n"+
		"trtllm_kv_cache_utilization 0.47\ntrtllm_generation_tokens_total 98304\ntrtllm_kv_cache_hit_rate 0.61\n", 2.0, int64(3))
	f.Add("# TYPE tgi_request_generated_tokens histogram\ntgi_request_generated_tokens_sum 8123\ntgi_request_generated_tokens_count 44\n"+
		"tgi_batch_current_size 4\ntgi_queue_size 2\n", 5.0, int64(2))
	f.Add("llamacpp:requests_processing 2\nllamacpp:requests_deferred 3\nllamacpp:tokens_predicted_total 2048\nllamacpp:kv_cache_usage_ratio 0.35\n", 3.0, int64(1))
	f.Add("vllm:num_requests_running 1e-300\nvllm:num_requests_waiting 0\nvllm:generation_tokens_total 1e300\n", 1e300, int64(-5))
	f.Add("vllm:num_requests_running NaN\nvllm:num_requests_waiting +Inf\n", 0.0, int64(0))
	f.Add("vllm:num_requests_running 2\nvllm:num_requests_waiting 0\nvllm:generation_tokens_total 100\n"+
		"vllm:engine_sleep_state{engine=\"0\",sleep_state=\"awake\"} 0\nvllm:engine_sleep_state{engine=\"0\",sleep_state=\"discard_all\"} 1\n", 0.0, int64(1))
	f.Add("# TYPE vllm:lora_requests_info gauge\nvllm:lora_requests_info{running_lora_adapters=\"a,b\",waiting_lora_adapters=\"\"} 1.7e9\n"+
		"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n", 5.0, int64(1))
	f.Add("vllm:num_requests_running 2\nvllm:num_requests_waiting 0\nvllm:generation_tokens_total 100\n"+
		"vllm:inter_token_latency_seconds_sum 1e-300\nvllm:inter_token_latency_seconds_count 1e300\n", 0.0, int64(1))
	f.Add("sglang:num_running_reqs 4\nsglang:num_queue_reqs 0\nsglang:inter_token_latency_seconds_sum 0\n"+
		"sglang:inter_token_latency_seconds_count 12\n", 0.0, int64(0))
	f.Fuzz(func(t *testing.T, page string, tokensStep float64, occupancy int64) {
		r, err := engine.Parse([]byte(page), time.Unix(1000, 0))
		if err != nil {
			return
		}
		for name, v := range map[string]float64{"running": r.Running, "waiting": r.Waiting, "max running": r.MaxRunning} {
			if !(v >= 0 && v <= 1<<20) {
				t.Fatalf("%s %v taken", name, v)
			}
		}
		counter := func(v float64) bool { return v == -1 || v >= 0 && v <= math.MaxFloat64 }
		if !(r.KVUsage >= 0 && r.KVUsage <= 1) || !counter(r.Tokens) || !counter(r.TokenGaps) || !counter(r.TokenGapSeconds) {
			t.Fatalf("reading %+v", r)
		}
		if !(tokensStep >= 0 && tokensStep <= math.MaxFloat64) {
			tokensStep = 0 // a counter moves forward
		}
		var l engine.Learner
		for i := range 5 { // the same page five times, 1.5 s apart, its counter moved by tokensStep each time
			if r.Tokens >= 0 {
				r.Tokens = min(r.Tokens+tokensStep, math.MaxFloat64)
			}
			r.At = time.Unix(1000, 0).Add(time.Duration(i) * 1500 * time.Millisecond)
			st := l.Observe(r, 0)
			st.Prepare(occupancy)
			if !(st.Slots >= 1 && st.Slots <= math.MaxFloat64) || !(st.TokenRate >= 0 && st.TokenRate <= math.MaxFloat64) || st.Admit < 0 {
				t.Fatalf("learned slots %v, speed %v, admit %d from %+v", st.Slots, st.TokenRate, st.Admit, r)
			}
			if c, ok := st.Cost(occupancy); ok && !(c >= 0 && c <= math.MaxFloat64) {
				t.Fatalf("cost %v from %+v (slots %v, speed %v)", c, r, st.Slots, st.TokenRate)
			}
			if st.StillFor < 0 || st.StillFor > time.Duration(i)*1500*time.Millisecond || (r.Running == 0 && st.StillFor != 0) {
				t.Fatalf("still for %v at reading %d of %+v", st.StillFor, i, r)
			}
		}
	})
}
