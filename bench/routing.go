package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fastroute/fastroute/pickers"
)

// RoutingOptions configures RunRouting.
type RoutingOptions struct {
	Binary   string        // the fastroute binary (engines and routers run as their own processes)
	Warmup   time.Duration // arrivals before the measured window (routers learn the engines meanwhile)
	Duration time.Duration // measured window of arrivals per router and load
	Timeout  time.Duration // a request not answered by then counts as timed out
	Loads    []float64     // offered load as shares of the fleet's capacity
	Routers  []string      // routers to run (names of RoutingRouters); empty: all
	// PDLoad is the load of the prefill/decode comparison (PDSetups on
	// pdFleet); 0 skips it.
	PDLoad float64
	// ConvLoad is the load of the conversation comparison (ConvSetups on
	// convFleet); 0 skips it.
	ConvLoad float64
	// ConvMixed runs the conversation comparison on convMixedFleet.
	ConvMixed bool
	// JoinLoad is the load of the scale-up comparison (JoinSetups, with
	// fastJoiner joining), as a share of the capacity of the engines there
	// before the join; 0 skips it.
	JoinLoad float64
	// SlowJoinLoad is the load of the same comparison with a slow engine
	// joining (slowJoiner); 0 skips it.
	SlowJoinLoad float64
	// RestartLoad is the load of the restart comparison (RestartSetups on
	// routingFleet); 0 skips it.
	RestartLoad float64
	// MetricsDelay has every simulated engine answer its metrics page
	// that long after it is asked, as a busy engine's API server does.
	MetricsDelay time.Duration
	// NoMetrics names the engines (of every fleet) whose metrics page
	// answers 404, as SGLang's without --enable-metrics and Ollama's do.
	NoMetrics []string
	Seed      uint64 // workload seed
	OutDir    string // where routing.md and routing.svg go
}

// simEngine is one simulated engine of the routing fleet.
type simEngine struct {
	name        string
	slots       int
	speed       float64
	prefixCache bool // it keeps prompts' blocks (--prefix-cache)
}

// The fleet: two GPU-like engines with different batch sizes and a CPU-like
// one at 1/6 of their speed. Every engine has the same step model.
var routingFleet = []simEngine{{"gpu-a", 16, 1, false}, {"gpu-b", 24, 1, false}, {"cpu", 4, 1.0 / 6, false}}

// The prefill/decode comparison's fleet: three engines like gpu-a, run all
// whole or one prefilling (and maybe taking whole requests) for two
// decoding.
var pdFleet = []simEngine{{"gpu-1", 16, 1, false}, {"gpu-2", 16, 1, false}, {"gpu-3", 16, 1, false}}

// PDSetups are the ways the comparison runs pdFleet: aggregated in the
// default mode, and disaggregated with vLLM's protocol, its first engine
// prefilling only or doing both (a request whose decode pick is that
// engine runs whole there), the latter also with a bound on its prefill
// queue (past it, a decode engine prefills the request itself).
func PDSetups() []RoutingRouter {
	return []RoutingRouter{
		{Name: "aggregated: 3 whole (default mode)", start: fastrouteMode(pickers.ModeWeighted)},
		{Name: "disaggregated vllm-nixl: 1 prefill + 2 decode", start: fastrouteRoles([]string{"prefill", "decode", "decode"})},
		{Name: "disaggregated vllm-nixl: 1 both + 2 decode", start: fastrouteRoles([]string{"both", "decode", "decode"})},
		{Name: "disaggregated vllm-nixl: 1 both + 2 decode, max_prefill_queue 2", start: fastrouteRoles([]string{"both", "decode", "decode"}, "--disagg-max-prefill-queue", "2")},
	}
}

// fastrouteRoles starts fastroute splitting requests with vLLM's protocol
// over workers of these roles, in order, with flags besides.
func fastrouteRoles(roles []string, flags ...string) startFunc {
	return func(bin, _ string, workers []string) (string, *exec.Cmd, error) {
		specs := make([]string, len(workers))
		for i, w := range workers {
			specs[i] = w + ",role=" + roles[i]
		}
		return startServe(bin, specs, append([]string{"--disagg-protocol", "vllm-nixl"}, flags...)...)
	}
}

const (
	simITL          = 4 * time.Millisecond
	simLoadFactor   = 0.03
	simPrefillToken = 20 * time.Microsecond
)

func (e simEngine) flags() []string {
	f := []string{"--max-num-seqs", strconv.Itoa(e.slots), "--speed", strconv.FormatFloat(e.speed, 'f', 4, 64),
		"--inter-token-latency", simITL.String(), "--load-factor", strconv.FormatFloat(simLoadFactor, 'f', -1, 64),
		"--prefill-per-token", simPrefillToken.String(), "--kv-blocks", "8192"}
	if e.prefixCache {
		f = append(f, "--prefix-cache")
	}
	return f
}

// capacity is the engine's steady throughput in requests per second with a
// full batch, for requests of meanPrompt and meanOut tokens. A request
// admitted at rate λ costs its prefill once, and every decode step of the
// full batch yields slots tokens, so one second holds
// λ × prompt × prefill + (λ × out / slots) × step, which gives
// λ = slots / (out × step + slots × prompt × prefill), scaled by speed.
func (e simEngine) capacity(meanPrompt, meanOut float64) float64 {
	step := simITL.Seconds() * (1 + simLoadFactor*float64(e.slots-1))
	return e.speed * float64(e.slots) / (meanOut*step + float64(e.slots)*meanPrompt*simPrefillToken.Seconds())
}

// fleetCapacity is the engines' capacities summed.
func fleetCapacity(fleet []simEngine, meanPrompt, meanOut float64) float64 {
	total := 0.0
	for _, e := range fleet {
		total += e.capacity(meanPrompt, meanOut)
	}
	return total
}

// job is one request of the workload.
type job struct {
	at          time.Duration // arrival after the start of the run
	prompt, out int           // tokens
	body        []byte        // the request's body; nil: chatBody's
}

// lengths draws heavy-tailed prompt and answer lengths (log-normal, as
// chat traces are): prompts of median 200 tokens, answers of median 48.
func lengths(r *rand.Rand) (prompt, out int) {
	prompt = int(math.Exp(math.Log(200) + 1.0*r.NormFloat64()))
	out = int(math.Exp(math.Log(48) + 0.8*r.NormFloat64()))
	return min(max(prompt, 8), 4000), min(max(out, 1), 512)
}

// meanLengths is the mean of many draws of the same distribution.
func meanLengths(seed uint64) (prompt, out float64) {
	r := rand.New(rand.NewPCG(seed, 1))
	const n = 100000
	for i := 0; i < n; i++ {
		p, o := lengths(r)
		prompt += float64(p)
		out += float64(o)
	}
	return prompt / n, out / n
}

// workload is an open-loop Poisson arrival sequence at rate per second
// for dur, the same for every router at one load (same seed).
func workload(seed uint64, rate float64, dur time.Duration) []job {
	r := rand.New(rand.NewPCG(seed, 2))
	var jobs []job
	for at := 0.0; at < dur.Seconds(); at += r.ExpFloat64() / rate {
		p, o := lengths(r)
		jobs = append(jobs, job{at: time.Duration(at * float64(time.Second)), prompt: p, out: o})
	}
	return jobs
}

// RoutingRouter is one router of the comparison.
type RoutingRouter struct {
	Name  string
	start startFunc
	// backends, when set, starts what start is put in front of (a
	// cluster's replicas, in front of the engines) and returns their
	// addresses and what stops them.
	backends func(bin string, engines []string) (addrs []string, stop func(), err error)
	// join, when set, adds engine addr as worker id to the router once it
	// runs: the fleet's last engines (joining of them) join at the
	// warm-up's end, the others are the router's from its start.
	join func(id int, addr string) error
	// restarted, when set, has the engines serve the warm-up through
	// one instance of the router and starts another at its end, which
	// takes the arrivals from then on: a router restarted (or a new
	// replica started) in front of engines already busy, the old one
	// ending what it holds.
	restarted bool
}

// RoutingRouters lists every fastroute mode that picks (its defaults
// otherwise: engine telemetry on, no capacities set) and nginx with
// least_conn and with round-robin.
func RoutingRouters() []RoutingRouter {
	var out []RoutingRouter
	for _, m := range pickers.Modes {
		if m == pickers.ModeDirect {
			continue
		}
		out = append(out, RoutingRouter{Name: modeName(m), start: fastrouteMode(m)})
	}
	return append(out,
		RoutingRouter{Name: "fastroute least-loaded (cpu a backup)", start: fastrouteBackup(pickers.ModeLeastLoaded, cpuEngine)},
		RoutingRouter{Name: "nginx least_conn", start: nginxFront("least_conn;", "auto")},
		RoutingRouter{Name: "nginx round-robin", start: nginxFront("", "auto")})
}

// cpuEngine is the CPU-like engine's place in routingFleet.
const cpuEngine = 2

// fastrouteBackup starts fastroute in mode m with the worker at index
// backup a backup: it takes requests only when the others are at their
// cap or down.
func fastrouteBackup(m pickers.Mode, backup int) startFunc {
	return func(bin, _ string, workers []string) (string, *exec.Cmd, error) {
		specs := slices.Clone(workers)
		specs[backup] += ",backup=true"
		return startServe(bin, specs, "--mode", string(m))
	}
}

// modeName is the comparisons' name of fastroute in mode m.
func modeName(m pickers.Mode) string {
	if m == pickers.ModeWeighted {
		return "fastroute " + string(m) + " (default)"
	}
	return "fastroute " + string(m)
}

func fastrouteMode(m pickers.Mode) startFunc {
	return func(bin, _ string, workers []string) (string, *exec.Cmd, error) {
		return startServe(bin, workers, "--mode", string(m))
	}
}

// RoutingRow is one router's figures at one load.
type RoutingRow struct {
	Load       float64
	Router     string
	Offered    float64 // requests per second offered
	TTFT, E2E  []time.Duration
	ITL        []time.Duration // per completed request: its mean gap between tokens
	Completed  int             // requests answered in full (measured window)
	Failed     int             // errors and timeouts (measured window)
	Window     time.Duration
	Timeout    time.Duration  // failed requests count as this slow
	ByWorker   map[string]int // completed requests per engine
	WorkerList []string
	CacheHits  float64 // engines with prefix caching: the share of prompt tokens found cached after the warm-up
}

func pct(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(int(q*float64(len(sorted))), len(sorted)-1)]
}

// lat formats a latency percentile; one at the timeout is a failed
// request, so the true figure is only known to be at least that.
func (r RoutingRow) lat(sorted []time.Duration, q float64) string {
	if d := pct(sorted, q); r.Timeout > 0 && d >= r.Timeout {
		return "≥ " + fmtDur(r.Timeout) + " (failed)"
	}
	return fmtDur(pct(sorted, q))
}

// RunRouting runs every router at every load on a fresh fleet of simulated
// engines and writes the table and the TTFT p99 plot.
func RunRouting(o RoutingOptions) ([]RoutingRow, error) {
	if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "fastroute-routing")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	meanP, meanO := meanLengths(o.Seed)
	fleetCap := fleetCapacity(routingFleet, meanP, meanO)
	fmt.Printf("fleet capacity %.1f req/s (mean prompt %.0f, answer %.0f tokens)\n", fleetCap, meanP, meanO)
	var rows []RoutingRow
	for _, load := range o.Loads {
		rate := load * fleetCap
		jobs := workload(o.Seed, rate, o.Warmup+o.Duration)
		at, err := runSetups(o, dir, routingFleet, RoutingRouters(), o.Routers, jobs, load, rate)
		if err != nil {
			return nil, fmt.Errorf("at %.0f%%: %w", load*100, err)
		}
		rows = append(rows, at...)
	}
	var table string
	if len(rows) > 0 {
		table = RoutingTable(rows, fleetCap, o)
	}
	if o.PDLoad > 0 {
		pdCap := fleetCapacity(pdFleet, meanP, meanO)
		jobs := workload(o.Seed, o.PDLoad*pdCap, o.Warmup+o.Duration)
		pd, err := runSetups(o, dir, pdFleet, PDSetups(), nil, jobs, o.PDLoad, o.PDLoad*pdCap)
		if err != nil {
			return nil, fmt.Errorf("prefill/decode: %w", err)
		}
		table += "\n" + PDTable(pd, pdCap)
	}
	if o.ConvLoad > 0 {
		conv, capacity, err := runConversations(o, dir)
		if err != nil {
			return nil, err
		}
		table += "\n" + ConvTable(conv, capacity, o.ConvMixed)
	}
	for _, j := range []struct {
		joiner
		load float64
	}{{fastJoiner, o.JoinLoad}, {slowJoiner, o.SlowJoinLoad}} {
		if j.load <= 0 {
			continue
		}
		join, startCap, err := runJoin(o, dir, j.joiner, j.load, meanP, meanO)
		if err != nil {
			return nil, err
		}
		if len(join) > 0 {
			table += "\n" + JoinTable(join, j.joiner, startCap, o.Duration)
		}
	}
	if o.RestartLoad > 0 {
		restart, err := runRestart(o, dir, fleetCap)
		if err != nil {
			return nil, err
		}
		if len(restart) > 0 {
			table += "\n" + RestartTable(restart, fleetCap, o.Duration)
		}
	}
	if err := os.WriteFile(filepath.Join(o.OutDir, "routing.md"), []byte(table), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(o.OutDir, "routing.svg"), []byte(RoutingPlot(rows)), 0o644); err != nil {
		return nil, err
	}
	fmt.Print("\n" + table)
	return rows, nil
}

// runSetups runs each of setups that names names (every one for none) on
// fleet with jobs, offered at load (rate per second), and returns their
// rows.
func runSetups(o RoutingOptions, dir string, fleet []simEngine, setups []RoutingRouter, names []string, jobs []job, load, rate float64) ([]RoutingRow, error) {
	var rows []RoutingRow
	for _, rt := range setups {
		if len(names) > 0 && !slices.Contains(names, rt.Name) {
			continue
		}
		row, err := runRoutingOnce(o, dir, fleet, rt, jobs)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", rt.Name, err)
		}
		row.Load, row.Offered = load, rate
		line := "  " + row.String()
		if fleet[0].prefixCache {
			line += fmt.Sprintf("  prefix cache hits %.0f%%", 100*row.CacheHits)
		}
		fmt.Println(line)
		rows = append(rows, row)
	}
	return rows, nil
}

// runRoutingOnce starts a fresh fleet and the router, replays jobs and
// measures the ones that arrive after the warm-up.
func runRoutingOnce(o RoutingOptions, dir string, fleet []simEngine, rt RoutingRouter, jobs []job) (RoutingRow, error) {
	var addrs []string
	var stops []func()
	defer func() {
		for _, s := range stops {
			s()
		}
	}()
	names := map[string]string{} // x-mock-worker id → engine name
	for i, e := range fleet {
		flags := e.flags()
		if o.MetricsDelay > 0 {
			flags = append(flags, "--metrics-delay", o.MetricsDelay.String())
		}
		if slices.Contains(o.NoMetrics, e.name) {
			flags = append(flags, "--no-metrics")
		}
		addr, stop, err := startMock(o.Binary, i+1, flags)
		if err != nil {
			return RoutingRow{}, err
		}
		addrs, stops = append(addrs, addr), append(stops, stop)
		names[strconv.Itoa(i+1)] = e.name
	}
	fronted, late := addrs, []string(nil)
	if rt.join != nil {
		fronted, late = addrs[:len(addrs)-joining], addrs[len(addrs)-joining:]
	}
	if rt.backends != nil {
		var stop func()
		var err error
		if fronted, stop, err = rt.backends(o.Binary, addrs); err != nil {
			return RoutingRow{}, err
		}
		stops = append(stops, stop)
	}
	front, p, err := rt.start(o.Binary, dir, fronted)
	if err != nil {
		return RoutingRow{}, err
	}
	stops = append(stops, func() { terminate(p) }) // the engines stop first: they end what they hold, so the router has no stream left to wait for
	if err := waitAnswer(front, "/v1/chat/completions", []byte(`{"model":"mock-model","max_tokens":1,"messages":[]}`)); err != nil {
		return RoutingRow{}, notUp(err, p)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4096, DisableCompression: true, IdleConnTimeout: time.Minute}}
	defer client.CloseIdleConnections()
	type outcome struct {
		ttft, e2e time.Duration
		tokens    int
		ok        bool
		worker    string
	}
	results := make([]outcome, len(jobs))
	var wg sync.WaitGroup
	var warm [2]float64 // prefix cache queries and hits at the warm-up's end
	var warmErr, joinErr error
	frontFor := func(job) string { return front }
	var restarted *exec.Cmd
	if rt.restarted {
		var next string
		up := make(chan struct{})
		wg.Go(func() {
			defer close(up)
			time.Sleep(o.Warmup)
			if next, restarted, joinErr = rt.start(o.Binary, dir, fronted); joinErr == nil {
				if err := waitListening(next); err != nil {
					joinErr = notUp(err, restarted)
				}
			}
		})
		frontFor = func(j job) string {
			if j.at < o.Warmup {
				return front
			}
			<-up
			return next
		}
	}
	if len(late) > 0 {
		wg.Go(func() {
			time.Sleep(o.Warmup)
			for i, a := range late {
				joinErr = cmp.Or(joinErr, rt.join(len(fronted)+i+1, a))
			}
		})
	}
	if fleet[0].prefixCache {
		wg.Go(func() {
			time.Sleep(o.Warmup)
			warm[0], warm[1], warmErr = prefixCache(addrs)
		})
	}
	began := time.Now()
	for i, j := range jobs {
		time.Sleep(time.Until(began.Add(j.at)))
		wg.Go(func() {
			ttft, e2e, tokens, worker, err := streamOnce(client, frontFor(j), j, o.Timeout)
			results[i] = outcome{ttft: ttft, e2e: e2e, tokens: tokens, ok: err == nil, worker: worker}
		})
	}
	wg.Wait()
	if restarted != nil {
		stops = append(stops, func() { terminate(restarted) })
	}
	if joinErr != nil {
		return RoutingRow{}, joinErr
	}
	row := RoutingRow{Router: rt.Name, Window: o.Duration, Timeout: o.Timeout, ByWorker: map[string]int{}}
	if fleet[0].prefixCache {
		queries, hits, err := prefixCache(addrs)
		if err = cmp.Or(warmErr, err); err != nil {
			return RoutingRow{}, err
		}
		if queries > warm[0] {
			row.CacheHits = (hits - warm[1]) / (queries - warm[0])
		}
	}
	for _, e := range fleet {
		row.WorkerList = append(row.WorkerList, e.name)
	}
	for i, j := range jobs {
		if j.at < o.Warmup {
			continue
		}
		r := results[i]
		if !r.ok {
			row.Failed++
			r.ttft, r.e2e = max(r.ttft, o.Timeout), o.Timeout // a failure is at least as slow as the timeout
		} else {
			row.Completed++
			row.ByWorker[names[r.worker]]++
			if r.tokens > 1 {
				row.ITL = append(row.ITL, (r.e2e-r.ttft)/time.Duration(r.tokens-1))
			}
		}
		row.TTFT = append(row.TTFT, r.ttft)
		row.E2E = append(row.E2E, r.e2e)
	}
	slices.Sort(row.TTFT)
	slices.Sort(row.E2E)
	slices.Sort(row.ITL)
	return row, nil
}

// chatBody is a streaming chat request of about prompt tokens (the engine
// counts 4 bytes of body a token) asking for out tokens.
func chatBody(prompt, out int) []byte {
	head := fmt.Sprintf(`{"model":"mock-model","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"`, out)
	tail := `"}]}`
	n := max(4*prompt-len(head)-len(tail), 1)
	return []byte(head + strings.Repeat("x", n) + tail)
}

// streamOnce sends one streaming request and times its first token and its
// end, counting its tokens; worker is the answering engine's x-mock-worker
// header.
func streamOnce(client *http.Client, addr string, j job, timeout time.Duration) (ttft, e2e time.Duration, tokens int, worker string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	body := j.body
	if body == nil {
		body = chatBody(j.prompt, j.out)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return 0, 0, 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	t := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return time.Since(t), time.Since(t), 0, "", err
	}
	defer resp.Body.Close()
	worker = resp.Header.Get("x-mock-worker")
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return time.Since(t), time.Since(t), 0, worker, fmt.Errorf("status %d", resp.StatusCode)
	}
	rd := bufio.NewReader(resp.Body)
	for {
		line, rerr := rd.ReadSlice('\n')
		if bytes.HasPrefix(line, []byte("data: {")) {
			if tokens++; ttft == 0 {
				ttft = time.Since(t)
			}
		}
		if bytes.HasPrefix(line, []byte("data: [DONE]")) {
			return ttft, time.Since(t), tokens, worker, nil
		}
		if rerr != nil && rerr != bufio.ErrBufferFull {
			if ttft == 0 {
				ttft = time.Since(t)
			}
			return ttft, time.Since(t), tokens, worker, fmt.Errorf("stream cut: %w", rerr)
		}
	}
}

// String is the row as one progress line.
func (r RoutingRow) String() string {
	return fmt.Sprintf("%3.0f%% %-36s TTFT p50 %8s p99 %8s  e2e p50 %8s p99 %8s  %5.1f req/s  %d failed  %s",
		r.Load*100, r.Router, r.lat(r.TTFT, 0.5), r.lat(r.TTFT, 0.99), r.lat(r.E2E, 0.5), r.lat(r.E2E, 0.99),
		r.RPS(), r.Failed, r.Shares())
}

// RPS is the completed requests per second of the measured window.
func (r RoutingRow) RPS() float64 { return float64(r.Completed) / r.Window.Seconds() }

// Shares formats each engine's share of the completed requests.
func (r RoutingRow) Shares() string {
	var parts []string
	for _, w := range r.WorkerList {
		share := 0.0
		if r.Completed > 0 {
			share = 100 * float64(r.ByWorker[w]) / float64(r.Completed)
		}
		parts = append(parts, fmt.Sprintf("%.0f", share))
	}
	return strings.Join(parts, "/")
}

// RoutingTable formats the rows as Markdown, with the default mode's TTFT
// p99 and throughput beside nginx least_conn's at each load.
func RoutingTable(rows []RoutingRow, fleetCap float64, o RoutingOptions) string {
	var b strings.Builder
	var names []string
	for _, e := range routingFleet {
		name := fmt.Sprintf("%s (%d slots, speed %.2f", e.name, e.slots, e.speed)
		if slices.Contains(o.NoMetrics, e.name) {
			name += ", no metrics"
		}
		names = append(names, name+")")
	}
	if o.MetricsDelay > 0 {
		names[len(names)-1] += fmt.Sprintf("; metrics pages %v late", o.MetricsDelay)
	}
	fmt.Fprintf(&b, "Fleet: %s; fleet capacity %.1f req/s; Poisson arrivals, %v warm-up then %v measured per router and load, timeout %v, seed %d; %d CPUs, %s\n\n",
		strings.Join(names, ", "), fleetCap, o.Warmup, o.Duration, o.Timeout, o.Seed, runtime.NumCPU(), time.Now().UTC().Format("2006-01-02"))
	fmt.Fprintf(&b, "| load | router | TTFT p50 | TTFT p99 | e2e p50 | e2e p99 | completed req/s | failed | share %% (%s) | TTFT p99 vs nginx least_conn |\n",
		strings.Join(rows[0].WorkerList, "/"))
	b.WriteString("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |\n")
	for _, r := range rows {
		ref := "-"
		for _, n := range rows {
			if n.Load == r.Load && n.Router == "nginx least_conn" {
				ref = ratio(float64(pct(r.TTFT, 0.99)), float64(pct(n.TTFT, 0.99)))
				if pct(n.TTFT, 0.99) >= n.Timeout && n.Router != r.Router {
					ref = "≤ " + ref // nginx's own p99 is a failure: at least the timeout
				}
			}
		}
		fmt.Fprintf(&b, "| %.0f%% | %s | %s | %s | %s | %s | %.1f | %d | %s | %s |\n", r.Load*100, r.Router,
			r.lat(r.TTFT, 0.5), r.lat(r.TTFT, 0.99), r.lat(r.E2E, 0.5), r.lat(r.E2E, 0.99),
			r.RPS(), r.Failed, r.Shares(), ref)
	}
	return b.String()
}

// PDTable formats the prefill/decode comparison: TTFT and the gap between
// tokens, aggregated and disaggregated on the same engines.
func PDTable(rows []RoutingRow, fleetCap float64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Prefill/decode disaggregation, the same three engines (like gpu-a; %.1f req/s run whole) at %.0f%% of that:\n\n",
		fleetCap, 100*rows[0].Load)
	fmt.Fprintf(&b, "| setup | TTFT p50 | TTFT p99 | inter-token p50 | inter-token p99 | e2e p99 | completed req/s | failed | share %% (%s) |\n",
		strings.Join(rows[0].WorkerList, "/"))
	b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %.1f | %d | %s |\n", r.Router, r.lat(r.TTFT, 0.5), r.lat(r.TTFT, 0.99),
			fmtDur(pct(r.ITL, 0.5)), fmtDur(pct(r.ITL, 0.99)), r.lat(r.E2E, 0.99), r.RPS(), r.Failed, r.Shares())
	}
	return b.String()
}

// routerColors are the plot's line colors, one per router in order.
var routerColors = []string{"#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#d62728", "#ff7f0e", "#2ca02c", "#7f7f7f"}

// RoutingPlot draws TTFT p99 against offered load, one line per router, on
// a log scale, as a standalone SVG.
func RoutingPlot(rows []RoutingRow) string {
	var routers []string
	var loads []float64
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range rows {
		if !slices.Contains(routers, r.Router) {
			routers = append(routers, r.Router)
		}
		if !slices.Contains(loads, r.Load) {
			loads = append(loads, r.Load)
		}
		if v := float64(pct(r.TTFT, 0.99)); v > 0 {
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
	}
	const pw, ph, left, top = 560.0, 360.0, 80.0, 40.0
	width, height := left+pw+300, top+ph+60
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", width, height)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	if math.IsInf(lo, 0) {
		b.WriteString("</svg>\n")
		return b.String()
	}
	hi = math.Pow(10, math.Ceil(math.Log10(hi)))
	y, _ := logPanel(&b, left, top, pw, ph, lo, hi, "TTFT p99 by offered load (log scale), simulated heterogeneous fleet")
	x := func(i int) float64 { return left + pw*(float64(i)+0.5)/float64(len(loads)) }
	for i, l := range loads {
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">%.0f%% of capacity</text>`+"\n", x(i), top+ph+18, l*100)
	}
	if t := float64(rows[0].Timeout); t > 0 && t <= hi {
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#333" stroke-dasharray="6,4"/>`+"\n", left, left+pw, y(t), y(t))
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end">timeout: routers on this line failed requests</text>`+"\n", left+pw-5, y(t)-5)
	}
	for k, name := range routers {
		c := routerColors[k%len(routerColors)]
		var pts []string
		for i, l := range loads {
			for _, r := range rows {
				if r.Router == name && r.Load == l {
					pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(i), y(float64(pct(r.TTFT, 0.99)))))
				}
			}
		}
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(pts, " "), c)
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="14" height="4" fill="%s"/><text x="%.0f" y="%.0f">%s</text>`+"\n",
			left+pw+20, top+10+float64(k)*20, c, left+pw+40, top+15+float64(k)*20, name)
	}
	b.WriteString("</svg>\n")
	return b.String()
}
