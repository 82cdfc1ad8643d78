package router

import (
	"net/http"
	"strings"
	"testing"

	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const app, evil = "https://app.example", "https://evil.example"

func preflight(origin string) []string {
	return []string{"Origin", origin, "Access-Control-Request-Method", "POST", "Access-Control-Request-Headers", "authorization, content-type"}
}

func TestWithoutCORSTheWorkersHeadersPass(t *testing.T) {
	f := startFleet(t, mocks(2, 2, 0), nil)
	resp, _ := f.send("OPTIONS", "/v1/chat/completions", "", preflight(app)...)
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	resp, body := f.send("POST", "/v1/chat/completions", chatBody, "Origin", app)
	assert.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, []string{"*"}, resp.Header.Values("Access-Control-Allow-Origin"), "the worker's, as sent")

	// A reload turns CORS on for the next request.
	cfg := f.r.CurrentConfig()
	cfg.CORSAllowedOrigins = []string{app}
	applied, needRestart, err := f.r.Reload(cfg)
	require.NoError(t, err)
	assert.Equal(t, []string{"cors_allowed_origins=[" + app + "]"}, applied)
	assert.Empty(t, needRestart)
	resp, _ = f.send("OPTIONS", "/v1/chat/completions", "", preflight(app)...)
	assert.Equal(t, http.StatusNoContent, resp.StatusCode)
	resp, body = f.send("POST", "/v1/chat/completions", chatBody, "Origin", evil)
	assert.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Empty(t, resp.Header.Values("Access-Control-Allow-Origin"), "the router's policy now: the worker's header dropped, evil not allowed")
	f.assertIdle()
}

func TestCORSAnswersPreflightsAndMarksAnswers(t *testing.T) {
	f := startFleet(t, mocks(2, 3, 0), func(c *config.Config) {
		c.CORSAllowedOrigins = []string{app}
		c.Limits.MaxBodyBytes = 4 << 10
	})
	served := func() (n uint64) {
		for _, w := range f.r.Registry.All() {
			n += w.Served()
		}
		return n
	}

	// Preflights are the router's, on any path, no worker asked.
	for _, path := range []string{"/v1/chat/completions", "/v1/models", "/v1/responses/resp_1"} {
		resp, body := f.send("OPTIONS", path, "", preflight(app)...)
		assert.Equal(t, http.StatusNoContent, resp.StatusCode, body)
		assert.Equal(t, app, resp.Header.Get("Access-Control-Allow-Origin"))
		assert.Equal(t, "GET, POST, DELETE, OPTIONS", resp.Header.Get("Access-Control-Allow-Methods"))
		assert.Equal(t, "authorization, content-type", resp.Header.Get("Access-Control-Allow-Headers"))
		assert.Equal(t, "600", resp.Header.Get("Access-Control-Max-Age"))
		assert.Equal(t, "Origin", resp.Header.Get("Vary"))
		assert.Empty(t, resp.Header.Get("x-fastroute-worker"))
	}
	assert.Zero(t, served())
	resp, body := f.send("OPTIONS", "/v1/chat/completions", "", preflight(evil)...)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	assert.Contains(t, body, "origin not allowed by cors_allowed_origins")
	assert.Empty(t, resp.Header.Get("Access-Control-Allow-Origin"))
	resp, _ = f.send("OPTIONS", "/v1/chat/completions", "", "Origin", app) // no preflight: as before
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)

	// Every answer to an allowed origin carries the router's policy alone
	// (the worker's "*" is dropped): proxied, streamed, the router's own,
	// an error.
	for _, c := range []struct {
		method, path, body string
		status             int
	}{
		{"POST", "/v1/chat/completions", chatBody, http.StatusOK},
		{"POST", "/v1/chat/completions", streamBody, http.StatusOK},
		{"GET", "/v1/models", "", http.StatusOK},
		{"GET", "/health", "", http.StatusOK},
		{"POST", "/v1/chat/completions", "{bad", http.StatusBadRequest},
		{"POST", "/v1/chat/completions", strings.Repeat("x", 8<<10), http.StatusRequestEntityTooLarge}, // refused while fasthttp reads it
	} {
		resp, body := f.send(c.method, c.path, c.body, "Origin", app)
		assert.Equal(t, c.status, resp.StatusCode, body)
		assert.Equal(t, []string{app}, resp.Header.Values("Access-Control-Allow-Origin"), "%s %s %.20s", c.method, c.path, c.body)
		assert.Contains(t, resp.Header.Values("Vary"), "Origin")
	}
	for _, origin := range []string{evil, ""} {
		resp, body := f.send("POST", "/v1/chat/completions", chatBody, "Origin", origin)
		assert.Equal(t, http.StatusOK, resp.StatusCode, body)
		assert.Empty(t, resp.Header.Values("Access-Control-Allow-Origin"), "origin %q: none, the worker's dropped too", origin)
	}
	f.assertIdle()
}

func TestCORSForAnyOrigin(t *testing.T) {
	f := startFleet(t, mocks(1, 2, 0), func(c *config.Config) { c.CORSAllowedOrigins = []string{"*"} })
	resp, _ := f.send("OPTIONS", "/v1/completions", "", preflight(evil)...)
	assert.Equal(t, http.StatusNoContent, resp.StatusCode)
	assert.Equal(t, "*", resp.Header.Get("Access-Control-Allow-Origin"))
	assert.Empty(t, resp.Header.Get("Vary"), "the same answer for every origin")
	resp, _ = f.send("POST", "/v1/chat/completions", streamBody, "Origin", evil)
	assert.Equal(t, []string{"*"}, resp.Header.Values("Access-Control-Allow-Origin"))
	f.assertIdle()
}
