package router

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/pickers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// PATCH /workers/{id} {"down":true} takes a worker out of rotation by hand
// (an engine's maintenance): a stream it holds runs to its end, new
// requests go to the others (one that names it is refused, a session
// pinned to it moves), and it stays registered, probed and counted until
// {"down":false} puts it back.
func TestAWorkerPutDownByHand(t *testing.T) {
	f := startFleet(t, mocks(2, 10, 30*time.Millisecond), func(c *config.Config) {
		c.Router.Mode = pickers.ModeLeastLoaded
		c.Router.SessionAffinity.Mode = "soft"
	})
	assert.Equal(t, false, f.workerInfo(1)["down"])
	assert.Equal(t, "0", metric(t, f, `fastroute_worker_down{worker="1"}`))
	pinned := f.servedBy("/v1/chat/completions", chatBody, "x-session-id", "s1", "x-worker-id", "1")
	require.Equal(t, "1", pinned)
	held := f.post("/v1/chat/completions", streamBody, "x-worker-id", "1")
	require.Equal(t, http.StatusOK, held.StatusCode)

	code, body := adminDo(t, f, "PATCH", "/workers/1", `{"down":true}`, "")
	require.Equal(t, http.StatusOK, code, body)
	var info map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &info))
	assert.Equal(t, true, info["down"])
	assert.EqualValues(t, 1, info["occupancy"], "its stream still runs")
	assert.Equal(t, "1", metric(t, f, `fastroute_worker_down{worker="1"}`))
	for range 4 {
		assert.Equal(t, "2", f.servedBy("/v1/chat/completions", chatBody))
	}
	assert.Equal(t, "2", f.servedBy("/v1/chat/completions", chatBody, "x-session-id", "s1"), "the session moves")
	resp, text := f.send(http.MethodPost, "/v1/chat/completions", chatBody, "x-worker-id", "1")
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, text)
	assert.Contains(t, text, "worker 1 is not routable (down)")
	stream := readAll(t, held)
	assert.True(t, strings.HasSuffix(strings.TrimSpace(stream), "data: [DONE]"), "the held stream ran to its end: %q", stream)
	f.assertIdle()
	info = f.workerInfo(1)
	assert.Equal(t, true, info["down"])
	assert.Equal(t, true, info["healthy"], "still probed")
	assert.Equal(t, false, info["draining"], "still registered")

	code, body = adminDo(t, f, "PATCH", "/workers/1", `{"down":true}`, "")
	assert.Equal(t, http.StatusOK, code, "again: no change, no error: %s", body)
	code, body = adminDo(t, f, "PATCH", "/workers/1", `{"down":false}`, "")
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, "1", f.servedBy("/v1/chat/completions", chatBody, "x-worker-id", "1"), "back in rotation")
	assert.Equal(t, "0", metric(t, f, `fastroute_worker_down{worker="1"}`))
	assert.Equal(t, false, f.workerInfo(1)["down"])
	f.assertIdle()
}

// PATCH /workers/{id} changes a running worker's routing settings
// (max_inflight, capacity, backup, max_model_len, role) as a reload of a
// changed spec would: at once for new requests, its requests in flight
// counted against the new cap (its engine's reading kept too:
// TestUpdateChangesARunningWorkersSpec); with state_file, a worker the
// admin API added keeps them across a restart.
func TestPatchingAWorkersRoutingSettings(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state.json")
	f := startFleet(t, mocks(2, 10, 30*time.Millisecond), func(c *config.Config) {
		c.Router.Mode, c.StateFile = pickers.ModeLeastLoaded, state
	})
	held := f.post("/v1/chat/completions", streamBody, "x-worker-id", "1")
	require.Equal(t, http.StatusOK, held.StatusCode)
	code, body := adminDo(t, f, "PATCH", "/workers/1", `{"max_inflight":1}`, "")
	require.Equal(t, http.StatusOK, code, body)
	var info map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &info))
	assert.EqualValues(t, 1, info["max_inflight"])
	assert.EqualValues(t, 1, info["occupancy"], "its stream counts on the new spec")
	resp, text := f.send(http.MethodPost, "/v1/chat/completions", chatBody, "x-worker-id", "1")
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "at its new cap: %s", text)
	assert.Equal(t, "2", f.servedBy("/v1/chat/completions", chatBody))
	readAll(t, held)
	f.assertIdle()

	code, body = adminDo(t, f, "PATCH", "/workers/2", `{"backup":true,"capacity":2.5,"max_model_len":4096,"role":"decode","down":false}`, "")
	require.Equal(t, http.StatusOK, code, body)
	info = f.workerInfo(2)
	assert.Equal(t, true, info["backup"])
	assert.Equal(t, 2.5, info["capacity"])
	assert.EqualValues(t, 4096, info["context_length"])
	assert.Equal(t, "decode", info["role"])
	for range 3 {
		assert.Equal(t, "1", f.servedBy("/v1/chat/completions", chatBody), "worker 2 a backup now")
	}
	for _, bad := range []string{`{"max_inflight":-1}`, `{"role":"chef"}`, `{"capacity":-2}`} {
		code, body = adminDo(t, f, "PATCH", "/workers/2", bad, "")
		assert.Equal(t, http.StatusBadRequest, code, "%s: %s", bad, body)
	}
	assert.Equal(t, "decode", f.workerInfo(2)["role"], "a refused patch changes nothing")

	extra, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: 3, Tokens: 3})
	require.NoError(t, err)
	t.Cleanup(func() { extra.Close() })
	code, body = adminDo(t, f, "POST", "/workers", fmt.Sprintf(`{"id":3,"url":%q}`, extra.URL()), "")
	require.Equal(t, http.StatusCreated, code, body)
	code, body = adminDo(t, f, "PATCH", "/workers/3", `{"max_inflight":6}`, "")
	require.Equal(t, http.StatusOK, code, body)
	st, err := readState(state)
	require.NoError(t, err)
	require.Len(t, st.Workers, 1)
	assert.Equal(t, 6, st.Workers[0].MaxInflight, "kept in the state file")
	f.assertIdle()
}

// A PATCH that changes nothing it may change, of an unknown worker or of
// one being drained is refused with what was wrong, and changes nothing.
func TestPatchingAWorkerRefusesWhatItCannotDo(t *testing.T) {
	f := startFleet(t, mocks(2, 10, 30*time.Millisecond), nil)
	for _, tc := range []struct {
		path, body string
		code       int
		msg        string
	}{
		{"/workers/1", `{}`, http.StatusBadRequest, "nothing to change"},
		{"/workers/1", `{"down":"yes"}`, http.StatusBadRequest, "want an object of one or more of down, max_inflight"},
		{"/workers/1", `{"down":true,"url":"http://10.0.0.1:80"}`, http.StatusBadRequest, `unknown field \"url\"`},
		{"/workers/1", `{"down":true}{"down":false}`, http.StatusBadRequest, "nothing after it"},
		{"/workers/9", `{"down":true}`, http.StatusNotFound, "unknown worker id 9"},
		{"/workers/x", `{"down":true}`, http.StatusBadRequest, `worker id \"x\" is not an unsigned integer`},
	} {
		code, body := adminDo(t, f, "PATCH", tc.path, tc.body, "")
		assert.Equal(t, tc.code, code, "%s %s: %s", tc.path, tc.body, body)
		assert.Contains(t, body, tc.msg, "%s %s", tc.path, tc.body)
	}
	assert.Equal(t, false, f.workerInfo(1)["down"])

	held := f.post("/v1/chat/completions", streamBody, "x-worker-id", "2")
	require.Equal(t, http.StatusOK, held.StatusCode)
	code, body := adminDo(t, f, "DELETE", "/workers/2", "", "")
	require.Equal(t, http.StatusAccepted, code, body)
	code, body = adminDo(t, f, "PATCH", "/workers/2", `{"down":false}`, "")
	assert.Equal(t, http.StatusConflict, code, body)
	assert.Contains(t, body, "worker 2 is draining")
	readAll(t, held)
	f.assertIdle()
}
