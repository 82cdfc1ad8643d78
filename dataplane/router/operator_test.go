package router

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/aliases"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/dataplane/mirrors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLargeHeadersPassAndOversizeOnesAre431WithoutEcho(t *testing.T) {
	f := startFleet(t, mocks(1, 1, 0), nil)
	big := strings.Repeat("a", 20<<10)
	resp := f.post("/v1/chat/completions", chatBody, "Authorization", "Bearer "+big, "x-trace", big)
	readAll(t, resp)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "20 KB of headers are within the 64 KiB default")

	secret := "Bearer sk-" + strings.Repeat("S", 70<<10)
	resp = f.post("/v1/chat/completions", chatBody, "Authorization", secret)
	body := readAll(t, resp)
	assert.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)
	assert.Contains(t, body, "limits.max_header_bytes (65536 bytes)")
	assert.NotContains(t, body, "sk-SSSS", "the credential is not echoed")

	// A malformed request whose parser error would quote it: a clear 400, nothing echoed.
	conn, err := net.Dial("tcp", f.r.Addr())
	require.NoError(t, err)
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-leak\r\nContent-Length: abc\r\n\r\n")
	resp2, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	body = readAll(t, resp2)
	assert.Equal(t, http.StatusBadRequest, resp2.StatusCode)
	assert.Contains(t, body, "malformed HTTP request")
	assert.NotContains(t, body, "sk-leak")
	f.assertIdle()
}

func TestMaxHeaderBytesIsConfigurable(t *testing.T) {
	f := startFleet(t, mocks(1, 1, 0), func(c *config.Config) { c.Limits.MaxHeaderBytes = 8 << 10 })
	resp := f.post("/v1/chat/completions", chatBody, "x-pad", strings.Repeat("p", 10<<10))
	assert.Contains(t, readAll(t, resp), "(8192 bytes)")
	assert.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)
}

func TestAdminRoutesAllNeedTheToken(t *testing.T) {
	f := startFleet(t, mocks(1, 1, 0), func(c *config.Config) { c.AdminToken = "s3cret" })
	for _, path := range []string{"/workers", "/api_keys", "/metrics", "/debug/pprof/", "/debug/pprof/cmdline"} {
		for _, token := range []string{"", "wrong", "s3cre", "s3cretX"} {
			code, body := adminDo(t, f, "GET", path, "", token)
			assert.Equal(t, http.StatusUnauthorized, code, "%s with token %q", path, token)
			assert.NotContains(t, body, "s3cret")
		}
		code, _ := adminDo(t, f, "GET", path, "", "s3cret")
		assert.Equal(t, http.StatusOK, code, path)
	}
	code, _ := adminDo(t, f, "DELETE", "/workers/1", "", "")
	assert.Equal(t, http.StatusUnauthorized, code)
	assert.True(t, f.r.Registry.Snapshot().Len() == 1, "a refused write changes nothing")
}

func TestMetricsPublicOpensMetricsAlone(t *testing.T) {
	f := startFleet(t, mocks(1, 1, 0), func(c *config.Config) { c.AdminToken, c.MetricsPublic = "s3cret", true })
	code, body := adminDo(t, f, "GET", "/metrics", "", "")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "fastroute_requests_total")
	code, _ = adminDo(t, f, "GET", "/workers", "", "")
	assert.Equal(t, http.StatusUnauthorized, code)
	code, _ = adminDo(t, f, "POST", "/metrics", "", "")
	assert.Equal(t, http.StatusUnauthorized, code, "only reads of /metrics are open")

	next := f.r.CurrentConfig() // a reload closes it again
	next.MetricsPublic = false
	applied, needRestart, err := f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"metrics_public=false"}, applied)
	assert.Empty(t, needRestart)
	code, _ = adminDo(t, f, "GET", "/metrics", "", "")
	assert.Equal(t, http.StatusUnauthorized, code)
	code, _ = adminDo(t, f, "GET", "/metrics", "", "s3cret")
	assert.Equal(t, http.StatusOK, code)
}

func TestAdminTokenFromFileOrEnvironment(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(path, []byte("from-file\n"), 0o600))
	f := startFleet(t, mocks(1, 1, 0), func(c *config.Config) { c.AdminTokenFile = path })
	code, _ := adminDo(t, f, "GET", "/workers", "", "from-file")
	assert.Equal(t, http.StatusOK, code)
	code, _ = adminDo(t, f, "GET", "/workers", "", "")
	assert.Equal(t, http.StatusUnauthorized, code)

	t.Setenv(config.AdminTokenEnv, "from-env")
	g := startFleet(t, mocks(1, 1, 0), nil)
	code, _ = adminDo(t, g, "GET", "/workers", "", "from-env")
	assert.Equal(t, http.StatusOK, code)
	code, body := adminDo(t, g, "GET", "/debug/pprof/cmdline", "", "from-env")
	assert.Equal(t, http.StatusOK, code)
	assert.NotContains(t, body, "from-env", "a token from the environment is not on the command line")
}

func TestAdminRefusals(t *testing.T) {
	t.Setenv(config.AdminTokenEnv, "")
	cfg := config.Default()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "0.0.0.0:0"
	_, err := Start(cfg, nil)
	assert.ErrorContains(t, err, "key admin_listen: 0.0.0.0:0 is reachable from other hosts and no admin token is set")
	cfg.AdminToken, cfg.AdminTokenFile = "a", "/etc/hostname"
	_, err = Start(cfg, nil)
	assert.ErrorContains(t, err, "key admin_token_file: set admin_token or admin_token_file, not both")
	cfg.AdminToken, cfg.AdminTokenFile = "", filepath.Join(t.TempDir(), "missing")
	_, err = Start(cfg, nil)
	assert.ErrorContains(t, err, "key admin_token_file: open ")
}

func TestAdminWritesAreLogged(t *testing.T) {
	var logs syncBuffer
	f := startFleetLog(t, mocks(1, 1, 0), func(c *config.Config) { c.AdminToken = "s3cret" }, &logs)
	adminDo(t, f, "DELETE", "/workers/1", "", "nope")
	adminDo(t, f, "DELETE", "/workers/1", "", "s3cret")
	adminDo(t, f, "GET", "/workers", "", "s3cret")
	out := logs.String()
	assert.Contains(t, out, `msg="admin write" method=DELETE path=/workers/1 status=401`)
	assert.Contains(t, out, `msg="admin write" method=DELETE path=/workers/1 status=202`)
	assert.NotContains(t, out, "path=/workers status", "reads are not logged")
	assert.NotContains(t, out, "s3cret")
}

// shutdown_timeout (here as a reload set it) bounds the drain.
func TestShutdownTimeoutCutsStreamsStillOpen(t *testing.T) {
	f := startFleet(t, mocks(1, 200, 20*time.Millisecond), func(c *config.Config) { c.ShutdownTimeout = time.Minute })
	next := f.r.CurrentConfig()
	next.ShutdownTimeout = 300 * time.Millisecond
	applied, needRestart, err := f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"shutdown_timeout=300ms"}, applied)
	assert.Empty(t, needRestart)
	resp := f.post("/v1/chat/completions", streamBody) // 4 s of stream
	require.Equal(t, http.StatusOK, resp.StatusCode)
	start := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- f.r.Close() }()
	body, _ := io.ReadAll(resp.Body) // ends when the router cuts the connection
	resp.Body.Close()
	require.NoError(t, <-closed)
	took := time.Since(start)
	assert.Less(t, took, 2*time.Second, "closed after the timeout, not after the stream")
	assert.GreaterOrEqual(t, took, 300*time.Millisecond, "open requests had their time")
	assert.NotContains(t, string(body), "[DONE]", "the stream was cut")
	assert.Contains(t, string(body), "tok0", "it had started")
	f.assertIdle() // the cut stream's reservation is released
}

func TestShutdownTimeoutCutsRequestsWaitingOnAWorker(t *testing.T) {
	f := startFleet(t, mocks(1, 1, 3*time.Second), func(c *config.Config) { c.ShutdownTimeout = 200 * time.Millisecond })
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := f.client.Post("http://"+f.r.Addr()+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
		if err == nil {
			resp.Body.Close()
		}
	}()
	require.Eventually(t, func() bool { return f.mocks[0].Active() == 1 }, 5*time.Second, 10*time.Millisecond)
	start := time.Now()
	require.NoError(t, f.r.Close())
	assert.Less(t, time.Since(start), 2*time.Second, "no wait for the worker's 3 s answer")
	<-done
	f.assertIdle()
}

func TestRoutesBeyondTheFirstThree(t *testing.T) {
	f := startFleet(t, []mockworker.Options{{ID: 1, LoRAs: []string{"sql"}}, {ID: 2}}, func(c *config.Config) {
		c.Routes = []string{"/custom/infer", "/v1/unload_lora_adapter"}
	})
	require.Eventually(t, func() bool { // the worker's own /v1/models has been read
		w, _ := f.r.Registry.Get(1)
		return len(w.Advertised().Adapters) == 1
	}, 5*time.Second, 20*time.Millisecond)
	for _, path := range []string{"/v1/responses", "/v1/messages", "/v1/rerank", "/v1/score", "/v1/audio/transcriptions",
		"/tokenize", "/detokenize", "/pooling", "/classify", "/generate", "/encode", "/rerank", "/v2/rerank", "/v2/embed", "/cohere/v2/chat", "/custom/infer"} {
		resp := f.post(path, `{"model":"sql","prompt":"x"}`)
		body := readAll(t, resp)
		assert.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", path, body)
		if path == "/v1/responses" { // the mock answers it as vLLM does
			assert.Equal(t, "1", resp.Header.Get("x-fastroute-worker"), "went to the adapter's holder")
			assert.Contains(t, body, `"object":"response"`)
			continue
		}
		assert.Contains(t, body, `"path":"`+path+`","worker":1`, "%s went to the adapter's holder, path unchanged", path)
	}
	// A multipart body (audio) is forwarded as it is, routed without a model.
	resp := f.post("/v1/audio/transcriptions", "--b\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nRIFF\r\n--b--\r\n",
		"Content-Type", "multipart/form-data; boundary=b")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, readAll(t, resp), `"object":"echo"`)

	resp = f.post("/nope", `{}`)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Contains(t, readAll(t, resp), `no route \"/nope\"`)

	// A reload changes the routes for the next request.
	cfg := f.r.CurrentConfig()
	cfg.Routes = []string{"/nope", "/v1/unload_lora_adapter"}
	applied, needRestart, err := f.r.Reload(cfg)
	require.NoError(t, err)
	assert.Equal(t, []string{"routes=[/nope /v1/unload_lora_adapter]"}, applied)
	assert.Empty(t, needRestart)
	resp = f.post("/nope", `{}`)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, readAll(t, resp), `"path":"/nope"`)
	resp = f.post("/custom/infer", `{}`)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	readAll(t, resp)

	// vLLM's runtime adapter loading changes the one worker picked: refused
	// (any method), unless the routes key names it.
	served := func() (n uint64) {
		for _, w := range f.r.Registry.All() {
			n += w.Served()
		}
		return n
	}
	before := served()
	resp = f.post("/v1/load_lora_adapter", `{"lora_name":"x","lora_path":"/etc"}`)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	assert.Contains(t, readAll(t, resp), `"/v1/load_lora_adapter\" changes one worker and is not proxied`)
	assert.Equal(t, before, served(), "no worker got it")
	resp = f.post("/v1/unload_lora_adapter", `{"lora_name":"sql"}`)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, readAll(t, resp), `"path":"/v1/unload_lora_adapter"`)

	get := func(path string) (int, string) {
		resp, err := f.client.Get("http://" + f.r.Addr() + path)
		require.NoError(t, err)
		return resp.StatusCode, readAll(t, resp)
	}
	code, body := get("/v1/models/sql")
	assert.Equal(t, http.StatusOK, code)
	assert.JSONEq(t, `{"id":"sql","object":"model","created":1764600000,"owned_by":"vllm","root":"/adapters/sql","parent":"mock-model","max_model_len":8192}`, body)
	code, body = get("/v1/models/none")
	assert.Equal(t, http.StatusNotFound, code)
	assert.Contains(t, body, `model \"none\" is not served by any worker`)
	assert.EqualValues(t, 2, f.r.Frontend.Metrics().Requests("/v1/responses", "ok")+f.r.Frontend.Metrics().Requests("/v1/messages", "ok"))
	f.assertIdle()
}

func TestPassiveHealthEjectsAWorkerThatFailsAndReadmitsIt(t *testing.T) {
	opts := []mockworker.Options{{ID: 1, FailRate: 1}, {ID: 2}}
	f := startFleet(t, opts, func(c *config.Config) {
		c.Health.EjectAfter, c.Health.EjectTime, c.Health.EjectMax = 3, 300*time.Millisecond, time.Second
		c.Router.Retries = 0
		// Probes that time out on a loaded machine (each has one interval,
		// 100 ms) must not mark worker 1 down: coming back up unejects it.
		c.Health.UnhealthyAfter = 1000
	})
	served := func(n int) map[string]int {
		out := map[string]int{}
		for i := 0; i < n; i++ {
			resp := f.post("/v1/chat/completions", chatBody)
			readAll(t, resp)
			out[fmt.Sprintf("%s:%d", resp.Header.Get("x-fastroute-worker"), resp.StatusCode)]++
		}
		return out
	}
	first := served(10) // round-robin: worker 1's third 500 ejects it
	assert.Equal(t, 3, first["1:500"], "%v", first)
	assert.Equal(t, 7, first["2:200"], "%v", first)
	w1, _ := f.r.Registry.Get(1)
	until, n := w1.Ejected()
	require.False(t, until.IsZero())
	assert.Equal(t, 1, n)
	code, body := adminDo(t, f, "GET", "/workers", "", "")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `"ejected":true`)
	_, metrics := adminDo(t, f, "GET", "/metrics", "", "")
	assert.Contains(t, metrics, "fastroute_ejections_total 1\n")
	assert.Contains(t, metrics, "fastroute_worker_ejected{worker=\"1\"} 1\n")

	// Back after its time (the health loop readmits), it fails again: the
	// second ejection lasts twice as long.
	// Its requests resume once the health loop republished the snapshot,
	// which may be a few requests after its ejection time was cleared (a
	// loaded machine): so until its third 500, at most 20 requests.
	require.Eventually(t, func() bool { u, _ := w1.Ejected(); return u.IsZero() }, 3*time.Second, 20*time.Millisecond)
	failed := 0
	for range 20 {
		if failed += served(1)["1:500"]; failed == 3 {
			break
		}
	}
	require.Equal(t, 3, failed, "worker 1 back in rotation")
	until, n = w1.Ejected()
	require.False(t, until.IsZero())
	assert.Equal(t, 2, n)
	assert.Greater(t, time.Until(until), 400*time.Millisecond, "600 ms the second time")
	f.assertIdle()
}

func TestWorkerAddedWhileRunningIsRoutableAfterItsFirstProbe(t *testing.T) {
	f := startFleet(t, mocks(1, 1, 0), nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := ln.Addr().String()
	ln.Close()
	code, body := adminDo(t, f, "POST", "/workers", fmt.Sprintf(`{"id":2,"url":"http://%s"}`, closed), "")
	require.Equal(t, http.StatusCreated, code, body)
	time.Sleep(300 * time.Millisecond) // probes of a closed port fail
	assert.Equal(t, 1, f.r.Registry.Snapshot().Len(), "a worker on a closed port never entered rotation")
	for i := 0; i < 5; i++ {
		resp := f.post("/v1/chat/completions", chatBody)
		readAll(t, resp)
		assert.Equal(t, "1", resp.Header.Get("x-fastroute-worker"))
	}
	live, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: 3})
	require.NoError(t, err)
	t.Cleanup(func() { live.Close() })
	code, body = adminDo(t, f, "POST", "/workers", fmt.Sprintf(`{"id":3,"url":%q}`, live.URL()), "")
	require.Equal(t, http.StatusCreated, code, body)
	require.Eventually(t, func() bool { return f.r.Registry.Snapshot().Len() == 2 }, 2*time.Second, 10*time.Millisecond,
		"a live worker enters rotation once its probe passes")
}

func TestDPRankQueryOnlyAndLoRABusyAnswers(t *testing.T) {
	f := startFleet(t, []mockworker.Options{{ID: 1, Tokens: 20, TokenInterval: 25 * time.Millisecond, LoRAs: []string{"sql"}}, {ID: 2}},
		func(c *config.Config) {
			c.Router.BusyThreshold = 1
			c.Workers[0].DPSize = 1
		})
	resp := f.post("/v1/chat/completions", chatBody, "x-dp-rank", "5")
	body := readAll(t, resp)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, body, "x-dp-rank names a rank of the worker that x-worker-id names")

	resp = f.post("/v1/chat/completions", chatBody, "x-worker-id", "2", "x-dp-rank", "0", "X-Data-Parallel-Rank", "1")
	readAll(t, resp)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Empty(t, resp.Header.Get("x-mock-dp-rank"), "a worker without ranks never sees a rank, not even the client's")
	assert.Empty(t, resp.Header.Get("x-mock-x-dp-rank"), "a worker without ranks never sees a rank")

	w2, _ := f.r.Registry.Get(2)
	before := w2.Served()
	resp = f.post("/v1/chat/completions", chatBody, "x-worker-id", "2", "x-query-instance-id", "true")
	readAll(t, resp)
	assert.Equal(t, before, w2.Served(), "a query-only pick is not a dispatch")

	require.Eventually(t, func() bool { return f.r.Registry.Snapshot().Group([]byte("sql")) != nil }, 5*time.Second, 20*time.Millisecond)
	hold := f.post("/v1/chat/completions", `{"model":"sql","stream":true,"messages":[]}`)
	defer readAll(t, hold)
	resp = f.post("/v1/chat/completions", `{"model":"sql","messages":[]}`)
	body = readAll(t, resp)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Contains(t, body, `every worker holding adapter \"sql\" is busy`, "worker 2 is free but does not hold it")
}

func TestAccessLog(t *testing.T) {
	var logs syncBuffer
	f := startFleetLog(t, mocks(1, 3, 0), func(c *config.Config) {
		c.Log.Access = "all"
		c.ModelAliases = []aliases.Alias{{Name: "assistant", Targets: []aliases.Target{{Model: "mock-model"}}}}
	}, &logs)
	readAll(t, f.post("/v1/chat/completions", chatBody))
	readAll(t, f.post("/v1/chat/completions", streamBody, "X-Request-Id", "req-7"))
	readAll(t, f.post("/v1/completions", "{not json"))
	readAll(t, f.post("/tokenize", `{"prompt":"x"}`, "Authorization", "Bearer sk-secret"))
	readAll(t, f.post("/v1/chat/completions", chatBody, "x-query-instance-id", "true"))
	readAll(t, f.post("/v1/chat/completions", `{"model":"assistant","messages":[]}`))
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	var access []string
	for _, l := range lines {
		if strings.Contains(l, "log=access") {
			access = append(access, l)
		}
	}
	require.Len(t, access, 6, "%s", logs.String())
	assert.Regexp(t, `msg=access log=access method=POST path=/v1/chat/completions status=200 outcome=ok worker=1 attempts=1 first_byte_ms=[0-9.]+ total_ms=[0-9.]+ bytes=[1-9][0-9]* model=mock-model client=127\.0\.0\.1:[0-9]+ request_id=""$`, access[0])
	assert.Regexp(t, `path=/v1/chat/completions status=200 outcome=ok worker=1 attempts=1 .* bytes=[1-9][0-9]* model=mock-model client=127\.0\.0\.1:[0-9]+ request_id=req-7 first_token_ms=[0-9.]+$`, access[1],
		"the stream's bytes, request id and time to first token")
	assert.Regexp(t, `path=/v1/completions status=400 outcome=invalid worker=0 attempts=0`, access[2])
	assert.Contains(t, access[3], "path=/tokenize status=200")
	assert.Regexp(t, `status=200 outcome=query worker=1 attempts=0`, access[4])
	assert.Regexp(t, `status=200 outcome=ok .* model=mock-model client=127\.0\.0\.1:[0-9]+ request_id="" alias=assistant$`, access[5],
		"the target's model, and the alias the client named")
	assert.NotContains(t, logs.String(), "sk-secret")

	var errs syncBuffer
	g := startFleetLog(t, mocks(1, 1, 0), func(c *config.Config) { c.Log.Access = "errors" }, &errs)
	readAll(t, g.post("/v1/chat/completions", chatBody))
	readAll(t, g.post("/v1/chat/completions", "[]"))
	assert.Equal(t, 1, strings.Count(errs.String(), "log=access"), "only the error: %s", errs.String())
	assert.Contains(t, errs.String(), "status=400")

	var mirrored syncBuffer
	h := startFleetLog(t, mocks(1, 1, 0), func(c *config.Config) {
		c.Log.Access = "all"
		c.ModelMirrors = []mirrors.Mirror{{Model: "mock-model", To: "mock-model-next", Percent: 100}}
	}, &mirrored)
	readAll(t, h.post("/v1/chat/completions", chatBody))
	assert.Regexp(t, `status=200 outcome=ok .* model=mock-model .* mirrored_to=mock-model-next\n`, mirrored.String(),
		"a request copied names the shadow model its copy went to")
}

// stallMidStream sends the headers and one event, then goes silent.
func stallMidStream(c net.Conn, _ *http.Request) {
	_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
	chunk := "data: {\"partial\":1}\n\n"
	_, _ = fmt.Fprintf(c, "%x\r\n%s\r\n", len(chunk), chunk)
	_, _ = io.Copy(io.Discard, c)
}

func TestStreamTimeoutsFitStreams(t *testing.T) {
	silent := startFaultServer(t, stallMidStream)
	f := startFleet(t, mocks(1, 30, 20*time.Millisecond), func(c *config.Config) {
		c.Health.Interval, c.Health.EjectAfter = time.Hour, 0
		c.Limits.FirstByteTimeout, c.Limits.StreamIdleTimeout = 200*time.Millisecond, 200*time.Millisecond
		c.Workers = append(c.Workers, dataplane.WorkerSpec{ID: 2, URL: "http://" + silent.addr()})
	})
	// A 600 ms stream that keeps sending outlives both timeouts.
	start := time.Now()
	body := readAll(t, f.post("/v1/chat/completions", streamBody, "x-worker-id", "1"))
	assert.Greater(t, time.Since(start), 500*time.Millisecond)
	assert.True(t, strings.HasSuffix(body, "data: [DONE]\n\n"), "not cut: %q", body[max(0, len(body)-80):])

	// A stream gone silent is cut after the idle gap with an SSE error event.
	start = time.Now()
	resp := f.post("/v1/chat/completions", streamBody, "x-worker-id", "2")
	body = readAll(t, resp)
	took := time.Since(start)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Greater(t, took, 150*time.Millisecond)
	assert.Less(t, took, 2*time.Second)
	assert.Contains(t, body, `data: {"partial":1}`)
	assert.Contains(t, body, "\n\ndata: {\"error\":{\"message\":\"worker 2 sent nothing for 200ms (limits.stream_idle_timeout); the stream is cut\",\"type\":\"upstream_timeout\",\"code\":504}}\n\n")
	assert.EqualValues(t, 1, f.r.Frontend.Metrics().Requests("/v1/chat/completions", "timeout"))
	f.assertIdle()
}

// bigEvents streams 64 events of 256 KiB, 25 ms apart, then [DONE]: more
// than the kernel's socket buffers hold for a client that does not read
// (a send buffer grows to 4 MiB here, tcp_wmem).
func bigEvents(c net.Conn, _ *http.Request) {
	_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
	event := "data: " + strings.Repeat("x", 256<<10) + "\n\n"
	for range 64 {
		if _, err := fmt.Fprintf(c, "%x\r\n%s\r\n", len(event), event); err != nil {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	done := "data: [DONE]\n\n"
	_, _ = fmt.Fprintf(c, "%x\r\n%s\r\n0\r\n\r\n", len(done), done)
}

// limits.write_timeout bounds each write's wait for a client to take the
// answer (as nginx's send_timeout), not the whole answer: a stream longer
// than it goes on to its end, even after a write had to wait for a client
// behind, and a client that takes nothing for longer is cut.
func TestWriteTimeoutBoundsEachWriteNotTheStream(t *testing.T) {
	worker := startFaultServer(t, bigEvents)
	f := startFleet(t, nil, func(c *config.Config) {
		c.Health.Interval, c.Health.EjectAfter = time.Hour, 0
		c.Limits.WriteTimeout = time.Second
		c.Workers = []dataplane.WorkerSpec{{ID: 1, URL: "http://" + worker.addr()}}
	})
	// A client with a small receive buffer, that starts reading late: the
	// router's writes wait for it once its send buffer is full (after about
	// 0.4 s here; a machine with larger buffers waits less or not at all).
	dialer := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 8<<10) })
	}}
	stream := func(pause time.Duration) (string, error) {
		c, err := dialer.Dial("tcp", f.r.Addr())
		require.NoError(t, err)
		defer c.Close()
		_, err = fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(streamBody), streamBody)
		require.NoError(t, err)
		time.Sleep(pause)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}

	start := time.Now()
	body, err := stream(700 * time.Millisecond)
	require.NoError(t, err, "the stream went to its end")
	assert.Greater(t, time.Since(start), 1500*time.Millisecond, "a stream longer than write_timeout")
	assert.Equal(t, 64, strings.Count(body, "data: x"))
	assert.True(t, strings.HasSuffix(body, "data: [DONE]\n\n"))

	_, err = stream(4 * time.Second)
	assert.Error(t, err, "a client that took nothing for longer than write_timeout was cut")
	f.assertIdle()
}

// An upgrade's old process hands the admin listener over: it accepts no
// admin connection more, while its front end serves on, and its Close
// (the drain) still succeeds.
func TestHandOverAdminStopsAcceptingAdminConnections(t *testing.T) {
	f := startFleet(t, mocks(1, 4, 0), nil)
	code, _ := adminDo(t, f, "GET", "/workers", "", "")
	require.Equal(t, http.StatusOK, code)
	f.r.HandOverAdmin()
	require.Eventually(t, func() bool {
		_, err := net.DialTimeout("tcp", f.r.AdminAddr(), time.Second)
		return errors.Is(err, syscall.ECONNREFUSED)
	}, 5*time.Second, 10*time.Millisecond, "the admin listener is closed")
	resp := f.post("/v1/chat/completions", chatBody)
	readAll(t, resp)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the front end serves on")
	assert.NoError(t, f.r.Close())
}

// With generate_request_ids, the access log names the id the answer
// carries, made up for a request that came without one; a reload turns it
// off for the next request.
func TestGeneratedRequestIDsReachTheAccessLog(t *testing.T) {
	var logs syncBuffer
	f := startFleetLog(t, mocks(1, 3, 0), func(c *config.Config) {
		c.GenerateRequestIDs = true
		c.Log.Access = "all"
	}, &logs)
	resp := f.post("/v1/chat/completions", chatBody)
	readAll(t, resp)
	require.Equal(t, 200, resp.StatusCode)
	id := resp.Header.Get("X-Request-Id")
	require.Regexp(t, `^[0-9a-f]{32}$`, id)
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "request_id="+id) }, 5*time.Second, 5*time.Millisecond,
		"the access log names the request's id: %s", logs.String())
	cfg := f.r.CurrentConfig()
	cfg.GenerateRequestIDs = false
	applied, needRestart, err := f.r.Reload(cfg)
	require.NoError(t, err)
	assert.Equal(t, []string{"generate_request_ids=false"}, applied)
	assert.Empty(t, needRestart)
	resp = f.post("/v1/chat/completions", chatBody)
	readAll(t, resp)
	require.Equal(t, 200, resp.StatusCode)
	assert.Empty(t, resp.Header.Get("X-Request-Id"), "none made up after the reload")
	f.assertIdle()
}
