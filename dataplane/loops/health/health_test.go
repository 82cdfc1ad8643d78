package health

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// probing is a Checker of o (probes at /health, logs discarded) over a
// registry of one worker, id 1, at url.
func probing(t *testing.T, url string, o Options) (*Checker, *dataplane.Registry, *dataplane.Worker) {
	t.Helper()
	reg := dataplane.NewRegistry()
	w, err := reg.AddUnprobed(dataplane.WorkerSpec{ID: 1, URL: url})
	require.NoError(t, err)
	o.Path, o.Logger = "/health", slog.New(slog.NewTextHandler(io.Discard, nil))
	return New(reg, o), reg, w
}

// A worker whose probes fail UnhealthyAfter times in a row leaves
// rotation and comes back at its first good probe; the models it lists
// are learned; the failures of a removed worker are forgotten.
func TestProbesMarkWorkersAndLearnModels(t *testing.T) {
	var failing atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case failing.Load():
			http.Error(w, "down", http.StatusServiceUnavailable)
		case r.URL.Path == "/v1/models":
			_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"base-m","object":"model"},{"id":"lora-a","object":"model","parent":"base-m"}]}`)
		default:
			_, _ = io.WriteString(w, "ok")
		}
	}))
	defer srv.Close()
	c, reg, w := probing(t, srv.URL, Options{Interval: 100 * time.Millisecond, UnhealthyAfter: 2})

	c.CheckOnce()
	assert.True(t, w.Healthy(), "routable after its first good probe")
	assert.Equal(t, []string{"base-m"}, w.Advertised().Models)
	assert.Equal(t, []string{"lora-a"}, w.Advertised().Adapters)

	failing.Store(true)
	c.CheckOnce()
	assert.True(t, w.Healthy(), "one failed probe is not enough")
	c.CheckOnce()
	assert.False(t, w.Healthy())
	assert.Zero(t, reg.Snapshot().Len())

	failing.Store(false)
	c.CheckOnce()
	assert.True(t, w.Healthy(), "back at the first good probe")

	failing.Store(true)
	c.CheckOnce()
	require.NoError(t, reg.Drain(1))
	reg.SweepDrained()
	c.mu.Lock()
	assert.Empty(t, c.failures, "a removed worker's failures are forgotten")
	c.mu.Unlock()
}

// Check probes the workers it is given and no other: a worker a reload,
// the admin API or discovery just added is probed alone, and the failing
// probes of the others count only in their rounds (one round for each of
// many workers added at once counted a failing worker's probe as many
// times). An id not registered is passed over.
func TestCheckProbesOnlyTheWorkersItIsGiven(t *testing.T) {
	var failing atomic.Bool
	var probed [2]atomic.Int64
	reg := dataplane.NewRegistry()
	for i := range probed {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/health" {
				return
			}
			probed[i].Add(1)
			if i == 0 && failing.Load() {
				http.Error(w, "down", http.StatusServiceUnavailable)
			}
		}))
		defer srv.Close()
		_, err := reg.AddUnprobed(dataplane.WorkerSpec{ID: uint64(i + 1), URL: srv.URL})
		require.NoError(t, err)
	}
	c := New(reg, Options{Interval: time.Second, Path: "/health", UnhealthyAfter: 2, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	c.CheckOnce()
	w1, _ := reg.Get(1)
	w2, _ := reg.Get(2)
	require.True(t, w1.Healthy())
	require.True(t, w2.Healthy())

	failing.Store(true)
	for range 3 {
		c.Check(2)
	}
	c.Check(7)
	assert.EqualValues(t, 1, probed[0].Load(), "worker 1 probed in the round alone")
	assert.EqualValues(t, 4, probed[1].Load())
	assert.True(t, w1.Healthy())
	c.CheckOnce()
	assert.True(t, w1.Healthy(), "one failed probe is not enough")
	c.CheckOnce()
	assert.False(t, w1.Healthy(), "two in a row are")
	assert.True(t, w2.Healthy())
}

// A worker given another URL (another engine) is on probation: its first
// failed probe takes it out of rotation, where a worker at its own URL
// needs UnhealthyAfter; a probe that passes ends the probation. A verdict
// on a worker replaced while it was probed is left to the next probe.
func TestAWorkerAtAnotherURLIsOutAtItsFirstFailedProbe(t *testing.T) {
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	defer down.Close()
	var up atomic.Bool
	flaky := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if !up.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
		}
	}))
	defer flaky.Close()
	ok := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer ok.Close()
	c, reg, _ := probing(t, ok.URL, Options{Interval: time.Hour, UnhealthyAfter: 3})
	c.CheckOnce()
	w, _ := reg.Get(1)
	require.True(t, w.Healthy())

	_, err := reg.Replace(dataplane.WorkerSpec{ID: 1, URL: down.URL})
	require.NoError(t, err)
	w, _ = reg.Get(1)
	require.True(t, w.OnProbation())
	require.True(t, w.Healthy(), "the verdict before, until its probe")
	c.Check(1)
	assert.False(t, w.Healthy(), "out at its first failed probe")
	assert.False(t, w.OnProbation())

	_, err = reg.Replace(dataplane.WorkerSpec{ID: 1, URL: ok.URL})
	require.NoError(t, err)
	c.Check(1)
	w, _ = reg.Get(1)
	require.True(t, w.Healthy())
	_, err = reg.Replace(dataplane.WorkerSpec{ID: 1, URL: flaky.URL})
	require.NoError(t, err)
	up.Store(true)
	c.Check(1)
	w, _ = reg.Get(1)
	assert.False(t, w.OnProbation(), "a probe passed")
	up.Store(false)
	c.Check(1)
	c.Check(1)
	assert.True(t, w.Healthy(), "off probation: two failures are under UnhealthyAfter")
	c.Check(1)
	assert.False(t, w.Healthy())

	// Replaced while its probe is under way: that probe judges nothing.
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	held := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		select {
		case arrived <- struct{}{}:
		default:
		}
		<-release
	}))
	defer held.Close()
	_, err = reg.Replace(dataplane.WorkerSpec{ID: 1, URL: held.URL})
	require.NoError(t, err)
	done := make(chan struct{})
	go func() { c.Check(1); close(done) }()
	<-arrived
	_, err = reg.Replace(dataplane.WorkerSpec{ID: 1, URL: down.URL})
	require.NoError(t, err)
	close(release)
	<-done
	w, _ = reg.Get(1)
	assert.True(t, w.OnProbation(), "the probe of the engine before judged nothing")
}

// A probe waits Timeout, not the interval, when one is set: SGLang's
// /health runs a generation and answers a second later at the earliest,
// past an interval of a second.
func TestAProbeWaitsItsTimeout(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			time.Sleep(250 * time.Millisecond)
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	for _, c := range []struct {
		timeout time.Duration
		healthy bool
	}{{0, false}, {time.Second, true}} {
		reg := dataplane.NewRegistry()
		_, err := reg.AddUnprobed(dataplane.WorkerSpec{ID: 1, URL: srv.URL})
		require.NoError(t, err)
		New(reg, Options{Interval: 100 * time.Millisecond, Timeout: c.timeout, Path: "/health", UnhealthyAfter: 1,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}).CheckOnce()
		w, _ := reg.Get(1)
		assert.Equal(t, c.healthy, w.Healthy(), "timeout %v", c.timeout)
	}
}

// The context length a listing gives is learned: vLLM's and SGLang's
// max_model_len (the longest of the base models'), llama.cpp's per-slot
// meta.n_ctx (not its n_ctx_train); none listed is 0.
func TestProbesLearnContextLengths(t *testing.T) {
	var listing atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			_, _ = io.WriteString(w, listing.Load().(string))
		}
	}))
	defer srv.Close()
	c, _, w := probing(t, srv.URL, Options{Interval: time.Second, UnhealthyAfter: 2})
	for _, l := range []struct {
		listing string
		context int
	}{
		{`{"object":"list","data":[{"id":"m","object":"model","owned_by":"vllm","max_model_len":32768},` +
			`{"id":"small","object":"model","max_model_len":4096},{"id":"lora","object":"model","parent":"m","max_model_len":65536}]}`, 32768},
		{`{"object":"list","data":[{"id":"m","object":"model","owned_by":"sglang","root":"m","parent":null,"max_model_len":131072}]}`, 131072},
		{`{"object":"list","data":[{"id":"m.gguf","object":"model","owned_by":"llamacpp","meta":{"n_vocab":151936,"n_ctx":4096,"n_ctx_train":40960}}]}`, 4096},
		{`{"object":"list","data":[{"id":"m","object":"model","owned_by":"llamacpp","meta":{"n_ctx_train":40960}}]}`, 0},
		{`{"object":"list","data":[{"id":"m","object":"model","max_model_len":-5}]}`, 0},
	} {
		listing.Store(l.listing)
		c.CheckOnce()
		assert.Equal(t, l.context, w.ContextLen(), l.listing)
	}
}

// An answer over MaxAnswerBytes is not read whole: a /v1/models listing
// that large leaves the worker's models unlearned.
func TestAProbeReadsNoMoreThanItsBound(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"big-m","object":"model"}],"pad":"`+
				strings.Repeat("x", MaxAnswerBytes)+`"}`)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	c, _, w := probing(t, srv.URL, Options{Interval: time.Second, UnhealthyAfter: 2})
	c.CheckOnce()
	assert.True(t, w.Healthy())
	assert.Empty(t, w.Advertised().Models)
}

// A worker whose spec names a health_path is probed there, the others at
// the config's path: an Ollama beside vLLM engines answers /api/version
// and has no /health.
func TestAWorkersHealthPathReplacesTheFleets(t *testing.T) {
	var asked sync.Map // paths asked
	ollama := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Store(r.URL.Path, true)
		if r.URL.Path != "/api/version" && r.URL.Path != "/v1/models" {
			http.NotFound(w, r)
			return
		}
		_, _ = io.WriteString(w, `{"version":"0.12.3"}`)
	}))
	defer ollama.Close()
	reg := dataplane.NewRegistry()
	for id, path := range map[uint64]string{1: "/api/version", 2: ""} {
		_, err := reg.AddUnprobed(dataplane.WorkerSpec{ID: id, URL: ollama.URL, HealthPath: path})
		require.NoError(t, err)
	}
	c := New(reg, Options{Interval: 100 * time.Millisecond, Path: "/health", UnhealthyAfter: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	c.CheckOnce()
	w1, _ := reg.Get(1)
	w2, _ := reg.Get(2)
	assert.True(t, w1.Healthy(), "probed at its own path")
	assert.False(t, w2.Healthy(), "probed at /health, which this engine has not")
	_, ok := asked.Load("/health")
	assert.True(t, ok)

	bad := dataplane.WorkerSpec{ID: 3, URL: ollama.URL, HealthPath: "api/version"}
	assert.ErrorContains(t, bad.Normalize(), `health_path: "api/version" must start with /`)
}

// An engine closes a kept-alive connection once it idled for its
// keep-alive timeout (uvicorn's 5 s, vLLM's and SGLang's): with probes
// further apart than that, each finds its connection closed, and is made
// again on a new one, not failed.
func TestAProbeOnAConnectionTheWorkerClosedIsMadeAgain(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	srv.Config.IdleTimeout = 50 * time.Millisecond
	srv.Start()
	defer srv.Close()
	c, _, w := probing(t, srv.URL, Options{Interval: time.Second, UnhealthyAfter: 1})
	for i := range 4 {
		c.CheckOnce()
		require.True(t, w.Healthy(), "probe %d", i)
		time.Sleep(200 * time.Millisecond) // past the worker's keep-alive
	}
}

// SetProbes applies a new interval at once (the next round one new
// interval after the last, not after the old interval's wait), a new path
// and a new timeout, longer or shorter, to the next round.
func TestSetProbesAppliesToTheNextRound(t *testing.T) {
	var slow atomic.Bool
	var atHealth, atReady atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			atHealth.Add(1)
		case "/ready":
			atReady.Add(1)
			if slow.Load() {
				time.Sleep(300 * time.Millisecond)
			}
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	c, _, w := probing(t, srv.URL, Options{Interval: time.Hour, Timeout: 100 * time.Millisecond, UnhealthyAfter: 1})
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	defer func() { stop(); <-done }()
	require.Eventually(t, func() bool { return atHealth.Load() == 1 && w.Healthy() }, 5*time.Second, 5*time.Millisecond, "the first round")

	c.SetProbes(20*time.Millisecond, 0, "/ready")
	require.Eventually(t, func() bool { return atReady.Load() >= 3 }, 5*time.Second, 5*time.Millisecond,
		"rounds every 20 ms from now, not an hour after the first")
	assert.EqualValues(t, 1, atHealth.Load(), "at the new path")

	slow.Store(true)
	require.Eventually(t, func() bool { return !w.Healthy() }, 5*time.Second, 5*time.Millisecond, "300 ms is over the timeout of 20 ms (the interval)")
	c.SetProbes(20*time.Millisecond, 2*time.Second, "/ready")
	require.Eventually(t, func() bool { return w.Healthy() }, 5*time.Second, 5*time.Millisecond,
		"within the new timeout (the client's own read timeout too: the start's 100 ms would cut it)")
}
