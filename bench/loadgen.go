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
}

// RPS returns successful requests per second.
func (r Result) RPS() float64 { return float64(r.Requests) / r.Elapsed.Seconds() }

// Load drives addr with conns keep-alive connections, each sending the POST
// body to path back to back for dur, and measures every request's latency.
func Load(name, addr, path string, body []byte, conns int, dur time.Duration) Result {
	hc := &fasthttp.HostClient{Addr: addr, MaxConns: conns, MaxIdemponentCallAttempts: 1, ReadTimeout: 10 * time.Second}
	lat := make([][]time.Duration, conns)
	errs := make([]int, conns)
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(dur)
	for c := 0; c < conns; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
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
	r := Result{Name: name, Requests: len(all), Elapsed: time.Since(start)}
	for _, e := range errs {
		r.Errors += e
	}
	if len(all) > 0 {
		r.P50 = all[len(all)/2]
		r.P99 = all[len(all)*99/100]
	}
	return r
}

// String formats one table row.
func (r Result) String() string {
	return fmt.Sprintf("%-12s %10.0f req/s  p50 %8s  p99 %8s  (%d ok, %d errors)",
		r.Name, r.RPS(), r.P50.Round(time.Microsecond), r.P99.Round(time.Microsecond), r.Requests, r.Errors)
}
