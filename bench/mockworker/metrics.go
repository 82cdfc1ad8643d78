package mockworker

import (
	"fmt"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// stats is what /metrics reports.
func (w *Worker) stats() engineStats {
	if w.engine != nil {
		return w.engine.stats()
	}
	return engineStats{running: int(w.active.Load()), genTokens: w.tokens.Load()}
}

// Queue returns the requests the worker is working on and those waiting
// for a slot, as its /metrics reports them.
func (w *Worker) Queue() (running, waiting int) {
	st := w.stats()
	return st.running, st.waiting
}

// PrefixCacheHits returns the prompt tokens the simulated engine found in
// its prefix cache (vllm:prefix_cache_hits_total); 0 without one.
func (w *Worker) PrefixCacheHits() float64 { return float64(w.stats().cacheHits) }

// metrics answers /metrics in the Prometheus text format, with the series
// names and labels of vLLM (default), SGLang, TensorRT-LLM's trtllm-serve,
// text-generation-inference or llama.cpp's llama-server.
// Without the engine simulator the requests being answered count as
// running and none waits.
func (w *Worker) metrics(ctx *fasthttp.RequestCtx) {
	time.Sleep(w.opts.MetricsDelay)
	st := w.stats()
	maxLoRA := DefaultMaxLoRA
	if w.engine != nil {
		maxLoRA = w.engine.o.MaxLoRA
	}
	model := fmt.Sprintf("{model_name=%q}", w.opts.Model)
	var b []byte
	metric := func(name, typ, help string, v any) {
		b = fmt.Appendf(b, "# HELP %s %s\n# TYPE %s %s\n%s%s %v\n", name, help, name, typ, name, model, v)
	}
	// tokenGaps writes the simulator's inter-token latency histogram
	// under name, with one bucket: +Inf.
	tokenGaps := func(name string) {
		if w.engine == nil {
			return
		}
		b = fmt.Appendf(b, "# HELP %s Histogram of inter-token latency in seconds.\n# TYPE %s histogram\n"+
			"%s_bucket{le=\"+Inf\",model_name=%q} %d\n%s_sum%s %v\n%s_count%s %d\n",
			name, name, name, w.opts.Model, st.gaps, name, model, st.gapSeconds, name, model, st.gaps)
	}
	switch w.opts.MetricsDialect {
	case "llamacpp": // as llama-server writes them: no labels, and (since mid-2025) no KV cache series
		model = ""
		metric("llamacpp:prompt_tokens_total", "counter", "Number of prompt tokens processed.", st.promptTokens)
		metric("llamacpp:tokens_predicted_total", "counter", "Number of generation tokens processed.", st.genTokens)
		metric("llamacpp:requests_processing", "gauge", "Number of requests processing.", st.running)
		metric("llamacpp:requests_deferred", "gauge", "Number of requests deferred.", st.waiting)
	case "trtllm": // trtllm-serve's iteration stats (enable_iter_perf_stats), labelled as it labels them
		model = fmt.Sprintf("{engine_type=\"trtllm\",model_name=%q}", w.opts.Model)
		metric("trtllm_num_requests_running", "gauge", "Number of active requests", st.running)
		metric("trtllm_num_requests_waiting", "gauge", "Number of queued requests", st.waiting)
		metric("trtllm_kv_cache_utilization", "gauge", "KV cache utilization", st.kvUsage)
		metric("trtllm_generation_tokens_total", "counter", "Cumulative number of generation (output) tokens produced.", st.genTokens)
		if w.engine != nil {
			metric("trtllm_max_num_active_requests", "gauge", "Maximum number of active requests", w.engine.o.MaxNumSeqs)
		}
		if st.cacheQueries > 0 {
			metric("trtllm_kv_cache_hit_rate", "gauge", "KV cache hit rate", float64(st.cacheHits)/float64(st.cacheQueries))
		}
	case "tgi": // as its exporter writes them: no labels, no HELP; the tokens generated a histogram's sum
		b = fmt.Appendf(b, "# TYPE tgi_queue_size gauge\ntgi_queue_size %v\n# TYPE tgi_batch_current_size gauge\ntgi_batch_current_size %v\n"+
			"# TYPE tgi_request_generated_tokens histogram\ntgi_request_generated_tokens_bucket{le=\"+Inf\"} %v\n"+
			"tgi_request_generated_tokens_sum %v\ntgi_request_generated_tokens_count %v\n",
			st.waiting, st.running, st.finished, st.genTokens, st.finished)
	case "sglang":
		metric("sglang:num_running_reqs", "gauge", "The number of running requests.", st.running)
		metric("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", st.waiting)
		if w.engine != nil {
			metric("sglang:max_running_requests", "gauge", "The maximum number of running requests.", w.engine.o.MaxNumSeqs)
		}
		metric("sglang:token_usage", "gauge", "The token usage.", st.kvUsage)
		metric("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", st.promptTokens)
		metric("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.", st.genTokens)
		tokenGaps("sglang:inter_token_latency_seconds")
	default:
		metric("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", st.running)
		metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", st.waiting)
		metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", st.kvUsage)
		metric("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", st.promptTokens)
		metric("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", st.genTokens)
		metric("vllm:request_success_total", "counter", "Count of successfully processed requests.", st.finished)
		tokenGaps("vllm:inter_token_latency_seconds")
		if w.engine != nil && w.engine.cache != nil {
			metric("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.", st.cacheQueries)
			metric("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.", st.cacheHits)
		}
		level := w.sleep.Load()
		b = fmt.Appendf(b, "# HELP vllm:engine_sleep_state Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "+
			"weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.\n# TYPE vllm:engine_sleep_state gauge\n")
		for i, state := range []string{"awake", "weights_offloaded", "discard_all"} {
			on := 0
			if int32(i) == level {
				on = 1
			}
			b = fmt.Appendf(b, "vllm:engine_sleep_state{engine=\"0\",model_name=%q,sleep_state=%q} %d\n", w.opts.Model, state, on)
		}
		b = fmt.Appendf(b, "# HELP vllm:lora_requests_info Running stats on lora requests.\n# TYPE vllm:lora_requests_info gauge\n"+
			"vllm:lora_requests_info{max_lora=\"%d\",running_lora_adapters=%q,waiting_lora_adapters=%q} %d\n",
			maxLoRA, strings.Join(st.runningLoRAs, ","), strings.Join(st.waitingLoRAs, ","), time.Now().Unix())
	}
	ctx.SetContentType("text/plain; version=0.0.4; charset=utf-8")
	ctx.SetBody(b)
}
