package router

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/apikeys"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	teamAKey = "sk-team-a-5e1f0c2b9d8a7f64"
	batchKey = "sk-batch-3c9b1e7d0a2f8e45"
)

// keysFile writes a keys file and returns its path.
func keysFile(t *testing.T, lines ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keys")
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
	return path
}

func withKeys(path string) func(*config.Config) {
	return func(c *config.Config) { c.APIKeysFile = path }
}

// With api_keys_file set, a request needs a key of the file (as a bearer
// token or x-api-key); without one it is a 401 that reaches no worker and
// quotes nothing it was sent. GET /health needs none. The key goes no
// further than the router: the worker gets the request without it. The
// metrics and the access log name the key, never show it.
func TestAPIKeysAdmitClientsAndStayWithTheRouter(t *testing.T) {
	engine := startEngine(t, func(w http.ResponseWriter, _ *http.Request, _ map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"choices":[{"message":{"content":"ok"}}]}`))
	})
	var logs syncBuffer
	f := startFleetLog(t, nil, func(c *config.Config) {
		c.Workers = []dataplane.WorkerSpec{{ID: 1, URL: engine.URL}}
		c.APIKeysFile = keysFile(t, "# clients", "team-a "+teamAKey, "batch "+batchKey+" max_inflight=4")
		c.Log.Access = "all"
	}, &logs)

	const wrong = "sk-not-a-key-of-the-file-000"
	for _, headers := range [][]string{
		nil,
		{"Authorization", "Bearer " + wrong},
		{"x-api-key", wrong},
		{"Authorization", "Basic " + teamAKey},
		{"Authorization", "Bearer " + teamAKey[:len(teamAKey)-1]},
	} {
		resp, body := f.send("POST", "/v1/chat/completions", chatBody, headers...)
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "%v", headers)
		assert.Equal(t, `Bearer realm="fastroute"`, resp.Header.Get("WWW-Authenticate"))
		var e struct {
			Error struct{ Type, Message string }
		}
		require.NoError(t, json.Unmarshal([]byte(body), &e), body)
		assert.Equal(t, "authentication_error", e.Error.Type)
		assert.NotContains(t, body, wrong)
		assert.NotContains(t, body, "sk-team")
	}
	resp, _ := f.send("GET", "/v1/models", "")
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "the models need a key too")
	resp, _ = f.send("POST", "/no/such/path", "")
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "a path is not told apart from another before the key")
	assert.Empty(t, engine.received(), "no refused request reached the worker")

	resp, _ = f.send("GET", "/health", "")
	assert.Equal(t, http.StatusOK, resp.StatusCode, "health needs no key")
	resp, _ = f.send("GET", "/v1/models", "", "Authorization", "Bearer "+teamAKey)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	resp, body := f.send("POST", "/v1/chat/completions", chatBody, "Authorization", "bearer "+teamAKey)
	assert.Equal(t, http.StatusOK, resp.StatusCode, body)
	resp, body = f.send("POST", "/v1/messages", chatBody, "x-api-key", batchKey)
	assert.Equal(t, http.StatusOK, resp.StatusCode, body)
	got := engine.received()
	require.Len(t, got, 2)
	for _, g := range got {
		assert.Equal(t, "|", g.keys, "the worker got the request without the client's key (%s)", g.path)
	}

	_, metrics := adminDo(t, f, "GET", "/metrics", "", "")
	for _, line := range []string{
		`fastroute_api_key_requests_total{api_key="team-a",outcome="admitted"} 1`,
		`fastroute_api_key_requests_total{api_key="batch",outcome="admitted"} 1`,
		`fastroute_api_key_requests_total{api_key="batch",outcome="max_inflight"} 0`,
		`fastroute_api_key_inflight{api_key="team-a"} 0`,
		`fastroute_api_key_max_inflight{api_key="batch"} 4`,
		`fastroute_api_key_max_inflight{api_key="team-a"} 0`,
		"fastroute_api_key_refused_total 7",
	} {
		assert.Contains(t, metrics, line+"\n")
	}
	assert.Regexp(t, `path=/v1/chat/completions status=200 .* api_key=team-a prompt_tokens=0 completion_tokens=0\n`, logs.String())
	assert.Regexp(t, `path=/v1/messages status=200 .* api_key=batch prompt_tokens=0 completion_tokens=0\n`, logs.String())
	for what, text := range map[string]string{"the metrics": metrics, "the log": logs.String()} {
		for _, key := range []string{teamAKey, batchKey, wrong} {
			assert.NotContains(t, text, key, what)
		}
	}
	f.assertIdle()
}

// With worker_api_key set too, the router sends the workers' key in place
// of the client's: engines started with --api-key answer the router's
// clients, who never hold the engines' key.
func TestTheWorkersKeyReplacesTheClients(t *testing.T) {
	const engineKey = "sk-engine-71c0e5a9"
	opts := mocks(2, 1, 0)
	for i := range opts {
		opts[i].APIKey = engineKey
	}
	f := startFleet(t, opts, func(c *config.Config) {
		c.WorkerAPIKey = engineKey
		c.APIKeysFile = keysFile(t, "team-a "+teamAKey)
	})
	direct, err := http.NewRequest("POST", f.mocks[0].URL()+"/v1/chat/completions", strings.NewReader(chatBody))
	require.NoError(t, err)
	direct.Header.Set("Authorization", "Bearer "+teamAKey)
	resp, err := f.client.Do(direct)
	require.NoError(t, err)
	readAll(t, resp)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "the engine does not take the client's key")
	for range 4 {
		resp, body := f.send("POST", "/v1/chat/completions", chatBody, "Authorization", "Bearer "+teamAKey)
		assert.Equal(t, http.StatusOK, resp.StatusCode, body)
	}
	resp, body := f.send("POST", "/v1/chat/completions", streamBody, "x-api-key", teamAKey)
	assert.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Contains(t, body, "data: [DONE]")
	f.assertIdle()
}

// A key's max_inflight caps its requests in flight: one more is a 429 at
// once (not queued) while other keys go on; every slot comes back when its
// request ends, a stream's at its end and a cancelled one's at the cut.
func TestAKeysMaxInflightCapsItsRequests(t *testing.T) {
	f := startFleet(t, mocks(2, 20, 25*time.Millisecond), func(c *config.Config) {
		c.APIKeysFile = keysFile(t, "team-a "+teamAKey, "batch "+batchKey+" max_inflight=2")
		c.Router.Queue.Size = 8
	})
	batch := f.r.APIKeys.Clients()[0]
	require.Equal(t, "batch", batch.Name())

	// Two streams of batch's, held open after their first event.
	var open []*http.Response
	for range 2 {
		resp := f.post("/v1/chat/completions", streamBody, "Authorization", "Bearer "+batchKey)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		require.NoError(t, err)
		require.Contains(t, line, "data:")
		open = append(open, resp)
	}
	assert.Equal(t, int64(2), batch.Inflight())
	resp, body := f.send("POST", "/v1/chat/completions", chatBody, "Authorization", "Bearer "+batchKey)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, body)
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))
	assert.Contains(t, body, `"type":"rate_limit_error"`)
	assert.Contains(t, body, `API key \"batch\" has 2 requests in flight`)
	resp, body = f.send("POST", "/v1/chat/completions", chatBody, "Authorization", "Bearer "+teamAKey)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "another key goes on: %s", body)

	open[0].Body.Close() // cancelled mid-stream
	readAll(t, open[1])  // read to its end
	require.Eventually(t, func() bool { return batch.Inflight() == 0 }, 5*time.Second, 5*time.Millisecond)
	resp, body = f.send("POST", "/v1/chat/completions", chatBody, "Authorization", "Bearer "+batchKey)
	assert.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, uint64(1), batch.Limited(apikeys.OverInflight))
	assert.Equal(t, uint64(3), batch.Admitted())
	assert.Equal(t, uint64(1), f.r.Frontend.Metrics().Requests("/v1/chat/completions", "api_key_limited"))
	f.assertIdle()
	assert.Equal(t, int64(0), batch.Inflight())
}

// A reload reads the keys file again: a key taken out is refused at once,
// a rotated one works under its name, whose counts go on; a file that
// does not parse refuses the reload and the keys stay; no file opens the
// router to requests without a key.
func TestAReloadReadsTheKeysFileAgain(t *testing.T) {
	path := keysFile(t, "team-a "+teamAKey, "batch "+batchKey+" max_inflight=2")
	f := startFleet(t, mocks(1, 1, 0), withKeys(path))
	status := func(headers ...string) int {
		resp, _ := f.send("POST", "/v1/chat/completions", chatBody, headers...)
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, status("Authorization", "Bearer "+batchKey))
	reload := func() (int, string) {
		f.r.SetConfigSource(func() (config.Config, error) { return f.r.CurrentConfig(), nil })
		return adminDo(t, f, "POST", "/config/reload", "", "")
	}

	const rotated = "sk-batch-rotated-8b2d4f6a"
	require.NoError(t, os.WriteFile(path, []byte("batch "+rotated+" max_inflight=3\n"), 0o600))
	code, body := reload()
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `api_keys_file=`)
	assert.Contains(t, body, `(1 keys)`)
	assert.NotContains(t, body, rotated)
	assert.Equal(t, http.StatusUnauthorized, status("Authorization", "Bearer "+teamAKey), "taken out")
	assert.Equal(t, http.StatusUnauthorized, status("Authorization", "Bearer "+batchKey), "rotated away")
	assert.Equal(t, http.StatusOK, status("Authorization", "Bearer "+rotated))
	batch := f.r.APIKeys.Clients()[0]
	assert.Equal(t, uint64(2), batch.Admitted(), "the name's counts go on")
	assert.Equal(t, int64(3), batch.MaxInflight())

	require.NoError(t, os.WriteFile(path, []byte("batch short\n"), 0o600))
	code, body = reload()
	assert.Equal(t, http.StatusBadRequest, code, body)
	assert.Contains(t, body, "api_keys_file")
	assert.Contains(t, body, `line 1: the key (field 2) is shorter than 16 characters`)
	assert.Equal(t, http.StatusOK, status("Authorization", "Bearer "+rotated), "the keys stay")

	next := f.r.CurrentConfig()
	next.APIKeysFile = ""
	f.r.SetConfigSource(func() (config.Config, error) { return next, nil })
	code, body = adminDo(t, f, "POST", "/config/reload", "", "")
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, http.StatusOK, status(), "no keys file: no key needed")
	f.assertIdle()
}

func TestABadKeysFileStopsTheStart(t *testing.T) {
	for _, tc := range []struct{ path, want string }{
		{filepath.Join(t.TempDir(), "missing"), "key api_keys_file: open "},
		{keysFile(t, "team-a "+teamAKey, "team-b "+teamAKey), `line 2: its key is line 1's too`},
		{keysFile(t, "# none"), "no key in it"},
	} {
		cfg := config.Default()
		cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
		cfg.APIKeysFile = tc.path
		_, err := Start(cfg, nil)
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.want)
		assert.NotContains(t, err.Error(), teamAKey)
	}
}

// A key's priority= orders its requests in the wait queue whatever their
// bodies say: a batch key's request whose body claims priority -100 waits
// behind an interactive key's request that came after it.
func TestAKeysPriorityOrdersTheQueueInPlaceOfTheBodys(t *testing.T) {
	f := startFleet(t, mocks(1, 4, 100*time.Millisecond), func(c *config.Config) {
		c.Router.BusyThreshold = 1
		c.Router.Queue = config.Queue{Size: 4, Timeout: 5 * time.Second}
		c.APIKeysFile = keysFile(t, "team-a "+teamAKey, "batch "+batchKey+" priority=10")
	})
	first := f.post("/v1/chat/completions", streamBody, "Authorization", "Bearer "+teamAKey)
	require.Equal(t, http.StatusOK, first.StatusCode)
	done := make(chan string, 2)
	send := func(name, key, body string) {
		resp, text := f.send("POST", "/v1/chat/completions", body, "Authorization", "Bearer "+key)
		assert.Equal(t, http.StatusOK, resp.StatusCode, text)
		done <- name
	}
	go send("batch", batchKey, `{"model":"mock-model","priority":-100,"messages":[{"role":"user","content":"hi"}]}`)
	require.Eventually(t, func() bool { return metric(t, f, "fastroute_queued_requests") == "1" }, 2*time.Second, 5*time.Millisecond)
	go send("team-a", teamAKey, chatBody)
	require.Eventually(t, func() bool { return metric(t, f, "fastroute_queued_requests") == "2" }, 2*time.Second, 5*time.Millisecond)
	readAll(t, first)
	assert.Equal(t, "team-a", <-done, "the key's priority 10 waits behind 0, its body's -100 notwithstanding")
	assert.Equal(t, "batch", <-done)
	f.assertIdle()
}

// Each key is charged the tokens its answers report in their usage: a
// whole answer's, a stream's final usage chunk (stream_options.
// include_usage); a stream that reports none is charged its events as
// completion tokens and its body at 4 bytes a token as its prompt.
func TestAKeyIsChargedTheTokensItsAnswersReport(t *testing.T) {
	var logs syncBuffer
	f := startFleetLog(t, mocks(2, 3, 0), func(c *config.Config) {
		c.APIKeysFile = keysFile(t, "team-a "+teamAKey, "batch "+batchKey)
		c.Log.Access = "all"
	}, &logs)
	usageOf := func(body string) (prompt, completion uint64) {
		i := strings.LastIndex(body, `"usage":`)
		require.GreaterOrEqual(t, i, 0, body)
		var u struct{ PromptTokens, CompletionTokens uint64 }
		require.NoError(t, json.NewDecoder(strings.NewReader(body[i+len(`"usage":`):])).Decode(&struct {
			P *uint64 `json:"prompt_tokens"`
			C *uint64 `json:"completion_tokens"`
		}{&u.PromptTokens, &u.CompletionTokens}))
		return u.PromptTokens, u.CompletionTokens
	}
	var wantPrompt, wantCompletion uint64
	for _, body := range []string{
		chatBody,
		`{"model":"mock-model","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"a longer question than the first"}]}`,
	} {
		resp, text := f.send("POST", "/v1/chat/completions", body, "Authorization", "Bearer "+teamAKey)
		require.Equal(t, http.StatusOK, resp.StatusCode, text)
		p, c := usageOf(text)
		require.Positive(t, p)
		require.Equal(t, uint64(3), c)
		wantPrompt, wantCompletion = wantPrompt+p, wantCompletion+c
	}
	resp, text := f.send("POST", "/v1/chat/completions", streamBody, "Authorization", "Bearer "+batchKey)
	require.Equal(t, http.StatusOK, resp.StatusCode, text)
	require.NotContains(t, text, `"usage"`, "a stream without include_usage reports none")
	events := uint64(strings.Count(text, "data: ") - strings.Count(text, "data: [DONE]"))
	require.Positive(t, events)
	f.assertIdle()

	clients := f.r.APIKeys.Clients()
	require.Equal(t, "team-a", clients[1].Name())
	require.Eventually(t, func() bool { p, _ := clients[1].Tokens(); return p == wantPrompt }, 2*time.Second, 5*time.Millisecond)
	p, c := clients[1].Tokens()
	assert.Equal(t, wantPrompt, p)
	assert.Equal(t, wantCompletion, c)
	require.Eventually(t, func() bool { _, c := clients[0].Tokens(); return c > 0 }, 2*time.Second, 5*time.Millisecond)
	p, c = clients[0].Tokens()
	assert.Equal(t, uint64(len(streamBody)/4), p, "batch's stream reported nothing: its prompt is estimated by its body")
	assert.Equal(t, events, c, "and its completion tokens by its events")
	_, metrics := adminDo(t, f, "GET", "/metrics", "", "")
	assert.Contains(t, metrics, fmt.Sprintf("fastroute_api_key_tokens_total{api_key=\"team-a\",kind=\"prompt\"} %d\n", wantPrompt))
	assert.Contains(t, metrics, "fastroute_api_key_tokens_total{api_key=\"team-a\",kind=\"completion\"} 6\n")
	assert.Contains(t, metrics, fmt.Sprintf("fastroute_api_key_tokens_total{api_key=\"batch\",kind=\"completion\"} %d\n", events))
	assert.Regexp(t, `status=200 .* api_key=team-a prompt_tokens=[1-9][0-9]* completion_tokens=3\n`, logs.String())
	assert.Regexp(t, fmt.Sprintf(`status=200 .* api_key=batch prompt_tokens=%d completion_tokens=%d\n`, len(streamBody)/4, events), logs.String())
}

// A key's tokens_per_minute refuses its requests once its answers reported
// that many tokens over the last minute: a 429 saying when to retry,
// while other keys go on.
func TestAKeysTokensPerMinuteRefusesItOnceReached(t *testing.T) {
	f := startFleet(t, mocks(1, 3, 0), func(c *config.Config) {
		c.APIKeysFile = keysFile(t, "team-a "+teamAKey, "batch "+batchKey+" tokens_per_minute=5")
	})
	resp, body := f.send("POST", "/v1/chat/completions", chatBody, "Authorization", "Bearer "+batchKey)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	batch := f.r.APIKeys.Clients()[0]
	require.Eventually(t, func() bool { return batch.RecentTokens(time.Now()) >= 5 }, 2*time.Second, 5*time.Millisecond,
		"the answer's 3 completion tokens and its prompt's")
	resp, body = f.send("POST", "/v1/chat/completions", chatBody, "Authorization", "Bearer "+batchKey)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, body)
	assert.Contains(t, body, `"type":"rate_limit_error"`)
	assert.Regexp(t, `API key \\"batch\\" used [0-9]+ tokens over the last minute, its tokens_per_minute is 5; retry in [0-9]+ s`, body)
	retry, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	require.NoError(t, err)
	assert.True(t, retry >= 50 && retry <= 60, "the tokens leave the minute in %d s", retry)
	resp, body = f.send("POST", "/v1/chat/completions", chatBody, "Authorization", "Bearer "+teamAKey)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "another key goes on: %s", body)
	_, metrics := adminDo(t, f, "GET", "/metrics", "", "")
	assert.Contains(t, metrics, `fastroute_api_key_requests_total{api_key="batch",outcome="tokens_per_minute"} 1`+"\n")
	assert.Contains(t, metrics, `fastroute_api_key_tokens_per_minute{api_key="batch"} 5`+"\n")
	assert.Regexp(t, `fastroute_api_key_recent_tokens\{api_key="batch"\} [1-9][0-9]*\n`, metrics)
	assert.Equal(t, uint64(1), f.r.Frontend.Metrics().Requests("/v1/chat/completions", "api_key_limited"))
	f.assertIdle()
	assert.Equal(t, int64(0), batch.Inflight())
}

// A key given models= may name only those: another model, or none, is a
// 403 that reaches no worker, and the key's /v1/models lists only its
// models (GET /v1/models/{id} of another is a 404, as for a model no
// worker serves). A key without models= sees and uses them all.
func TestAKeyLimitedToModelsUsesAndSeesOnlyThem(t *testing.T) {
	opts := mocks(2, 1, 0)
	opts[0].Model, opts[1].Model = "llama", "qwen"
	f := startFleet(t, opts, func(c *config.Config) {
		c.APIKeysFile = keysFile(t, "team-a "+teamAKey, "batch "+batchKey+" models=qwen")
	})
	require.Eventually(t, func() bool { return f.r.Registry.Snapshot().ModelGroup([]byte("qwen")) != nil },
		5*time.Second, 10*time.Millisecond, "the probes list the models")
	batch := []string{"Authorization", "Bearer " + batchKey}
	assert.Equal(t, "2", f.servedBy("/v1/chat/completions", `{"model":"qwen","messages":[]}`, batch...))
	resp, body := f.send("POST", "/v1/chat/completions", `{"model":"llama","messages":[]}`, batch...)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, body)
	assert.Contains(t, body, `"type":"permission_error"`)
	assert.Contains(t, body, `API key \"batch\" may use only the models qwen, not \"llama\"`)
	resp, body = f.send("POST", "/v1/completions", `{"prompt":"hi"}`, batch...)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, body)
	assert.Contains(t, body, `may use only the models qwen: the request must name one`)
	assert.EqualValues(t, 1, f.mocks[0].Served()+f.mocks[1].Served(), "no refused request reached a worker")

	_, list := f.send("GET", "/v1/models", "", batch...)
	assert.Contains(t, list, `"id":"qwen"`)
	assert.NotContains(t, list, `"llama"`)
	resp, _ = f.send("GET", "/v1/models/llama", "", batch...)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	resp, _ = f.send("GET", "/v1/models/qwen", "", batch...)
	assert.Equal(t, http.StatusOK, resp.StatusCode)

	teamA := []string{"Authorization", "Bearer " + teamAKey}
	assert.Equal(t, "1", f.servedBy("/v1/chat/completions", `{"model":"llama","messages":[]}`, teamA...))
	_, list = f.send("GET", "/v1/models", "", teamA...)
	assert.Contains(t, list, `"id":"llama"`)
	assert.Contains(t, list, `"id":"qwen"`)
	f.assertIdle()
	assert.Zero(t, f.r.APIKeys.Clients()[0].Inflight())
}

// A response the Responses API creates is charged once, at its creation
// (whole or streamed: its response.completed event's usage); reading it
// back, which shows the same usage, charges nothing.
func TestAStoredResponseIsChargedOnce(t *testing.T) {
	opts := mocks(1, 3, 0)
	opts[0].ResponsesStore = true
	f := startFleet(t, opts, withKeys(keysFile(t, "team-a "+teamAKey)))
	auth := []string{"Authorization", "Bearer " + teamAKey}
	whole, streamed := `{"model":"mock-model","input":"Say hello."}`, `{"model":"mock-model","input":"Say hello.","stream":true}`
	resp, body := f.send("POST", "/v1/responses", whole, auth...)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	var created struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &created))
	// The mock's usage: a token per 4 bytes of the request's body, and its 3 tokens.
	require.Contains(t, body, fmt.Sprintf(`"usage":{"input_tokens":%d,"output_tokens":3`, len(whole)/4))
	resp, body = f.send("POST", "/v1/responses", streamed, auth...)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Contains(t, body, fmt.Sprintf(`"usage":{"input_tokens":%d,"output_tokens":3`, len(streamed)/4))
	f.assertIdle()
	client := f.r.APIKeys.Clients()[0]
	wantPrompt := uint64(len(whole)/4 + len(streamed)/4)
	require.Eventually(t, func() bool { p, c := client.Tokens(); return p == wantPrompt && c == 6 }, 2*time.Second, 5*time.Millisecond)

	for range 2 {
		resp, body = f.send("GET", "/v1/responses/"+created.ID, "", auth...)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		require.Contains(t, body, `"usage":{"input_tokens"`)
	}
	f.assertIdle()
	p, c := client.Tokens()
	assert.Equal(t, wantPrompt, p, "a read-back is not charged")
	assert.Equal(t, uint64(6), c)
}

// A key past its expires= is a 401 saying so (the realm's error
// invalid_token), counted as expired; one not yet past works, and the
// metrics give its expiry for alerts.
func TestAnExpiredKeyIsRefused(t *testing.T) {
	f := startFleet(t, mocks(1, 1, 0), withKeys(keysFile(t,
		"old "+teamAKey+" expires=2020-01-01", "current "+batchKey+" expires=2099-12-31T23:59:59Z")))
	resp, body := f.send("POST", "/v1/chat/completions", chatBody, "Authorization", "Bearer "+teamAKey)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, body)
	assert.Equal(t, `Bearer realm="fastroute", error="invalid_token"`, resp.Header.Get("WWW-Authenticate"))
	assert.Contains(t, body, `API key \"old\" expired at 2020-01-01T00:00:00Z`)
	assert.NotContains(t, body, teamAKey)
	resp, body = f.send("POST", "/v1/chat/completions", chatBody, "Authorization", "Bearer "+batchKey)
	assert.Equal(t, http.StatusOK, resp.StatusCode, body)
	_, metrics := adminDo(t, f, "GET", "/metrics", "", "")
	assert.Contains(t, metrics, `fastroute_api_key_requests_total{api_key="old",outcome="expired"} 1`+"\n")
	assert.Contains(t, metrics, `fastroute_api_key_expiry_timestamp_seconds{api_key="current"} 4.102444799e+09`+"\n")
	f.assertIdle()
}

// The admin listener's GET /api_keys shows each key's name, options and
// counts, never a key; an empty list while api_keys_file is unset.
func TestTheAdminListsTheKeys(t *testing.T) {
	f := startFleet(t, mocks(1, 3, 0), withKeys(keysFile(t,
		"team-a "+teamAKey+" max_inflight=8 priority=-1 models=mock-model expires=2099-01-01",
		"batch "+batchKey+" tokens_per_minute=1")))
	for range 2 {
		resp, body := f.send("POST", "/v1/chat/completions", chatBody, "Authorization", "Bearer "+batchKey)
		require.Contains(t, []int{http.StatusOK, http.StatusTooManyRequests}, resp.StatusCode, body)
	}
	f.assertIdle()
	code, body := adminDo(t, f, "GET", "/api_keys", "", "")
	require.Equal(t, http.StatusOK, code, body)
	assert.NotContains(t, body, teamAKey)
	assert.NotContains(t, body, batchKey)
	var keys []struct {
		Name               string
		MaxInflight        int64 `json:"max_inflight"`
		TokensPerMinute    int64 `json:"tokens_per_minute"`
		Priority           *int64
		Models             []string
		Expires            *time.Time
		Inflight, Admitted int64
		PromptTokens       uint64 `json:"prompt_tokens"`
		CompletionTokens   uint64 `json:"completion_tokens"`
		Refused            struct {
			TokensPerMinute uint64 `json:"tokens_per_minute"`
		}
	}
	require.NoError(t, json.Unmarshal([]byte(body), &keys), body)
	require.Len(t, keys, 2)
	batch, teamA := keys[0], keys[1]
	assert.Equal(t, "batch", batch.Name)
	assert.Equal(t, int64(1), batch.TokensPerMinute)
	assert.Equal(t, int64(1), batch.Admitted)
	assert.Equal(t, uint64(1), batch.Refused.TokensPerMinute)
	assert.Equal(t, uint64(3), batch.CompletionTokens)
	assert.Positive(t, batch.PromptTokens)
	assert.Nil(t, batch.Priority)
	assert.Equal(t, "team-a", teamA.Name)
	assert.Equal(t, int64(8), teamA.MaxInflight)
	require.NotNil(t, teamA.Priority)
	assert.Equal(t, int64(-1), *teamA.Priority)
	assert.Equal(t, []string{"mock-model"}, teamA.Models)
	require.NotNil(t, teamA.Expires)
	assert.Equal(t, time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC), *teamA.Expires)

	open := startFleet(t, mocks(1, 1, 0), nil)
	code, body = adminDo(t, open, "GET", "/api_keys", "", "")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "[]\n", body)
}

// Within a priority, the queue's API keys take turns: a request of batch
// that came after three of team-a's is served after team-a's first, not
// after all three. Keys off, the same arrivals would be served in order.
func TestTheQueuesKeysTakeTurns(t *testing.T) {
	// Answers of 320 ms: the four requests queue while the first streams
	// (a scrape of /metrics between two takes a while under -race).
	f := startFleet(t, mocks(1, 8, 40*time.Millisecond), func(c *config.Config) {
		c.Router.BusyThreshold = 1
		c.Router.Queue = config.Queue{Size: 8, Timeout: 10 * time.Second}
		c.APIKeysFile = keysFile(t, "team-a "+teamAKey, "batch "+batchKey)
	})
	first := f.post("/v1/chat/completions", streamBody, "Authorization", "Bearer "+teamAKey)
	require.Equal(t, http.StatusOK, first.StatusCode)
	done := make(chan string, 4)
	send := func(name, key string) {
		resp, text := f.send("POST", "/v1/chat/completions", chatBody, "Authorization", "Bearer "+key)
		assert.Equal(t, http.StatusOK, resp.StatusCode, text)
		done <- name
	}
	for i, r := range []struct{ name, key string }{{"a1", teamAKey}, {"a2", teamAKey}, {"a3", teamAKey}, {"b1", batchKey}} {
		go send(r.name, r.key)
		want := fmt.Sprint(i + 1)
		require.Eventually(t, func() bool { return metric(t, f, "fastroute_queued_requests") == want }, 2*time.Second, 5*time.Millisecond)
	}
	readAll(t, first)
	var order []string
	for range 4 {
		order = append(order, <-done)
	}
	assert.Equal(t, []string{"a1", "b1", "a2", "a3"}, order)
	f.assertIdle()
}

// A key's requests_per_minute refuses its requests once that many were
// admitted over the last minute: a 429 saying how many and when to
// retry, while other keys go on; the refused request reaches no worker.
func TestAKeysRequestsPerMinuteRefusesItOnceReached(t *testing.T) {
	f := startFleet(t, mocks(1, 1, 0), func(c *config.Config) {
		c.APIKeysFile = keysFile(t, "team-a "+teamAKey, "batch "+batchKey+" requests_per_minute=2")
	})
	for range 2 {
		resp, body := f.send("POST", "/v1/chat/completions", chatBody, "Authorization", "Bearer "+batchKey)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
	}
	resp, body := f.send("POST", "/v1/chat/completions", chatBody, "Authorization", "Bearer "+batchKey)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, body)
	assert.Regexp(t, `API key \\"batch\\" used 2 requests over the last minute, its requests_per_minute is 2; retry in [0-9]+ s`, body)
	retry, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	require.NoError(t, err)
	assert.True(t, retry >= 50 && retry <= 60, "the first request leaves the minute in %d s", retry)
	assert.Equal(t, int64(2), f.mocks[0].Served(), "the refused request reached no worker")
	resp, body = f.send("POST", "/v1/chat/completions", chatBody, "Authorization", "Bearer "+teamAKey)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "another key goes on: %s", body)
	_, metrics := adminDo(t, f, "GET", "/metrics", "", "")
	assert.Contains(t, metrics, `fastroute_api_key_requests_total{api_key="batch",outcome="requests_per_minute"} 1`+"\n")
	assert.Contains(t, metrics, `fastroute_api_key_requests_per_minute{api_key="batch"} 2`+"\n")
	assert.Contains(t, metrics, `fastroute_api_key_recent_requests{api_key="batch"} 2`+"\n")
	_, listing := adminDo(t, f, "GET", "/api_keys", "", "")
	assert.Contains(t, listing, `"requests_per_minute":2`)
	assert.Contains(t, listing, `"recent_requests":2`)
	f.assertIdle()
}

// An api_keys_file entry may name a client certificate in place of a key
// ("cert:NAME", the name the access log gives the certificate): a request
// that presents no key, over mutual TLS with that certificate, is the
// entry's, with its caps; one that presents a key is the key's; a
// certificate no entry names still needs a key. Such an entry without
// tls.client_ca_file stops the start.
func TestAnEntryMayNameAClientCertificate(t *testing.T) {
	server, pool := writeCert(t, t.TempDir(), 1)
	spiffe := "spiffe://example.org/ns/batch/sa/summarizer"
	service, _ := writeCertWith(t, t.TempDir(), 22, func(c *x509.Certificate) {
		u, err := url.Parse(spiffe)
		require.NoError(t, err)
		c.Subject, c.URIs = pkix.Name{}, []*url.URL{u}
	})
	alice, _ := writeCertWith(t, t.TempDir(), 20, func(c *x509.Certificate) { c.Subject = pkix.Name{CommonName: "Alice Smith"} })
	bob, _ := writeCertWith(t, t.TempDir(), 21, func(c *x509.Certificate) { c.Subject = pkix.Name{CommonName: "bob"} })
	var bundle []byte
	for _, c := range []config.TLS{service, alice, bob} {
		pem, err := os.ReadFile(c.CertFile)
		require.NoError(t, err)
		bundle = append(bundle, pem...)
	}
	files := server
	files.ClientCAFile = filepath.Join(t.TempDir(), "clients.pem")
	require.NoError(t, os.WriteFile(files.ClientCAFile, bundle, 0o600))
	keys := keysFile(t, "summarizer cert:"+spiffe+" max_inflight=4", "alice cert:Alice%20Smith", "team-a "+teamAKey)
	f := startFleet(t, mocks(1, 1, 0), func(c *config.Config) { c.TLS, c.APIKeysFile = files, keys })

	post := func(as config.TLS, key string) int {
		t.Helper()
		pair, err := tls.LoadX509KeyPair(as.CertFile, as.KeyFile)
		require.NoError(t, err)
		client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}}}}
		defer client.CloseIdleConnections()
		req, err := http.NewRequest(http.MethodPost, "https://"+f.r.Addr()+"/v1/chat/completions", strings.NewReader(chatBody))
		require.NoError(t, err)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := client.Do(req)
		require.NoError(t, err)
		readAll(t, resp)
		return resp.StatusCode
	}
	admitted := func(name string) string {
		return metric(t, f, `fastroute_api_key_requests_total{api_key="`+name+`",outcome="admitted"}`)
	}
	assert.Equal(t, http.StatusOK, post(service, ""))
	assert.Equal(t, http.StatusOK, post(service, ""))
	assert.Equal(t, http.StatusOK, post(alice, ""), "a name with a space, written %%20")
	assert.Equal(t, http.StatusUnauthorized, post(bob, ""), "a certificate no entry names: a key is needed")
	assert.Equal(t, http.StatusOK, post(bob, teamAKey))
	assert.Equal(t, http.StatusOK, post(service, teamAKey), "a key presented is the key's")
	assert.Equal(t, http.StatusUnauthorized, post(service, "cert:"+spiffe), "a certificate's name is no key")
	assert.Equal(t, "2", admitted("summarizer"))
	assert.Equal(t, "1", admitted("alice"))
	assert.Equal(t, "2", admitted("team-a"))
	assert.EqualValues(t, 5, f.mocks[0].Served())
	f.assertIdle()
	_, listed := adminDo(t, f, "GET", "/api_keys", "", "")
	assert.Contains(t, listed, `"name":"summarizer","client_cert":"`+spiffe+`"`)
	assert.Contains(t, listed, `"name":"alice","client_cert":"Alice Smith"`)
	assert.NotContains(t, listed, teamAKey)

	cfg := config.Default()
	cfg.Workers = []dataplane.WorkerSpec{{ID: 1, URL: "http://127.0.0.1:1"}}
	cfg.APIKeysFile = keys
	_, _, err := Check(cfg)
	assert.ErrorContains(t, err, "key api_keys_file: "+keys+": summarizer names a client certificate, and neither tls.client_ca_file nor forwarded_client_cert.from is set")
}

// Behind a mesh sidecar that terminates mutual TLS (forwarded_client_cert
// from its address), the client's certificate is the one the sidecar's
// x-forwarded-client-cert names: a cert: line of api_keys_file takes its
// requests, and the access log names it; the header reaches no worker.
// From a peer the key does not name, the header names nothing.
func TestAProxysForwardedClientCertNamesTheClient(t *testing.T) {
	var forwarded atomic.Value
	forwarded.Store("")
	engine := startEngine(t, func(w http.ResponseWriter, r *http.Request, _ map[string]any) {
		forwarded.Store(strings.Join(r.Header.Values("X-Forwarded-Client-Cert"), " | "))
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"choices":[{"message":{"content":"ok"}}]}`))
	})
	spiffe := "spiffe://cluster.local/ns/batch/sa/summarizer"
	xfcc := `By=spiffe://cluster.local/ns/llm/sa/fastroute;Hash=abc;Subject="";URI=` + spiffe
	keys := keysFile(t, "summarizer cert:"+spiffe, "team-a "+teamAKey)
	start := func(from string) (*fleet, *syncBuffer) {
		var logs syncBuffer
		f := startFleetLog(t, nil, func(c *config.Config) {
			c.Workers = []dataplane.WorkerSpec{{ID: 1, URL: engine.URL}}
			c.APIKeysFile, c.ForwardedClientCert.From, c.Log.Access = keys, []string{from}, "all"
		}, &logs)
		return f, &logs
	}
	post := func(f *fleet, headers ...string) int {
		t.Helper()
		resp := f.post("/v1/chat/completions", chatBody, headers...)
		readAll(t, resp)
		return resp.StatusCode
	}

	f, logs := start("127.0.0.1")
	assert.Equal(t, http.StatusOK, post(f, "X-Forwarded-Client-Cert", xfcc))
	assert.Equal(t, "", forwarded.Load(), "the header stays with the router")
	assert.Equal(t, http.StatusUnauthorized, post(f, "X-Forwarded-Client-Cert", `URI=spiffe://cluster.local/ns/batch/sa/other`))
	assert.Equal(t, http.StatusUnauthorized, post(f))
	assert.Equal(t, http.StatusOK, post(f, "Authorization", "Bearer "+teamAKey, "X-Forwarded-Client-Cert", xfcc), "a key presented is the key's")
	assert.Equal(t, "1", metric(t, f, `fastroute_api_key_requests_total{api_key="summarizer",outcome="admitted"}`))
	require.Eventually(t, func() bool { return strings.Count(logs.String(), "msg=access") == 2 }, 5*time.Second, 5*time.Millisecond, "%s", logs.String())
	assert.Equal(t, 2, strings.Count(logs.String(), "client_cert="+spiffe+" "), "the 200s' lines (a 401 has none) name the sidecar's client")
	f.assertIdle()

	f, _ = start("10.0.0.0/8") // the test's client is 127.0.0.1: no trusted proxy
	assert.Equal(t, http.StatusUnauthorized, post(f, "X-Forwarded-Client-Cert", xfcc), "a client cannot name its own certificate")
	assert.Equal(t, http.StatusOK, post(f, "Authorization", "Bearer "+teamAKey, "X-Forwarded-Client-Cert", xfcc))
	assert.Equal(t, "", forwarded.Load(), "nor does its header reach a worker")

	// A reload that trusts the client's address (a sidecar moved there)
	// applies to the next request.
	next := f.r.CurrentConfig()
	next.ForwardedClientCert.From = []string{"10.0.0.0/8", "127.0.0.1"}
	applied, needRestart, err := f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{fmt.Sprintf("api_keys_file=%q (2 keys)", keys), "forwarded_client_cert.from=[10.0.0.0/8 127.0.0.1]"}, applied)
	assert.Empty(t, needRestart)
	assert.Equal(t, http.StatusOK, post(f, "X-Forwarded-Client-Cert", xfcc))
	f.assertIdle()

	cfg := config.Default()
	cfg.Workers = []dataplane.WorkerSpec{{ID: 1, URL: "http://127.0.0.1:1"}}
	cfg.ForwardedClientCert.From = []string{"sidecar"}
	assert.ErrorContains(t, cfg.Validate(), `key forwarded_client_cert.from: "sidecar" is neither an IP nor a CIDR prefix`)
}
