package health

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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
	reg := dataplane.NewRegistry()
	_, err := reg.AddUnprobed(dataplane.WorkerSpec{ID: 1, URL: srv.URL})
	require.NoError(t, err)
	c := New(reg, Options{Interval: 100 * time.Millisecond, Path: "/health", UnhealthyAfter: 2, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})

	c.CheckOnce()
	w, _ := reg.Get(1)
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
	reg := dataplane.NewRegistry()
	_, err := reg.AddUnprobed(dataplane.WorkerSpec{ID: 1, URL: srv.URL})
	require.NoError(t, err)
	c := New(reg, Options{Interval: time.Second, Path: "/health", UnhealthyAfter: 2, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	c.CheckOnce()
	w, _ := reg.Get(1)
	assert.True(t, w.Healthy())
	assert.Empty(t, w.Advertised().Models)
}
