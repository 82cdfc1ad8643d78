// Package health probes workers, marks them healthy or not in the registry,
// refreshes the models each one advertises, readmits ejected workers whose
// time is up and forgets the workers the registry removed.
package health

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/internal/bearer"
	"github.com/fastroute/fastroute/internal/dialer"
	"github.com/fastroute/fastroute/internal/every"
	"github.com/fastroute/fastroute/internal/workerclient"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
)

// Options configures a Checker.
type Options struct {
	Interval time.Duration
	// Timeout bounds one probe (and the listing read after it); 0: the
	// interval.
	Timeout time.Duration
	// Path is what a probe GETs of a worker whose spec names no
	// HealthPath.
	Path           string
	UnhealthyAfter int
	Logger         *slog.Logger
	// APIKey, when set, goes as "Authorization: Bearer <key>" on every
	// probe (an engine started with --api-key lists its models only then);
	// a reload may change it.
	APIKey *bearer.Token
	// TLS is the configuration of probes to https:// workers (default:
	// the system's roots).
	TLS *tls.Config
}

// MaxAnswerBytes bounds what a probe reads of an answer: a /v1/models
// listing of a thousand adapters is a few hundred KiB; a larger answer
// fails the probe (or leaves the worker's models as they were) instead of
// filling memory.
const MaxAnswerBytes = 4 << 20

// Checker runs the probes. Its failure counts are guarded by mu (Run,
// Check and CheckOnce callers and the registry's removals share them).
type Checker struct {
	reg      *dataplane.Registry
	opts     Options
	client   atomic.Pointer[fasthttp.Client] // of the workers over TCP; SetTLS replaces it
	dial     fasthttp.DialFuncWithTimeout
	sockets  map[string]*fasthttp.HostClient // the clients of workers on unix sockets, by path
	failures map[uint64]int
	every    *every.Period // Options.Interval as it is now (SetProbes)
	mu       sync.Mutex    // guards failures between Run and Check callers, sockets and opts
}

// New returns a Checker over reg.
func New(reg *dataplane.Registry, opts Options) *Checker {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Timeout <= 0 {
		opts.Timeout = opts.Interval
	}
	c := &Checker{
		reg: reg, opts: opts, failures: map[uint64]int{}, sockets: map[string]*fasthttp.HostClient{}, every: every.NewPeriod(opts.Interval),
		// Both address families: a worker on an IPv6 address, or a name
		// with only AAAA records, is reachable; a name is looked up again
		// every dataplane.NameCacheTime, its addresses raced.
		dial: (&dialer.Dialer{CacheTime: dataplane.NameCacheTime}).Dial,
	}
	c.client.Store(workerclient.TCP(probeClient(opts), opts.TLS, c.dial))
	reg.Subscribe(c.workerChanged)
	return c
}

// SetTLS replaces Options.TLS (a reload): the next probe of an https://
// worker connects under conf, and the connections kept under the old one
// close (workerclient.Retire).
func (c *Checker) SetTLS(conf *tls.Config) {
	c.mu.Lock()
	c.opts.TLS = conf
	timeout := c.opts.Timeout
	c.mu.Unlock()
	c.renewClients(timeout)
}

// SetProbes changes Options.Interval, Timeout (0: the interval) and Path
// (a reload): the next round of probes goes one new interval from now
// (every.Period), within the new timeout, to the new path.
func (c *Checker) SetProbes(interval, timeout time.Duration, path string) {
	if timeout <= 0 {
		timeout = interval
	}
	c.mu.Lock()
	was := c.opts.Timeout
	c.opts.Timeout, c.opts.Path = timeout, path
	c.mu.Unlock()
	if timeout != was { // the clients' own read and write timeouts
		c.renewClients(max(was, timeout))
	}
	c.every.Set(interval)
}

// renewClients replaces the probes' clients with ones made under the
// options as they are now, the old ones retired once their probes under
// way ended, each within timeout (workerclient.Retire): the client of the
// workers over TCP now, those of the workers on unix sockets as each is
// next probed.
func (c *Checker) renewClients(timeout time.Duration) {
	c.mu.Lock()
	opts, sockets := c.opts, c.sockets
	c.sockets = map[string]*fasthttp.HostClient{}
	old := c.client.Swap(workerclient.TCP(probeClient(opts), opts.TLS, c.dial))
	c.mu.Unlock()
	workerclient.Retire(old, timeout)
	for _, hc := range sockets {
		workerclient.Retire(hc, timeout)
	}
}

// workerChanged forgets the probe failures of a worker that left the
// registry.
func (c *Checker) workerChanged(w *dataplane.Worker, change dataplane.Change) {
	if change != dataplane.Removed {
		return
	}
	c.mu.Lock()
	delete(c.failures, w.ID())
	if hc := c.sockets[w.Spec().Socket()]; hc != nil {
		hc.CloseIdleConnections()
		delete(c.sockets, w.Spec().Socket())
	}
	c.mu.Unlock()
	c.opts.Logger.Info("drained worker removed", "worker", w.ID())
}

// SetUnhealthyAfter changes how many failed probes in a row take a worker
// out of rotation, from the next probe on (a reload).
func (c *Checker) SetUnhealthyAfter(n int) {
	c.mu.Lock()
	c.opts.UnhealthyAfter = n
	c.mu.Unlock()
}

// Run probes every Interval until ctx ends, then closes the connections
// the probes kept alive.
func (c *Checker) Run(ctx context.Context) {
	defer c.closeIdle()
	c.every.Loop(ctx, c.CheckOnce)
}

// closeIdle closes the probes' idle connections, over TCP and to the
// workers on unix sockets.
func (c *Checker) closeIdle() {
	c.client.Load().CloseIdleConnections()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, hc := range c.sockets {
		hc.CloseIdleConnections()
	}
}

// CheckOnce probes every registered worker once, in parallel.
func (c *Checker) CheckOnce() { c.check(c.reg.All()) }

// Check probes the registered workers of ids once, in parallel, and no
// other: a worker just added (the admin API, a reload, discovery) is
// routable once it answers, and one just moved to another URL judged, with
// no probe of the rest, whose failures would count toward their
// unhealthy_after as a round's do (one such round for each of many workers
// added at once counted a worker's one slow answer many times over).
func (c *Checker) Check(ids ...uint64) {
	workers := make([]*dataplane.Worker, 0, len(ids))
	for _, id := range ids {
		if w, ok := c.reg.Get(id); ok {
			workers = append(workers, w)
		}
	}
	c.check(workers)
}

// check probes workers once, in parallel, and counts what each probe found
// (a worker on probation is out at its first failed probe:
// Worker.OnProbation).
func (c *Checker) check(workers []*dataplane.Worker) {
	c.mu.Lock()
	probePath, timeout := c.opts.Path, c.opts.Timeout
	c.mu.Unlock()
	ok := make([]bool, len(workers))
	models := make([]*dataplane.Advertised, len(workers))
	var wg sync.WaitGroup
	for i, w := range workers {
		if w.Draining() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			spec := w.Spec()
			path := probePath
			if spec.HealthPath != "" {
				path = spec.HealthPath
			}
			ok[i] = c.probe(spec, path, timeout)
			if ok[i] {
				models[i] = c.models(spec, timeout)
			}
		}()
	}
	wg.Wait()
	c.mu.Lock()
	changed := false
	for i, w := range workers {
		id := w.ID()
		if cur, registered := c.reg.Get(id); w.Draining() || !registered || cur != w {
			continue // replaced while probed (another URL, maybe): the next probe judges the new one
		}
		if ok[i] {
			if models[i] != nil && w.SetAdvertised(*models[i]) {
				changed = true
			}
			if !w.Healthy() {
				c.opts.Logger.Info("worker healthy again", "worker", id)
				c.reg.Uneject(id) // it was down and came back: its old failures say little now
			}
			c.failures[id] = 0
			c.reg.SetHealthy(id, true)
			continue
		}
		c.failures[id]++
		if (c.failures[id] >= c.opts.UnhealthyAfter || w.OnProbation()) && w.Healthy() {
			c.opts.Logger.Warn("worker unhealthy", "worker", id, "failed_probes", c.failures[id])
			c.reg.SetHealthy(id, false)
		}
	}
	if changed {
		c.reg.Republish() // LoRA residency and base models follow the listings
	}
	for _, id := range c.reg.Readmit(time.Now()) {
		c.opts.Logger.Info("ejected worker back in rotation", "worker", id)
	}
	c.mu.Unlock()
}

// get fetches path of w within the probe timeout, with the API key if
// set.
func (c *Checker) get(w *dataplane.WorkerSpec, path string, timeout time.Duration) (status int, body []byte, err error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(w.BaseURL() + path)
	if auth := c.opts.APIKey.Header(); auth != nil {
		req.Header.SetBytesV(fasthttp.HeaderAuthorization, auth)
	}
	if err = c.clientOf(w).DoTimeout(req, resp, timeout); err != nil {
		return 0, nil, err
	}
	return resp.StatusCode(), append([]byte(nil), resp.Body()...), nil
}

// clientOf is the client of w's probes: the one of every worker over
// TCP, or one of w's unix socket's own, which dials it.
func (c *Checker) clientOf(w *dataplane.WorkerSpec) interface {
	DoTimeout(*fasthttp.Request, *fasthttp.Response, time.Duration) error
} {
	sock := w.Socket()
	if sock == "" {
		return c.client.Load()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	hc := c.sockets[sock]
	if hc == nil {
		timeout := c.opts.Timeout
		hc = workerclient.Socket(probeClient(c.opts), w.Host(), func(string) (net.Conn, error) { return net.DialTimeout("unix", sock, timeout) })
		c.sockets[sock] = hc
	}
	return hc
}

func (c *Checker) probe(w *dataplane.WorkerSpec, path string, timeout time.Duration) bool {
	status, _, err := c.get(w, path, timeout)
	if err != nil || status != fasthttp.StatusOK {
		c.opts.Logger.Debug("health probe failed", "url", w.URL, "path", path, "status", status, "err", err)
		return false
	}
	return true
}

// contextLen is the context length a /v1/models entry lists: vLLM's and
// SGLang's max_model_len, llama.cpp's meta.n_ctx (a slot's: llama-server
// divides its context among its --parallel slots); 0: none.
func contextLen(entry *fastjson.Value) int {
	if n := entry.GetInt("max_model_len"); n > 0 {
		return n
	}
	return max(entry.GetInt("meta", "n_ctx"), 0)
}

// models reads an OpenAI /v1/models answer: entries with a parent are LoRA
// adapters, the others base models. Nil when unreadable.
func (c *Checker) models(w *dataplane.WorkerSpec, timeout time.Duration) *dataplane.Advertised {
	status, body, err := c.get(w, "/v1/models", timeout)
	if err != nil || status != fasthttp.StatusOK {
		return nil
	}
	v, err := fastjson.ParseBytes(body)
	if err != nil {
		return nil
	}
	out := &dataplane.Advertised{Models: []string{}, Adapters: []string{}, Entries: map[string]json.RawMessage{}, Contexts: map[string]int{}}
	for _, m := range v.GetArray("data") {
		id := m.GetStringBytes("id")
		if len(id) == 0 || m.Type() != fastjson.TypeObject {
			continue
		}
		out.Entries[string(id)] = m.MarshalTo(nil)
		length := contextLen(m)
		if length > 0 {
			out.Contexts[string(id)] = length
		}
		if len(m.GetStringBytes("parent")) > 0 {
			out.Adapters = append(out.Adapters, string(id))
		} else {
			out.Models = append(out.Models, string(id))
			out.MaxModelLen = max(out.MaxModelLen, length)
		}
	}
	return out
}

// probeClient is the probes' clients' options: an answer over
// MaxAnswerBytes fails.
func probeClient(opts Options) workerclient.Options {
	return workerclient.Options{Name: "fastroute-health", Timeout: opts.Timeout, MaxBody: MaxAnswerBytes}
}
