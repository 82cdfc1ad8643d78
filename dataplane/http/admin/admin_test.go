package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/metrics"
	"github.com/fastroute/fastroute/internal/bearer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func call(t *testing.T, srv *httptest.Server, method, path, body, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Every route needs the token (metrics may be public); a drain answers
// 404 for an unknown worker and 503 when the drain hook fails for a known
// one.
func TestTokenAndDrainAnswers(t *testing.T) {
	reg := dataplane.NewRegistry()
	_, err := reg.Add(dataplane.WorkerSpec{ID: 1, URL: "http://127.0.0.1:1"})
	require.NoError(t, err)
	srv := httptest.NewServer(Handler(Options{Registry: reg, Metrics: &metrics.Set{}, Token: bearer.New("s3cret"), MetricsPublic: public(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Drain: func(id uint64) error {
			if id == 1 {
				return errors.New("etcd refused the drain mark")
			}
			return reg.Drain(id)
		}}))
	defer srv.Close()

	for _, path := range []string{"/workers", "/debug/pprof/cmdline"} {
		status, body := call(t, srv, "GET", path, "", "")
		assert.Equal(t, http.StatusUnauthorized, status, path)
		assert.NotContains(t, body, "s3cret")
		status, _ = call(t, srv, "GET", path, "", "wrong")
		assert.Equal(t, http.StatusUnauthorized, status, path)
	}
	status, body := call(t, srv, "GET", "/workers", "", "s3cret")
	assert.Equal(t, http.StatusOK, status)
	assert.Contains(t, body, `"id":1`)
	status, _ = call(t, srv, "GET", "/metrics", "", "")
	assert.Equal(t, http.StatusOK, status, "metrics_public opens /metrics alone")

	// One worker: the object GET /workers lists for it.
	status, _ = call(t, srv, "GET", "/workers/1", "", "")
	assert.Equal(t, http.StatusUnauthorized, status)
	status, body = call(t, srv, "GET", "/workers/1", "", "s3cret")
	assert.Equal(t, http.StatusOK, status)
	var one map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &one), body)
	assert.EqualValues(t, 1, one["id"])
	assert.Equal(t, true, one["healthy"])
	_, all := call(t, srv, "GET", "/workers", "", "s3cret")
	assert.JSONEq(t, "["+body+"]", all)
	status, body = call(t, srv, "GET", "/workers/7", "", "s3cret")
	assert.Equal(t, http.StatusNotFound, status)
	assert.Contains(t, body, "unknown worker id 7")
	status, body = call(t, srv, "GET", "/workers/x", "", "s3cret")
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Contains(t, body, `worker id \"x\" is not an unsigned integer`)

	status, body = call(t, srv, "DELETE", "/workers/1", "", "s3cret")
	assert.Equal(t, http.StatusServiceUnavailable, status)
	assert.Contains(t, body, "etcd refused the drain mark")
	status, _ = call(t, srv, "DELETE", "/workers/7", "", "s3cret")
	assert.Equal(t, http.StatusNotFound, status)
}

// The mux's own refusals are JSON errors, as every other admin error: a
// method a route does not take is 405 with the route's Allow header, a
// path without a route 404; a redirect to a path's trailing slash passes.
func TestRefusedRoutesAnswerJSON(t *testing.T) {
	reg := dataplane.NewRegistry()
	srv := httptest.NewServer(Handler(Options{Registry: reg, Metrics: &metrics.Set{}, Logger: slog.New(slog.DiscardHandler)}))
	defer srv.Close()
	for _, tc := range []struct {
		method, path string
		status       int
		message      string
	}{
		{"PATCH", "/workers", http.StatusMethodNotAllowed, "method PATCH is not allowed on this path; allowed: GET, HEAD, POST"},
		{"GET", "/nope", http.StatusNotFound, "no admin route has this path"},
		{"POST", "/workers/3/loras", http.StatusMethodNotAllowed, "method POST is not allowed on this path; allowed: PUT"},
	} {
		req, err := http.NewRequest(tc.method, srv.URL+tc.path, nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		var body struct {
			Error struct {
				Message, Type string
				Code          int
			}
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body), "%s %s", tc.method, tc.path)
		resp.Body.Close()
		assert.Equal(t, tc.status, resp.StatusCode)
		assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		assert.Equal(t, tc.message, body.Error.Message)
		assert.Equal(t, tc.status, body.Error.Code)
		if tc.status == http.StatusMethodNotAllowed {
			assert.NotEmpty(t, resp.Header.Get("Allow"))
		}
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Get(srv.URL + "/debug/pprof")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Contains(t, []int{http.StatusMovedPermanently, http.StatusTemporaryRedirect}, resp.StatusCode, "a redirect passes")
	assert.Equal(t, "/debug/pprof/", resp.Header.Get("Location"))
}

// A worker or adapter body over 1 MiB is a 413, and one with anything but
// blanks after its JSON object a 400: a second object is not silently
// dropped; an adapter body without "loras" is a 400 too (it was a status 0,
// which net/http answered by closing the connection). None registers
// anything.
func TestWriteBodiesAreOneBoundedObject(t *testing.T) {
	reg := dataplane.NewRegistry()
	_, err := reg.Add(dataplane.WorkerSpec{ID: 1, URL: "http://127.0.0.1:1"})
	require.NoError(t, err)
	srv := httptest.NewServer(Handler(Options{Registry: reg, Metrics: &metrics.Set{}, Logger: slog.New(slog.DiscardHandler)}))
	defer srv.Close()
	pad := strings.Repeat(" ", 1<<20)
	for _, tc := range []struct {
		method, path, body string
		status             int
		message            string
	}{
		{"POST", "/workers", `{"id":2,"url":"http://127.0.0.1:2"}` + pad, http.StatusRequestEntityTooLarge, "larger than 1 MiB"},
		{"POST", "/workers", `{"id":2,"url":"http://127.0.0.1:2"} {"id":3,"url":"http://127.0.0.1:3"}`, http.StatusBadRequest, "one JSON object"},
		{"PUT", "/workers/1/loras", `{"loras":["a"]}` + pad, http.StatusRequestEntityTooLarge, "larger than 1 MiB"},
		{"PUT", "/workers/1/loras", `{"loras":["a"]}x`, http.StatusBadRequest, "one JSON object"},
		{"PUT", "/workers/1/loras", `{}`, http.StatusBadRequest, `no \"loras\"`},
		{"PATCH", "/workers/1", `{"down":true}` + pad, http.StatusRequestEntityTooLarge, "larger than 1 MiB"},
		{"PATCH", "/workers/1", `{}`, http.StatusBadRequest, "nothing to change"},
	} {
		status, body := call(t, srv, tc.method, tc.path, tc.body, "")
		assert.Equal(t, tc.status, status, "%s %s: %s", tc.method, tc.path, body)
		assert.Contains(t, body, tc.message)
	}
	status, body := call(t, srv, "POST", "/workers", `{"id":2,"url":"http://127.0.0.1:2"}`+"\n", "")
	assert.Equal(t, http.StatusCreated, status, "blanks after the object: %s", body)
	assert.Len(t, reg.All(), 2, "only the last, whole, request registered")
	w, _ := reg.Get(1)
	assert.Empty(t, w.Spec().LoRAs)
	assert.False(t, w.Down())
}

// While WritesRefused says why, every change (a worker added, its
// adapters declared, a drain, a reload) is a 503 with Retry-After and the
// reason, and changes nothing; reads are served, a peer's prefix records
// are taken, and the token is checked first. Once it says nothing, changes
// are taken again.
func TestWritesRefusedWhileTheRouterSaysWhy(t *testing.T) {
	reg := dataplane.NewRegistry()
	_, err := reg.Add(dataplane.WorkerSpec{ID: 1, URL: "http://127.0.0.1:1"})
	require.NoError(t, err)
	var why atomic.Value
	why.Store("an upgrade is under way")
	srv := httptest.NewServer(Handler(Options{Registry: reg, Metrics: &metrics.Set{}, Token: bearer.New("s3cret"),
		Logger: slog.New(slog.DiscardHandler), WritesRefused: func() string { return why.Load().(string) },
		Reload: func() ([]string, []string, error) { return nil, nil, nil }}))
	defer srv.Close()
	for _, w := range []struct{ method, path, body string }{
		{"POST", "/workers", `{"id":2,"url":"http://127.0.0.1:2"}`},
		{"PUT", "/workers/1/loras", `["a"]`},
		{"DELETE", "/workers/1", ""},
		{"PATCH", "/workers/1", `{"down":true}`},
		{"POST", "/config/reload", ""},
	} {
		req, err := http.NewRequest(w.method, srv.URL+w.path, strings.NewReader(w.body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer s3cret")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s %s", w.method, w.path)
		assert.Equal(t, "1", resp.Header.Get("Retry-After"))
		assert.Contains(t, string(body), `"an upgrade is under way"`)
		status, _ := call(t, srv, w.method, w.path, w.body, "")
		assert.Equal(t, http.StatusUnauthorized, status, "the token first")
	}
	assert.Len(t, reg.All(), 1, "no worker added")
	wk, _ := reg.Get(1)
	assert.False(t, wk.Draining(), "none drained")
	assert.False(t, wk.Down(), "none put down")
	assert.Empty(t, wk.DeclaredAdapters(), "no adapter declared")
	status, body := call(t, srv, "GET", "/workers", "", "s3cret")
	assert.Equal(t, http.StatusOK, status, "reads are served")
	assert.Contains(t, body, `"id":1`)
	status, _ = call(t, srv, "POST", "/prefixes", "", "s3cret")
	assert.Equal(t, http.StatusConflict, status, "a peer's prefix records are no change to keep: prefix affinity off answers for itself")

	why.Store("")
	status, body = call(t, srv, "POST", "/workers", `{"id":2,"url":"http://127.0.0.1:2"}`, "s3cret")
	assert.Equal(t, http.StatusCreated, status, body)
	assert.Len(t, reg.All(), 2)
}

// A value a Describe adds that JSON cannot hold (NaN, infinity) is left
// out of GET /workers, the worker and its other fields still listed: it
// once emptied the object and panicked the handler, for every worker.
func TestAWorkerDescribedWithNaNIsStillListed(t *testing.T) {
	reg := dataplane.NewRegistry()
	for id := uint64(1); id <= 2; id++ {
		_, err := reg.Add(dataplane.WorkerSpec{ID: id, URL: fmt.Sprintf("http://127.0.0.1:%d", id)})
		require.NoError(t, err)
	}
	srv := httptest.NewServer(Handler(Options{Registry: reg, Metrics: &metrics.Set{}, Logger: slog.New(slog.DiscardHandler),
		Describe: func(w *dataplane.Worker, info map[string]any) {
			info["engine_source"] = "vllm"
			if w.ID() == 2 {
				info["engine_running"], info["engine_slots"] = math.NaN(), math.Inf(1)
				return
			}
			info["engine_running"] = 3.0
		}}))
	defer srv.Close()
	status, body := call(t, srv, "GET", "/workers", "", "")
	require.Equal(t, http.StatusOK, status, body)
	var all []map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &all), body)
	require.Len(t, all, 2)
	assert.Equal(t, 3.0, all[0]["engine_running"])
	assert.Equal(t, "vllm", all[1]["engine_source"], "the fields JSON holds are kept")
	assert.NotContains(t, all[1], "engine_running")
	assert.NotContains(t, all[1], "engine_slots")
	status, body = call(t, srv, "GET", "/workers/2", "", "")
	require.Equal(t, http.StatusOK, status, body)
	assert.JSONEq(t, body, mustJSON(t, all[1]))
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

// public is a MetricsPublic that is set.
func public() *atomic.Bool {
	var on atomic.Bool
	on.Store(true)
	return &on
}
