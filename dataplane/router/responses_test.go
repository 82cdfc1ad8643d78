package router

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// storingMocks are n mock workers that store the Responses API's responses.
func storingMocks(n int) []mockworker.Options {
	out := mocks(n, 2, 0)
	for i := range out {
		out[i].ResponsesStore = true
	}
	return out
}

// do sends one request of any method and returns its status, the worker
// that answered and the body.
func (f *fleet) do(method, path, body string, headers ...string) (int, string, string) {
	f.t.Helper()
	resp, text := f.send(method, path, body, headers...)
	return resp.StatusCode, resp.Header.Get("x-fastroute-worker"), text
}

// created sends POST /v1/responses and returns the new response's id and
// the worker that made it.
func (f *fleet) created(body string) (id, worker string) {
	f.t.Helper()
	code, worker, text := f.do("POST", "/v1/responses", body)
	require.Equal(f.t, http.StatusOK, code, text)
	var r struct{ ID string }
	require.NoError(f.t, json.Unmarshal([]byte(text), &r))
	require.NotEmpty(f.t, r.ID)
	return r.ID, worker
}

func TestStoredResponsesStayWithTheirWorker(t *testing.T) {
	f := startFleet(t, storingMocks(3), nil) // round-robin: each request would go elsewhere
	m := f.r.Frontend.Metrics()
	id, holder := f.created(`{"model":"mock-model","input":"hi"}`)
	assert.Equal(t, 1, f.r.Responses.Len(), "learned from the answer")

	for range 4 {
		code, worker, body := f.do("GET", "/v1/responses/"+id, "")
		assert.Equal(t, http.StatusOK, code, body)
		assert.Equal(t, holder, worker)
		assert.Contains(t, body, `"id":"`+id+`"`)
	}
	code, worker, body := f.do("POST", "/v1/responses/"+id+"/cancel", "")
	assert.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, holder, worker)

	// The next turn of the conversation goes where the last one is stored,
	// and its own response is learned too.
	next, worker := f.created(`{"model":"mock-model","input":"more","previous_response_id":"` + id + `"}`)
	assert.Equal(t, holder, worker)
	code, worker, body = f.do("GET", "/v1/responses/"+next, "")
	assert.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, holder, worker)
	assert.Contains(t, body, `"previous_response_id":"`+id+`"`)
	assert.Zero(t, m.SearchMoves(), "every id was known")
	assert.Zero(t, m.Retries())

	// A response not stored ("store": false) is not remembered.
	before := f.r.Responses.Len()
	f.created(`{"model":"mock-model","input":"hi","store":false}`)
	assert.Equal(t, before, f.r.Responses.Len())

	// A client that names the worker keeps it.
	code, _, body = f.do("GET", "/v1/responses/"+id, "", "x-worker-id", otherThan(holder))
	assert.Equal(t, http.StatusNotFound, code, body)
	assert.Contains(t, body, "Response with id '"+id+"' not found.")

	// Other methods are refused by the router, and bad ids or fields are 400s.
	code, _, body = f.do("PUT", "/v1/responses/"+id, "")
	assert.Equal(t, http.StatusMethodNotAllowed, code, body)
	code, _, body = f.do("GET", "/v1/responses/"+strings.Repeat("x", 300), "")
	assert.Equal(t, http.StatusBadRequest, code, body)
	assert.Contains(t, body, "response id is longer than 256 bytes")
	code, _, body = f.do("POST", "/v1/responses", `{"model":"mock-model","previous_response_id":7}`)
	assert.Equal(t, http.StatusBadRequest, code, body)
	assert.Contains(t, body, `field \"previous_response_id\" must be a string`)
	f.assertIdle()
}

func otherThan(worker string) string {
	if worker == "1" {
		return "2"
	}
	return "1"
}

func TestAStoredResponseNoOneKnowsIsSearchedFor(t *testing.T) {
	f := startFleet(t, storingMocks(3), nil)
	m := f.r.Frontend.Metrics()

	// A response made without this router (through another replica, or
	// before its restart): the first request naming it searches the
	// workers, and learns where it is.
	holder := "2"
	resp, err := http.Post(f.mocks[1].URL()+"/v1/responses", "application/json", strings.NewReader(`{"model":"mock-model","input":"hi"}`))
	require.NoError(t, err)
	var made struct{ ID string }
	require.NoError(t, json.Unmarshal([]byte(readAll(t, resp)), &made))
	id := made.ID
	require.NotEmpty(t, id)
	assert.Zero(t, f.r.Responses.Len())

	code, worker, body := f.do("GET", "/v1/responses/"+id, "")
	assert.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, holder, worker)
	moves := m.SearchMoves()
	assert.LessOrEqual(t, moves, uint64(2), "at most every other worker answered 404 first")
	assert.Equal(t, 1, f.r.Responses.Len(), "found: learned")
	for range 3 {
		_, worker, _ = f.do("GET", "/v1/responses/"+id, "")
		assert.Equal(t, holder, worker)
	}
	assert.Equal(t, moves, m.SearchMoves(), "no search once known")

	// An id no worker holds is asked of each once, and the client gets the
	// last one's 404.
	code, _, body = f.do("GET", "/v1/responses/resp_nowhere", "")
	assert.Equal(t, http.StatusNotFound, code, body)
	assert.Contains(t, body, "Response with id 'resp_nowhere' not found.")
	assert.Equal(t, moves+2, m.SearchMoves())
	code, _, body = f.do("POST", "/v1/responses", `{"model":"mock-model","input":"x","previous_response_id":"resp_nowhere"}`)
	assert.Equal(t, http.StatusNotFound, code, body)
	assert.Equal(t, moves+4, m.SearchMoves())
	assert.Zero(t, m.Retries(), "a search is no retry")

	// A worker that leaves takes its responses with it: searched for again,
	// found nowhere.
	code, _ = adminDo(t, f, "DELETE", "/workers/"+holder, "", "")
	require.Equal(t, http.StatusAccepted, code)
	require.Eventually(t, func() bool { return len(f.r.Registry.All()) == 2 }, 5*time.Second, 10*time.Millisecond)
	code, _, body = f.do("GET", "/v1/responses/"+id, "")
	assert.Equal(t, http.StatusNotFound, code, body)
	f.assertIdle()
}

func TestASearchThatFindsOnlyBusyWorkersLeftIsA429(t *testing.T) {
	opts := storingMocks(3)
	for i := range opts {
		opts[i].Tokens, opts[i].TokenInterval = 20, 25*time.Millisecond
	}
	f := startFleet(t, opts, func(c *config.Config) { c.Router.BusyThreshold = 1 })
	resp, err := http.Post(f.mocks[2].URL()+"/v1/responses", "application/json", strings.NewReader(`{"model":"mock-model","input":"hi"}`))
	require.NoError(t, err)
	var made struct{ ID string }
	require.NoError(t, json.Unmarshal([]byte(readAll(t, resp)), &made))

	hold := f.post("/v1/chat/completions", streamBody, "x-worker-id", "3") // worker 3 at its cap while it streams
	require.Equal(t, http.StatusOK, hold.StatusCode)
	resp = f.post("/v1/responses/"+made.ID+"/cancel", "")
	body := readAll(t, resp)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, body)
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))
	assert.Contains(t, body, `is on none of the 2 workers asked, and those not asked yet are busy`)
	readAll(t, hold)

	code, worker, body := f.do("GET", "/v1/responses/"+made.ID, "")
	assert.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, "3", worker)
	f.assertIdle()
	assert.EqualValues(t, 1, f.r.Frontend.Metrics().Requests("/v1/responses", "resource_exhausted"))
}

func TestAStoredResponseStreamsFromItsWorker(t *testing.T) {
	f := startFleet(t, storingMocks(3), nil)
	m := f.r.Frontend.Metrics()
	id, holder := f.created(`{"model":"mock-model","input":"hi"}`)
	code, worker, body := f.do("POST", "/v1/responses", `{"model":"mock-model","input":"more","stream":true,"previous_response_id":"`+id+`"}`)
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, holder, worker)
	events := 0
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "event: ") {
			events++
		}
	}
	assert.Equal(t, 4, events, "created, two deltas, completed: %s", body)

	// The streamed response's id is learned from its first event.
	line, _, _ := strings.Cut(body[strings.Index(body, "data: ")+len("data: "):], "\n")
	var ev struct{ Response struct{ ID string } }
	require.NoError(t, json.Unmarshal([]byte(line), &ev), line)
	require.NotEmpty(t, ev.Response.ID)
	assert.Equal(t, 2, f.r.Responses.Len())
	for range 3 {
		code, worker, body = f.do("GET", "/v1/responses/"+ev.Response.ID, "")
		assert.Equal(t, http.StatusOK, code, body)
		assert.Equal(t, holder, worker)
	}
	assert.Zero(t, m.SearchMoves())

	// Not stored: not learned.
	code, _, body = f.do("POST", "/v1/responses", `{"model":"mock-model","input":"x","stream":true,"store":false}`)
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, 2, f.r.Responses.Len())
	f.assertIdle()
}
