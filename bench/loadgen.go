// Package bench holds fastroute's load generator and the routing-overhead
// comparison; the micro-benchmarks live beside the code they measure.
package bench

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// Result summarises one load run.
type Result struct {
	Name     string
	Requests int
	Errors   int
	Elapsed  time.Duration
	P50, P99 time.Duration
	// CPUPerRequest is the front end's CPU time (its process and children,
	// from /proc) divided by the requests; PeakRSS its peak resident set.
	// Both zero for the direct runs.
	CPUPerRequest time.Duration
	// UserCPUPerRequest is the user-space part of CPUPerRequest (the rest
	// is the kernel's: system calls, the loopback's TCP, wake-ups).
	UserCPUPerRequest time.Duration
	PeakRSS           int64
	sorted            []time.Duration // every successful request's latency, ascending
}

// Percentile returns the latency below which a share q (0..1) of the
// successful requests finished.
func (r Result) Percentile(q float64) time.Duration {
	if len(r.sorted) == 0 {
		return 0
	}
	return r.sorted[min(int(q*float64(len(r.sorted))), len(r.sorted)-1)]
}

// RPS returns successful requests per second (0 for a run that did not
// run).
func (r Result) RPS() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Elapsed.Seconds()
}

// Load drives addr with conns keep-alive connections, each sending the POST
// body to path back to back for dur, and measures every request's latency.
func Load(name, addr, path string, body []byte, conns int, dur time.Duration) Result {
	return LoadSpread(name, []string{addr}, path, body, conns, dur)
}

// LoadSpread is Load with the connections spread round-robin over addrs
// (direct-to-worker runs over several workers).
func LoadSpread(name string, addrs []string, path string, body []byte, conns int, dur time.Duration) Result {
	hcs := make([]*fasthttp.HostClient, len(addrs))
	for i, a := range addrs {
		hcs[i] = &fasthttp.HostClient{Addr: a, MaxConns: conns, MaxIdemponentCallAttempts: 1, ReadTimeout: 10 * time.Second}
	}
	lat := make([][]time.Duration, conns)
	errs := make([]int, conns)
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(dur)
	for c := 0; c < conns; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hc, addr := hcs[c%len(hcs)], addrs[c%len(addrs)]
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			req.SetRequestURI("http://" + addr + path)
			req.Header.SetMethod(fasthttp.MethodPost)
			req.Header.SetContentType("application/json")
			req.SetBody(body)
			own := make([]time.Duration, 0, 1<<16)
			for {
				t := time.Now()
				if t.After(deadline) {
					break
				}
				if err := hc.Do(req, resp); err != nil || resp.StatusCode() != fasthttp.StatusOK {
					errs[c]++
					continue
				}
				own = append(own, time.Since(t))
			}
			lat[c] = own
		}()
	}
	wg.Wait()
	all := slices.Concat(lat...)
	slices.Sort(all)
	r := Result{Name: name, Requests: len(all), Elapsed: time.Since(start), sorted: all}
	for _, e := range errs {
		r.Errors += e
	}
	r.P50, r.P99 = r.Percentile(0.50), r.Percentile(0.99)
	return r
}

// String formats one table row.
func (r Result) String() string {
	line := fmt.Sprintf("%-12s %10.0f req/s  p50 %8s  p99 %8s  (%d ok, %d errors)",
		r.Name, r.RPS(), r.P50.Round(time.Microsecond), r.P99.Round(time.Microsecond), r.Requests, r.Errors)
	if r.CPUPerRequest > 0 {
		line += fmt.Sprintf("  CPU %.1f µs/req (user %.1f), peak RSS %.1f MiB",
			micros(r.CPUPerRequest), micros(r.UserCPUPerRequest), float64(r.PeakRSS)/(1<<20))
	}
	return line
}
