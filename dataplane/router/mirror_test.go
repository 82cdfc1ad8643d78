package router

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/dataplane/mirrors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// shadowEngine answers as an engine of the shadow model: a stream for a
// stream request, a 500 for a prompt of "fail", a wait until the router
// cuts the request for a prompt of "stall" (told on cut).
func shadowEngine(cut chan<- struct{}) func(http.ResponseWriter, *http.Request, map[string]any) {
	return func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		prompt := fmt.Sprint(body["messages"])
		switch {
		case strings.Contains(prompt, "stall"):
			stallUntilCut(cut)(w, r, body)
		case strings.Contains(prompt, "fail"):
			http.Error(w, `{"error":"shadow failed"}`, http.StatusInternalServerError)
		case body["stream"] == true:
			sseDecode(w, r, body)
		default:
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"shadow"}}]}`)
		}
	}
}

// A mirror copies the requests routed as its model to a worker of its
// shadow model, with the body's model rewritten, while the client gets
// the production worker's answer; the copies are counted by outcome, hold
// occupancy while they run, max_inflight bounds them, and a reload moves
// them. A copy goes only to a worker that names the shadow model, and
// carries the request's X-Forwarded-For line (add_x_forwarded_for).
// Shutdown cuts a copy still running.
func TestAMirrorCopiesRequestsToTheShadowModel(t *testing.T) {
	cut := make(chan struct{}, 1)
	shadow := startEngine(t, shadowEngine(cut))
	opts := mocks(2, 2, 0)
	opts[0].Model, opts[1].Model = "llama", "llama"
	f := startFleet(t, opts, func(c *config.Config) {
		c.Workers = append(c.Workers, dataplane.WorkerSpec{ID: 3, URL: shadow.URL, Models: []string{"llama-next"}})
		c.ModelMirrors = []mirrors.Mirror{{Model: "llama", To: "llama-next", Percent: 100}}
		c.AddXForwardedFor = true
	})
	require.Eventually(t, func() bool {
		g := f.r.Registry.Snapshot().ModelGroup([]byte("llama"))
		return g != nil && g.Len() == 2
	}, 5*time.Second, 10*time.Millisecond, "the health loop learns the mocks' model")
	copies := func(outcome string) string {
		return metric(t, f, `fastroute_model_mirror_requests_total{model="llama",to="llama-next",outcome="`+outcome+`"}`)
	}

	for i := range 10 {
		code, worker, text := f.do("POST", "/v1/chat/completions", fmt.Sprintf(`{"model":"llama","messages":[{"role":"user","content":"question %d"}]}`, i))
		require.Equal(t, http.StatusOK, code, text)
		assert.Contains(t, []string{"1", "2"}, worker, "the client is answered by production")
		assert.NotContains(t, text, "shadow")
	}
	resp, text := f.send("POST", "/v1/chat/completions", `{"model":"llama","stream":true,"messages":[{"role":"user","content":"a stream"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, text)
	assert.NotEqual(t, "3", resp.Header.Get("x-fastroute-worker"))
	require.Eventually(t, func() bool { return copies("ok") == "11" }, 5*time.Second, 5*time.Millisecond)
	got := shadow.received()
	require.Len(t, got, 11)
	prompts, streams := map[string]bool{}, 0
	for _, s := range got { // in the order they came: the copies run apart
		assert.Equal(t, "llama-next", s.body["model"], "the copy names the shadow model")
		assert.Equal(t, "127.0.0.1", s.forwardedFor, "the copy carries the request's X-Forwarded-For line")
		assert.Equal(t, "/v1/chat/completions", s.path)
		prompts[fmt.Sprint(s.body["messages"])] = true
		if s.body["stream"] == true {
			streams++
			assert.Contains(t, fmt.Sprint(s.body["messages"]), "a stream")
		}
	}
	assert.Len(t, prompts, 11, "each request copied once, its messages intact")
	assert.Equal(t, 1, streams)

	code, _, text := f.do("POST", "/v1/chat/completions", `{"model":"llama","messages":[{"role":"user","content":"fail"}]}`)
	assert.Equal(t, http.StatusOK, code, "the shadow's failure is not the client's: %s", text)
	require.Eventually(t, func() bool { return copies("failed") == "1" }, 5*time.Second, 5*time.Millisecond)
	f.assertIdle()
	assert.Equal(t, "0", metric(t, f, `fastroute_model_mirror_inflight{model="llama",to="llama-next"}`))
	assert.Equal(t, "100", metric(t, f, `fastroute_model_mirror_percent{model="llama",to="llama-next"}`))

	next := f.r.CurrentConfig()
	next.ModelMirrors = []mirrors.Mirror{{Model: "llama", To: "llama-next", Percent: 100, MaxInflight: 1}}
	applied, _, err := f.r.Reload(next)
	require.NoError(t, err)
	assert.Contains(t, applied, "model_mirrors (1)")
	assert.Equal(t, "11", copies("ok"), "a reload keeps the counts of the mirrors it keeps")
	code, _, _ = f.do("POST", "/v1/chat/completions", `{"model":"llama","messages":[{"role":"user","content":"stall"}]}`)
	assert.Equal(t, http.StatusOK, code)
	require.Eventually(t, func() bool { return len(shadow.received()) == 13 }, 5*time.Second, 5*time.Millisecond)
	code, _, _ = f.do("POST", "/v1/chat/completions", `{"model":"llama","messages":[]}`)
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "1", copies("skipped"), "one copy in flight, max_inflight 1: the next is not copied")
	w3, _ := f.r.Registry.Get(3)
	assert.Equal(t, int64(1), w3.Occupancy(), "the stalled copy holds its worker")

	next.ModelMirrors = []mirrors.Mirror{{Model: "llama", To: "llama-gone", Percent: 100}}
	_, _, err = f.r.Reload(next)
	require.NoError(t, err)
	code, _, text = f.do("POST", "/v1/chat/completions", `{"model":"llama","messages":[]}`)
	assert.Equal(t, http.StatusOK, code, text)
	require.Eventually(t, func() bool {
		return metric(t, f, `fastroute_model_mirror_requests_total{model="llama",to="llama-gone",outcome="unserved"}`) == "1"
	}, 5*time.Second, 5*time.Millisecond, "no worker names llama-gone: the copy goes nowhere, not to a worker of unknown models")
	assert.Len(t, shadow.received(), 13)

	require.NoError(t, f.r.Close())
	select {
	case <-cut:
	case <-time.After(5 * time.Second):
		t.Fatal("shutdown did not cut the copy still running")
	}
	assert.Zero(t, w3.Occupancy(), "the cut copy released its worker")
}
