// Package engine reads what inference engines say of their own load: the
// Prometheus metrics of vLLM, SGLang, TensorRT-LLM's trtllm-serve, Hugging
// Face's text-generation-inference and llama.cpp's llama-server (requests
// running and waiting, KV cache usage, tokens generated, LoRA
// adapters in use). It parses a scrape, learns each engine's speed from
// successive scrapes, estimates the cost of sending it one more request,
// and polls a set of engines on a tick.
package engine

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Reading is one scrape of an engine's metrics. Series with several label
// sets (one per model or data-parallel engine) are summed; KV usage is the
// fullest one's.
type Reading struct {
	At      time.Time
	Dialect string  // "vllm", "sglang", "trtllm", "tgi", "llamacpp", or DialectRouter
	Running float64 // requests in the running batch
	Waiting float64 // requests queued behind it
	KVUsage float64 // share of the KV cache in use, 0..1
	Tokens  float64 // generation tokens ever produced (a counter); -1 when not exported
	// MaxRunning is the batch size the engine reports (SGLang's
	// max_running_requests, trtllm-serve's max_num_active_requests); 0
	// when it reports none and it is learned.
	MaxRunning float64
	Adapters   []string
	// PrefixQueries and PrefixHits are the prompt tokens the engine looked
	// up in its prefix cache and found there (vLLM's counters); -1 when
	// not exported.
	PrefixQueries, PrefixHits float64
	// PrefixHitRate is the prefix cache's hit rate as the engine reports
	// it (SGLang's cache_hit_rate, trtllm-serve's kv_cache_hit_rate, 0..1);
	// -1 when not exported.
	PrefixHitRate float64
	// TokenGapSeconds and TokenGaps are the sum and count of the engine's
	// inter-token latency histogram (vLLM's and SGLang's; TGI's mean time
	// per token of each request): every gap between two tokens of a
	// request since the engine started, and their total time. Their ratio
	// is its speed per running request over its life; -1 when not
	// exported.
	TokenGapSeconds, TokenGaps float64
	// Asleep says the engine is in vLLM's sleep mode (POST /sleep): one of
	// its engines reports vllm:engine_sleep_state{sleep_state="awake"} 0.
	// Its weights or KV cache are off the GPU until POST /wake_up, while
	// its /health still answers 200.
	Asleep bool
}

// series names the metrics of one engine family.
type series struct {
	dialect                         string
	running, waiting, tokens        string
	maxRunning                      string
	prefixQueries, prefixHits       string   // counters of prompt tokens (vLLM)
	prefixRate                      string   // a hit rate gauge (SGLang, trtllm-serve)
	kvUsage                         []string // current name first
	sleepState                      string   // a gauge by sleep_state; awake 0: asleep (vLLM)
	loraInfo                        string
	runningAdapters, waitingAdapter string
	// tokenGaps are inter-token latency histograms, current name first,
	// read as their _sum and _count series.
	tokenGaps []string
	bounds    []bound // built once from the names (withBounds)
}

var dialects = withBounds([]series{
	{dialect: "vllm", running: "vllm:num_requests_running", waiting: "vllm:num_requests_waiting",
		tokens:     "vllm:generation_tokens_total",
		kvUsage:    []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"},
		sleepState: "vllm:engine_sleep_state",
		loraInfo:   "vllm:lora_requests_info", runningAdapters: "running_lora_adapters", waitingAdapter: "waiting_lora_adapters",
		prefixQueries: "vllm:prefix_cache_queries_total", prefixHits: "vllm:prefix_cache_hits_total",
		tokenGaps: []string{"vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"}},
	{dialect: "sglang", running: "sglang:num_running_reqs", waiting: "sglang:num_queue_reqs",
		tokens: "sglang:generation_tokens_total", kvUsage: []string{"sglang:token_usage"},
		maxRunning: "sglang:max_running_requests", prefixRate: "sglang:cache_hit_rate",
		tokenGaps: []string{"sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"}},
	// TensorRT-LLM's trtllm-serve (the llm-d scheduler's third engine):
	// its iteration stats, published with enable_iter_perf_stats, give the
	// active and queued requests, the KV cache's blocks in use, its reuse
	// rate and the most requests it keeps active.
	{dialect: "trtllm", running: "trtllm_num_requests_running", waiting: "trtllm_num_requests_waiting",
		tokens: "trtllm_generation_tokens_total", kvUsage: []string{"trtllm_kv_cache_utilization"},
		maxRunning: "trtllm_max_num_active_requests", prefixRate: "trtllm_kv_cache_hit_rate"},
	// Hugging Face's text-generation-inference: its batch and its queue;
	// the tokens it generated are the sum of a histogram's observations
	// (read as a series of its own: the histogram's other lines are not),
	// and it reports no KV cache use nor its batch size: learned.
	{dialect: "tgi", running: "tgi_batch_current_size", waiting: "tgi_queue_size",
		tokens: "tgi_request_generated_tokens_sum", tokenGaps: []string{"tgi_request_mean_time_per_token_duration"}},
	// llama.cpp's llama-server (--metrics), the CPU engine of choice: the
	// requests its slots are processing and those deferred until one is
	// free; builds before mid-2025 also report their KV cache's use. Its
	// slots (--parallel) are not among its metrics: learned.
	{dialect: "llamacpp", running: "llamacpp:requests_processing", waiting: "llamacpp:requests_deferred",
		tokens: "llamacpp:tokens_predicted_total", kvUsage: []string{"llamacpp:kv_cache_usage_ratio"}},
})

// ErrNoLoadSeries says a metrics page holds none of the running and
// waiting series of the engines Parse reads.
var ErrNoLoadSeries = errors.New("no vLLM, SGLang, trtllm-serve, TGI or llama.cpp running/waiting series in the metrics")

// MaxPageBytes bounds a metrics page. vLLM's and SGLang's are tens to a
// few hundred KiB; a larger one (a metrics_path that names something
// else, a page that never ends) fails the scrape instead of filling memory.
const MaxPageBytes = 16 << 20

// ErrPageTooLarge fails a scrape whose page is over MaxPageBytes.
var ErrPageTooLarge = fmt.Errorf("metrics page larger than %d MiB", MaxPageBytes>>20)

// parsers are the text parsers Parse uses: one keeps its read buffer from
// page to page.
var parsers = sync.Pool{New: func() any {
	p := expfmt.NewTextParser(model.UTF8Validation)
	return &p
}}

// Parse reads a Prometheus text page of vLLM, SGLang, trtllm-serve, TGI
// or llama.cpp taken at at. Only the lines of the series it reads reach
// the text parser: it moves them to page's front (keepRead), so page is
// not left as it was.
func Parse(page []byte, at time.Time) (Reading, error) {
	return parseKept(keepRead(page), at)
}

// parseKept parses the lines keepRead kept of a page.
func parseKept(kept []byte, at time.Time) (Reading, error) {
	p := parsers.Get().(*expfmt.TextParser)
	defer parsers.Put(p)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(kept))
	if err != nil {
		return Reading{}, err
	}
	for _, d := range dialects {
		running, okR := sum(fams[d.running])
		waiting, okW := sum(fams[d.waiting])
		if !okR || !okW {
			continue
		}
		if err := d.check(fams); err != nil {
			return Reading{}, err
		}
		r := Reading{At: at, Dialect: d.dialect, Running: running, Waiting: waiting, Tokens: -1,
			PrefixQueries: -1, PrefixHits: -1, PrefixHitRate: -1, TokenGapSeconds: -1, TokenGaps: -1}
		if t, ok := sum(fams[d.tokens]); ok {
			r.Tokens = t
		}
		for _, h := range d.tokenGaps {
			secs, okS := sum(fams[h+"_sum"])
			gaps, okC := sum(fams[h+"_count"])
			if okS && okC {
				r.TokenGapSeconds, r.TokenGaps = secs, gaps
				break
			}
		}
		q, okQ := sum(fams[d.prefixQueries])
		h, okH := sum(fams[d.prefixHits])
		if okQ && okH {
			r.PrefixQueries, r.PrefixHits = q, h
		}
		if f := fams[d.prefixRate]; f != nil && len(f.GetMetric()) > 0 {
			r.PrefixHitRate = 0 // the mean of the data-parallel engines' rates
			for _, m := range f.GetMetric() {
				r.PrefixHitRate += min(max(value(m), 0), 1) / float64(len(f.GetMetric()))
			}
		}
		if d.maxRunning != "" {
			r.MaxRunning, _ = sum(fams[d.maxRunning])
		}
		for _, name := range d.kvUsage {
			if f := fams[name]; f != nil {
				for _, m := range f.GetMetric() {
					r.KVUsage = max(r.KVUsage, min(value(m), 1))
				}
				break
			}
		}
		r.Asleep = asleep(fams[d.sleepState])
		if d.loraInfo != "" {
			r.Adapters = adapters(fams[d.loraInfo], d.runningAdapters, d.waitingAdapter)
		}
		return r, nil
	}
	return Reading{}, ErrNoLoadSeries
}

// maxRequests bounds the requests an engine reports running, waiting or
// as its batch size: more is not an engine's count (vLLM's and SGLang's
// batches are hundreds to a few thousand).
const maxRequests = 1 << 20

// bound is what check wants of one series' values: lo to hi.
type bound struct {
	name   string
	lo, hi float64
	want   string
}

// withBounds gives each dialect the bounds check holds its series to:
// every series Parse reads has one.
func withBounds(ds []series) []series {
	count := fmt.Sprintf("a count of requests, 0 to %d", maxRequests)
	for i := range ds {
		d := &ds[i]
		add := func(lo, hi float64, want string, names ...string) {
			for _, n := range names {
				if n != "" {
					d.bounds = append(d.bounds, bound{name: n, lo: lo, hi: hi, want: want})
				}
			}
		}
		add(0, maxRequests, count, d.running, d.waiting, d.maxRunning)
		add(0, math.MaxFloat64, "a counter's value, 0 or more", d.tokens, d.prefixQueries, d.prefixHits)
		for _, h := range d.tokenGaps {
			add(0, math.MaxFloat64, "a histogram's sum or count, 0 or more", h+"_sum", h+"_count")
		}
		add(0, 1, "0 or 1", d.sleepState)
		add(-math.MaxFloat64, math.MaxFloat64, "a number", append([]string{d.prefixRate, d.loraInfo}, d.kvUsage...)...)
	}
	return ds
}

// check refuses the values of d's series that no engine reports: a
// value that is not a number or is infinite (the text format allows
// both), a negative or absurd request count (maxRequests), a negative
// counter. Taken as they are, one such reading would stay in what the
// router learns of the engine: its batch size is the most requests it was
// seen running, so a count of 1e300 once would make it the cheapest
// worker for good, and NaN would leave it without a cost for good.
func (d series) check(fams map[string]*dto.MetricFamily) error {
	for _, b := range d.bounds {
		for _, m := range fams[b.name].GetMetric() {
			if v := value(m); !(v >= b.lo && v <= b.hi) { // NaN fails both
				return fmt.Errorf("%s is %v; want %s", b.name, v, b.want)
			}
		}
	}
	return nil
}

// read holds the names of the series Parse reads, in every dialect: those
// check bounds, which are all of them.
var read = func() map[string]bool {
	names := map[string]bool{}
	for _, d := range dialects {
		for _, b := range d.bounds {
			names[b.name] = true
		}
	}
	return names
}()

// keepRead moves to the front of page, in order, the lines Parse reads:
// the # TYPE lines and the samples of the series it reads (not their
// # HELP lines, text the parser would copy and nothing reads), and
// any sample whose name it cannot tell (a quoted name), left to the
// parser. It returns them. A vLLM page is mostly histograms and process
// metrics Parse does not read, which the parser then never builds.
func keepRead(page []byte) []byte {
	kept := page[:0]
	for len(page) > 0 {
		line := page
		if i := bytes.IndexByte(page, '\n'); i >= 0 {
			line, page = page[:i+1], page[i+1:]
		} else {
			page = nil
		}
		if name, ok := seriesOf(line); ok && (name == nil || read[string(name)]) {
			kept = append(kept, line...) // never past line's start: a forward copy
		}
	}
	return kept
}

// seriesOf returns the series name a line of a text page is about, nil when
// it is a sample whose name it cannot tell; ok is false for a line about
// no series that Parse reads (blank, or a comment other than # TYPE).
func seriesOf(line []byte) (name []byte, ok bool) {
	line = trimBlanks(line)
	if len(line) > 0 && line[0] == '#' {
		word, rest := token(line[1:])
		if string(word) != "TYPE" {
			return nil, false
		}
		name, _ = token(rest)
		return name, len(name) > 0
	}
	end := wordEnd(line, true)
	if end == 0 && len(line) > 0 && line[0] == '{' {
		return nil, true
	}
	return line[:end], end > 0
}

// token splits off the first blank-separated word of s.
func token(s []byte) (word, rest []byte) {
	s = trimBlanks(s)
	end := wordEnd(s, false)
	return s[:end], s[end:]
}

// trimBlanks drops the spaces and tabs s starts with.
func trimBlanks(s []byte) []byte {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	return s
}

// wordEnd is the length of the word s starts with: up to a blank or a line
// end, or a label set's '{' when labels says the word is a sample's name.
// A loop: words are short, and bytes.IndexAny builds its set of bytes at
// every call.
func wordEnd(s []byte, labels bool) int {
	for i, c := range s {
		switch c {
		case ' ', '\t', '\r', '\n':
			return i
		case '{':
			if labels {
				return i
			}
		}
	}
	return len(s)
}

func sum(f *dto.MetricFamily) (float64, bool) {
	if f == nil || len(f.GetMetric()) == 0 {
		return 0, false
	}
	total := 0.0
	for _, m := range f.GetMetric() {
		total += value(m)
	}
	return total, true
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

// asleep reports whether a sleep state gauge says an engine is not awake:
// vLLM sets its sleep_state="awake" series to 0 while the engine sleeps
// (and weights_offloaded or discard_all to 1, by the sleep's level). One
// data-parallel engine asleep is enough: vLLM's own balancer sends
// requests to each of them.
func asleep(f *dto.MetricFamily) bool {
	for _, m := range f.GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == "sleep_state" && lp.GetValue() == "awake" && value(m) < 0.5 {
				return true
			}
		}
	}
	return false
}

// adapters lists the adapters vLLM's lora_requests_info reports running or
// waiting. vLLM writes one series per change (its value the time of the
// change), so only the newest counts.
func adapters(f *dto.MetricFamily, labels ...string) []string {
	var newest *dto.Metric
	for _, m := range f.GetMetric() {
		if newest == nil || value(m) > value(newest) {
			newest = m
		}
	}
	if newest == nil {
		return nil
	}
	var out []string
	for _, lp := range newest.GetLabel() {
		if !slices.Contains(labels, lp.GetName()) {
			continue
		}
		for _, a := range strings.Split(lp.GetValue(), ",") {
			if a = strings.TrimSpace(a); a != "" {
				out = append(out, a)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
