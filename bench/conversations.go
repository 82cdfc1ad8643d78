package bench

import (
	"bufio"
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fastroute/fastroute/internal/loopback"
	"github.com/fastroute/fastroute/pickers"
)

// The conversation comparison's fleet: three engines like gpu-a with
// prefix caching (vLLM's automatic prefix caching, simulated); or, mixed,
// the main comparison's fleet (two GPU-like engines and a CPU-like one)
// with it.
var (
	convFleet      = []simEngine{{"gpu-1", 16, 1, true}, {"gpu-2", 16, 1, true}, {"gpu-3", 16, 1, true}}
	convMixedFleet = []simEngine{{"gpu-a", 16, 1, true}, {"gpu-b", 24, 1, true}, {"cpu", 4, 1.0 / 6, true}}
)

// The conversations' shape: each opens with a document of its own (median
// convDocTokens), then asks convTurns questions, each turn sending the
// whole conversation so far, convGap apart on average.
const (
	convDocTokens      = 1000
	convTurns          = 4
	convQuestionTokens = 30
	convGap            = time.Second
)

// ConvSetups are the routers of the conversation comparison: nginx
// least_conn, fastroute's load-aware mode without and with prefix
// affinity, two other modes with it, two replicas with it behind nginx's
// round-robin (a conversation's turns reach either), without and with
// sharing what they record, and one engine prefilling for two decoding
// with it, without and with min_prefill_tokens (a turn whose decode
// worker holds all but the new part of it runs whole there).
func ConvSetups() []RoutingRouter {
	withPrefix := func(m pickers.Mode) startFunc {
		return func(bin, _ string, workers []string) (string, *exec.Cmd, error) {
			return startServe(bin, workers, "--mode", string(m), "--prefix-affinity")
		}
	}
	return []RoutingRouter{
		{Name: "nginx least_conn", start: nginxFront("least_conn;", "auto")},
		{Name: "fastroute load-aware", start: fastrouteMode(pickers.ModeLoadAware)},
		{Name: "fastroute load-aware + prefix affinity", start: withPrefix(pickers.ModeLoadAware)},
		{Name: "fastroute least-loaded + prefix affinity", start: withPrefix(pickers.ModeLeastLoaded)},
		{Name: "fastroute default + prefix affinity", start: withPrefix(pickers.ModeWeighted)},
		{Name: "2 replicas behind nginx round-robin", start: nginxFront("", "auto"), backends: replicas(false)},
		{Name: "2 replicas sharing prefixes behind nginx round-robin", start: nginxFront("", "auto"), backends: replicas(true)},
		{Name: "P/D 1 prefill + 2 decode + prefix affinity", start: fastrouteRoles(pdRoles, "--prefix-affinity")},
		{Name: "P/D 1 prefill + 2 decode + prefix affinity + min_prefill_tokens 256", start: fastrouteRoles(pdRoles, "--prefix-affinity", "--min-prefill-tokens", "256")},
	}
}

// pdRoles are the roles of the conversation comparison's P/D setups: one
// engine prefilling for two decoding, with vLLM's protocol.
var pdRoles = []string{"prefill", "decode", "decode"}

// replicas returns the start of two fastroute replicas in load-aware mode
// with prefix affinity in front of the same engines; with share, each
// names the other as its peer.
func replicas(share bool) func(bin string, engines []string) ([]string, func(), error) {
	return func(bin string, engines []string) ([]string, func(), error) {
		var addrs, admins []string
		var ps []*exec.Cmd
		stop := func() {
			for _, p := range ps {
				terminate(p)
			}
		}
		for range 2 {
			a, err := loopback.FreeAddr()
			if err != nil {
				return nil, nil, err
			}
			admins = append(admins, a)
		}
		for i, admin := range admins {
			flags := []string{"--mode", string(pickers.ModeLoadAware), "--prefix-affinity"}
			if share {
				flags = append(flags, "--prefix-affinity-peer", "http://"+admins[1-i])
			}
			addr, p, err := startServeAdmin(bin, admin, engines, flags...)
			if err != nil {
				stop()
				return nil, nil, err
			}
			addrs, ps = append(addrs, addr), append(ps, p)
			if err := waitHealth(addr); err != nil {
				stop()
				return nil, nil, notUp(err, p)
			}
		}
		return addrs, stop, nil
	}
}

// conversations is an open-loop workload of multi-turn chats whose turns
// come at rate per second in all, for dur: conversations start as a
// Poisson process, and each turn follows the one before after an
// exponential gap (the user reading and typing), whether or not its
// answer came. A turn's body is the conversation so far (the document,
// then each question with the answer it got, as placeholder text of the
// answer's length) and its new question, so each turn's prompt starts
// with the one before. It returns the jobs in arrival order and their
// mean prompt and answer lengths in tokens.
func conversations(seed uint64, rate float64, dur time.Duration) (jobs []job, meanPrompt, meanOut float64) {
	r := rand.New(rand.NewPCG(seed, 3))
	var all []job
	for start, conv := 0.0, 0; start < dur.Seconds(); start, conv = start+r.ExpFloat64()*convTurns/rate, conv+1 {
		doc := min(max(int(math.Exp(math.Log(convDocTokens)+0.5*r.NormFloat64())), 200), 3000)
		var history strings.Builder
		fmt.Fprintf(&history, `{"role":"user","content":"conversation %d: %s"}`, conv, strings.Repeat("d", 4*doc))
		at := start
		for turn := range convTurns {
			_, out := lengths(r)
			fmt.Fprintf(&history, `,{"role":"user","content":"question %d: %s"}`, turn, strings.Repeat("q", 4*convQuestionTokens))
			body := fmt.Sprintf(`{"model":"mock-model","stream":true,"max_tokens":%d,"messages":[%s]}`, out, history.String())
			all = append(all, job{at: time.Duration(at * float64(time.Second)), prompt: len(body) / 4, out: out, body: []byte(body)})
			fmt.Fprintf(&history, `,{"role":"assistant","content":"%s"}`, strings.Repeat("a", 4*out))
			at += r.ExpFloat64() * convGap.Seconds()
		}
	}
	for _, j := range all {
		if j.at < dur {
			jobs = append(jobs, j)
			meanPrompt += float64(j.prompt)
			meanOut += float64(j.out)
		}
	}
	slices.SortFunc(jobs, func(a, b job) int { return cmp.Compare(a.at, b.at) })
	return jobs, meanPrompt / float64(len(jobs)), meanOut / float64(len(jobs))
}

// runConversations runs ConvSetups on convFleet (convMixedFleet with
// ConvMixed) at load (a share of its
// capacity without prefix caching) and returns their rows. The warm-up
// lasts a conversation at least, so the measured window has
// conversations at every turn.
func runConversations(o RoutingOptions, dir string) ([]RoutingRow, float64, error) {
	o.Warmup = max(o.Warmup, convTurns*convGap)
	_, meanP, meanO := conversations(o.Seed, 100, o.Warmup+o.Duration) // many conversations: the lengths' means
	fleet := convFleet
	if o.ConvMixed {
		fleet = convMixedFleet
	}
	capacity := fleetCapacity(fleet, meanP, meanO)
	jobs, _, _ := conversations(o.Seed, o.ConvLoad*capacity, o.Warmup+o.Duration)
	rows, err := runSetups(o, dir, fleet, ConvSetups(), o.Routers, jobs, o.ConvLoad, o.ConvLoad*capacity)
	if err != nil {
		return nil, 0, fmt.Errorf("conversations: %w", err)
	}
	if len(rows) == 0 {
		return nil, 0, fmt.Errorf("no router of the conversation comparison is among %q", o.Routers)
	}
	return rows, capacity, nil
}

// ConvTable formats the conversation comparison; mixed says it ran on
// convMixedFleet.
func ConvTable(rows []RoutingRow, capacity float64, mixed bool) string {
	var b strings.Builder
	fleet := "three engines with prefix caching (like gpu-a"
	if mixed {
		fleet = "the main comparison's engines with prefix caching (gpu-a, gpu-b, cpu"
	}
	fmt.Fprintf(&b, "Conversations on %s; %.1f req/s without the cache) at %.0f%% of that: each opens with a document of its own (median %d tokens), then %d turns about %v apart, each sending the conversation so far:\n\n",
		fleet, capacity, 100*rows[0].Load, convDocTokens, convTurns, convGap)
	fmt.Fprintf(&b, "| router | TTFT p50 | TTFT p99 | e2e p50 | e2e p99 | completed req/s | failed | prompt tokens found cached | share %% (%s) | TTFT p99 vs nginx least_conn |\n",
		strings.Join(rows[0].WorkerList, "/"))
	b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |\n")
	for _, r := range rows {
		ref := "-"
		if n := rows[0]; n.Router == "nginx least_conn" {
			ref = ratio(float64(pct(r.TTFT, 0.99)), float64(pct(n.TTFT, 0.99)))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %.1f | %d | %.0f%% | %s | %s |\n", r.Router, r.lat(r.TTFT, 0.5), r.lat(r.TTFT, 0.99),
			r.lat(r.E2E, 0.5), r.lat(r.E2E, 0.99), r.RPS(), r.Failed, 100*r.CacheHits, r.Shares(), ref)
	}
	return b.String()
}

// prefixCache returns the prompt tokens the engines at addrs looked up in
// their prefix caches and those they found there, summed (vLLM's
// vllm:prefix_cache_queries_total and vllm:prefix_cache_hits_total).
func prefixCache(addrs []string) (queries, hits float64, err error) {
	for _, a := range addrs {
		sums, err := seriesSums(a, "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")
		if err != nil {
			return 0, 0, err
		}
		queries, hits = queries+sums[0], hits+sums[1]
	}
	return queries, hits, nil
}

// seriesSums reads the Prometheus page at addr's /metrics and returns, for
// each of names, the sum of its samples over every label set (0 for a
// series the page lacks).
func seriesSums(addr string, names ...string) ([]float64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	sums := make([]float64, len(names))
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		sample, value, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		name, _, _ := strings.Cut(sample, "{")
		if i := slices.Index(names, name); i >= 0 {
			v, _ := strconv.ParseFloat(value, 64)
			sums[i] += v
		}
	}
	return sums, sc.Err()
}
