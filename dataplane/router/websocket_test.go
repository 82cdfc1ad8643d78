package router

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/aliases"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/websocket"
)

// wsEngine is an engine whose /v1/realtime speaks WebSocket (x/net's
// server, as vLLM's realtime API does through Starlette): it greets each
// session with its name, answers each message with its name before it,
// closes the session when asked ("close"), sends ticks when asked
// ("tick"), and counts its sessions open.
type wsEngine struct {
	*httptest.Server
	name   string
	open   atomic.Int64
	query  atomic.Value // the last opening request's query
	header atomic.Value // and its headers
	conns  sync.Map     // its sessions' connections
}

func startWSEngine(t *testing.T, name string) *wsEngine {
	t.Helper()
	e := &wsEngine{name: name}
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	mux.Handle("/v1/realtime", websocket.Server{Handler: func(ws *websocket.Conn) {
		e.open.Add(1)
		defer e.open.Add(-1)
		e.query.Store(ws.Request().URL.RawQuery)
		e.header.Store(ws.Request().Header.Clone())
		if websocket.Message.Send(ws, "created by "+name) != nil {
			return
		}
		for {
			var msg string
			if websocket.Message.Receive(ws, &msg) != nil {
				return
			}
			switch msg {
			case "close":
				return
			case "tick":
				for i := range 8 {
					time.Sleep(100 * time.Millisecond)
					if websocket.Message.Send(ws, "tick "+string(rune('0'+i))) != nil {
						return
					}
				}
			default:
				if websocket.Message.Send(ws, name+": "+msg) != nil {
					return
				}
			}
		}
	}})
	e.Server = httptest.NewUnstartedServer(mux)
	e.Config.ConnState = func(c net.Conn, st http.ConnState) {
		if st == http.StateHijacked { // a session's: x/net's server hijacks it
			e.conns.Store(c, true)
		}
	}
	e.Start()
	t.Cleanup(e.Close)
	return e
}

// reset resets the engine's session connections (a crash: RST, not FIN).
func (e *wsEngine) reset() {
	e.conns.Range(func(k, _ any) bool {
		if tc, ok := k.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = k.(net.Conn).Close()
		e.conns.Delete(k)
		return true
	})
}

// dialSession opens a WebSocket session through the router at path, with
// headers (name, value pairs), and reads its greeting.
func dialSession(t *testing.T, f *fleet, path string, headers ...string) (*websocket.Conn, string) {
	t.Helper()
	conf, err := websocket.NewConfig("ws://"+f.r.Addr()+path, "http://localhost/")
	require.NoError(t, err)
	for i := 0; i+1 < len(headers); i += 2 {
		conf.Header.Set(headers[i], headers[i+1])
	}
	ws, err := websocket.DialConfig(conf)
	require.NoError(t, err)
	t.Cleanup(func() { ws.Close() })
	return ws, receive(t, ws)
}

// receive reads a session's next message, within 5 s.
func receive(t *testing.T, ws *websocket.Conn) string {
	t.Helper()
	require.NoError(t, ws.SetReadDeadline(time.Now().Add(5*time.Second)))
	var msg string
	require.NoError(t, websocket.Message.Receive(ws, &msg))
	return msg
}

// closeFromEngine has the engine close the session, and checks that its
// close reaches the client (asserts only: it runs in goroutines too).
func closeFromEngine(t *testing.T, ws *websocket.Conn) {
	t.Helper()
	assert.NoError(t, websocket.Message.Send(ws, "close"))
	_ = ws.SetReadDeadline(time.Now().Add(5 * time.Second))
	var msg string
	assert.ErrorIs(t, websocket.Message.Receive(ws, &msg), io.EOF, "the engine's close reaches the client")
}

// sessionsEnded checks that n sessions ended with outcome: counted once
// the session's books closed, just after its reservation was released.
func sessionsEnded(t *testing.T, f *fleet, outcome string, n int) {
	t.Helper()
	assert.Eventually(t, func() bool { return f.r.Frontend.Metrics().Requests("websocket", outcome) == uint64(n) },
		5*time.Second, 5*time.Millisecond, "%d sessions ended %s", n, outcome)
}

// wsFleet starts an engine named "one" and a router in front of it alone,
// its config tweaked by tweak (nil: none).
func wsFleet(t *testing.T, tweak func(*config.Config)) (*wsEngine, *fleet) {
	t.Helper()
	one := startWSEngine(t, "one")
	return one, startFleet(t, nil, func(c *config.Config) {
		c.Workers = []dataplane.WorkerSpec{{ID: 1, URL: one.URL}}
		if tweak != nil {
			tweak(c)
		}
	})
}

// A WebSocket session (vLLM's realtime API) is routed like a request,
// holds its worker's reservation while it is open, passes messages both
// ways whole, large ones too, and releases the reservation however it
// ends: closed by the client or by the engine.
func TestWebSocketSessions(t *testing.T) {
	engines := []*wsEngine{startWSEngine(t, "one"), startWSEngine(t, "two")}
	f := startFleet(t, nil, func(c *config.Config) {
		c.Workers = []dataplane.WorkerSpec{{ID: 1, URL: engines[0].URL}, {ID: 2, URL: engines[1].URL}}
	})
	a, greetA := dialSession(t, f, "/v1/realtime")
	b, greetB := dialSession(t, f, "/v1/realtime")
	assert.ElementsMatch(t, []string{"created by one", "created by two"}, []string{greetA, greetB}, "one session on each engine")
	nameA := strings.TrimPrefix(greetA, "created by ")
	for _, w := range f.r.Registry.All() {
		assert.EqualValues(t, 1, w.Occupancy(), "worker %d holds its session", w.ID())
	}
	assert.Equal(t, "2", metric(t, f, "fastroute_websocket_sessions"))
	for _, id := range []string{"1", "2"} {
		assert.Equal(t, "1", metric(t, f, `fastroute_worker_connections{worker="`+id+`"}`), "the session's own connection")
	}

	// Messages both ways, interleaved between the sessions; one larger
	// than the relay's buffers and the engine's frames.
	large := strings.Repeat("audio chunk ", 20000)
	for i, msg := range []string{"hello", large, "again"} {
		require.NoError(t, websocket.Message.Send(a, msg))
		require.NoError(t, websocket.Message.Send(b, "b"+msg))
		assert.Equal(t, nameA+": "+msg, receive(t, a), "message %d", i)
		assert.True(t, strings.HasSuffix(receive(t, b), ": b"+msg), "message %d", i)
	}

	// The client closes one session, the engine the other: both released.
	require.NoError(t, a.Close())
	closeFromEngine(t, b)
	f.assertIdle()
	require.Eventually(t, func() bool { return engines[0].open.Load()+engines[1].open.Load() == 0 }, 5*time.Second, 10*time.Millisecond,
		"the client's close reaches the engine")
	assert.Equal(t, "0", metric(t, f, "fastroute_websocket_sessions"))
	sessionsEnded(t, f, "ok", 2)
}

// A session's opening request is routed by the query's model (OpenAI's
// realtime URL names it so), aliases included, reaches its engine with the
// router's headers (the rank, the workers' API key in place of the
// client's), and moves to another worker when its first one cannot be
// reached.
func TestWebSocketRouting(t *testing.T) {
	one, two := startWSEngine(t, "one"), startWSEngine(t, "two")
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	goneURL := "http://" + gone.Addr().String()
	require.NoError(t, gone.Close()) // nothing listens there
	f := startFleet(t, nil, func(c *config.Config) {
		c.Workers = []dataplane.WorkerSpec{{ID: 1, URL: one.URL, Models: []string{"voxtral"}, DPSize: 2},
			{ID: 2, URL: two.URL, Models: []string{"whisper"}}, {ID: 3, URL: goneURL, Models: []string{"whisper"}}}
		c.Health.Interval, c.Health.EjectAfter = time.Hour, 0 // keep the unreachable worker routable
		c.ModelAliases = []aliases.Alias{{Name: "asr", Targets: []aliases.Target{{Model: "voxtral"}}}}
		c.APIKeysFile = keysFile(t, "team-a "+teamAKey)
		c.WorkerAPIKey = "sk-engines"
	})
	for range 3 {
		ws, greeting := dialSession(t, f, "/v1/realtime?model=whisper&intent=transcription", "Authorization", "Bearer "+teamAKey)
		assert.Equal(t, "created by two", greeting, "worker 3 is unreachable: its sessions move to worker 2")
		require.NoError(t, ws.Close())
	}
	ws, greeting := dialSession(t, f, "/v1/realtime?model=asr", "Authorization", "Bearer "+teamAKey)
	assert.Equal(t, "created by one", greeting, "the alias's target serves it")
	assert.Equal(t, "model=voxtral", one.query.Load(), "the engine is asked for the alias's target")
	h := one.header.Load().(http.Header)
	assert.Equal(t, "Bearer sk-engines", h.Get("Authorization"), "the workers' key, not the client's")
	assert.Equal(t, "0", h.Get("X-Data-Parallel-Rank"))
	require.NoError(t, ws.Close())
	f.assertIdle()
	assert.NotZero(t, f.r.Frontend.Metrics().Retries())

	// No key: refused before any worker is asked.
	conf, err := websocket.NewConfig("ws://"+f.r.Addr()+"/v1/realtime?model=whisper", "http://localhost/")
	require.NoError(t, err)
	_, err = websocket.DialConfig(conf)
	assert.ErrorContains(t, err, "bad status")
}

// openRaw sends a WebSocket opening request for path over a raw
// connection and returns the router's answer (its body read).
func openRaw(t *testing.T, f *fleet, path string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", f.r.Addr())
	require.NoError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: router\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	return resp, readAll(t, resp)
}

// An engine that does not switch protocols (no WebSocket on that path) is
// answered as any answer is, and a session opening request to a path the
// router does not proxy is a 404 as any request is.
func TestWebSocketRefused(t *testing.T) {
	_, f := wsFleet(t, nil)
	resp, body := openRaw(t, f, "/v1/audio/stream")
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, body)
	assert.Equal(t, "1", resp.Header.Get("X-Fastroute-Worker"), "the engine's own answer")
	resp, body = openRaw(t, f, "/v1/responses") // a named route: the engine's answer (it has no WebSocket mode)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, body)
	assert.Equal(t, "1", resp.Header.Get("X-Fastroute-Worker"))
	resp, body = openRaw(t, f, "/realtime")
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Contains(t, body, `no route \"/realtime\"`)
	resp, body = openRaw(t, f, "/v1/realtime")
	assert.Equal(t, http.StatusSwitchingProtocols, resp.StatusCode, body)
	assert.Equal(t, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=", resp.Header.Get("Sec-WebSocket-Accept"), "the engine's accept, as it sent it")
	assert.True(t, strings.EqualFold(resp.Header.Get("Upgrade"), "websocket"))
	f.assertIdle()
}

// A session where nothing passes either way for limits.stream_idle_timeout
// is closed; one where only the engine sends is not. A drain that runs out
// of time cuts the sessions still open.
func TestWebSocketIdleAndDrain(t *testing.T) {
	one, f := wsFleet(t, func(c *config.Config) {
		c.Limits.StreamIdleTimeout = 600 * time.Millisecond
		c.ShutdownTimeout = 200 * time.Millisecond
	})
	idle, _ := dialSession(t, f, "/v1/realtime")
	busy, _ := dialSession(t, f, "/v1/realtime")
	require.NoError(t, websocket.Message.Send(busy, "tick"))
	for i := range 8 { // 800 ms of ticks, the client silent
		assert.Equal(t, "tick "+string(rune('0'+i)), receive(t, busy))
	}
	require.NoError(t, idle.SetReadDeadline(time.Now().Add(5*time.Second)))
	var msg string
	assert.ErrorIs(t, websocket.Message.Receive(idle, &msg), io.EOF, "the idle session was closed")
	sessionsEnded(t, f, "timeout", 1)

	require.NoError(t, websocket.Message.Send(busy, "still here"))
	assert.Equal(t, "one: still here", receive(t, busy))
	closed := make(chan error, 1)
	go func() { closed <- f.r.Close() }()
	require.NoError(t, busy.SetReadDeadline(time.Now().Add(5*time.Second)))
	assert.Error(t, websocket.Message.Receive(busy, &msg), "the drain cut the session")
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the drain waited on the session")
	}
	f.assertIdle()
	require.Eventually(t, func() bool { return one.open.Load() == 0 }, 5*time.Second, 10*time.Millisecond)
}

// Many sessions at once, closed by their clients or their engines, leave
// every count at zero (run under the race detector by make test).
func TestWebSocketSessionsAtOnce(t *testing.T) {
	engines := []*wsEngine{startWSEngine(t, "one"), startWSEngine(t, "two")}
	f := startFleet(t, nil, func(c *config.Config) {
		c.Workers = []dataplane.WorkerSpec{{ID: 1, URL: engines[0].URL}, {ID: 2, URL: engines[1].URL}}
	})
	const sessions = 24
	var wg sync.WaitGroup
	for i := range sessions {
		wg.Go(func() {
			conf, err := websocket.NewConfig("ws://"+f.r.Addr()+"/v1/realtime", "http://localhost/")
			if !assert.NoError(t, err) {
				return
			}
			ws, err := websocket.DialConfig(conf)
			if !assert.NoError(t, err) {
				return
			}
			defer ws.Close()
			_ = ws.SetDeadline(time.Now().Add(10 * time.Second))
			var msg string
			assert.NoError(t, websocket.Message.Receive(ws, &msg))
			for j := range 5 {
				text := fmt.Sprintf("session %d message %d", i, j)
				assert.NoError(t, websocket.Message.Send(ws, text))
				assert.NoError(t, websocket.Message.Receive(ws, &msg))
				assert.True(t, strings.HasSuffix(msg, ": "+text), msg)
			}
			if i%2 == 0 {
				closeFromEngine(t, ws)
			}
		})
	}
	wg.Wait()
	f.assertIdle()
	require.Eventually(t, func() bool { return engines[0].open.Load()+engines[1].open.Load() == 0 }, 5*time.Second, 10*time.Millisecond)
	sessionsEnded(t, f, "ok", sessions)
	assert.Equal(t, "0", metric(t, f, "fastroute_websocket_sessions"))
	for _, id := range []string{"1", "2"} {
		assert.Equal(t, "0", metric(t, f, `fastroute_worker_connections{worker="`+id+`"}`), "the sessions' connections closed")
	}
}

// A session over a TLS front end (wss://) is relayed as a plain one is:
// read and written through crypto/tls.
func TestWebSocketOverTLS(t *testing.T) {
	files, pool := writeCert(t, t.TempDir(), 1)
	_, f := wsFleet(t, func(c *config.Config) {
		c.TLS = files
	})
	conf, err := websocket.NewConfig("wss://"+f.r.Addr()+"/v1/realtime", "https://localhost/")
	require.NoError(t, err)
	conf.TlsConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	ws, err := websocket.DialConfig(conf)
	require.NoError(t, err)
	defer ws.Close()
	assert.Equal(t, "created by one", receive(t, ws))
	large := strings.Repeat("pcm16 ", 30000)
	for _, msg := range []string{"hello", large} {
		require.NoError(t, websocket.Message.Send(ws, msg))
		assert.Equal(t, "one: "+msg, receive(t, ws))
	}
	closeFromEngine(t, ws)
	f.assertIdle()
	sessionsEnded(t, f, "ok", 1)
}

// A session stays open while it is quiet for less than the idle bound,
// however short the opening request's own deadlines (read_timeout,
// write_timeout) were: they do not carry over to it.
func TestWebSocketOutlivesTheRequestDeadlines(t *testing.T) {
	_, f := wsFleet(t, func(c *config.Config) {
		c.Limits.StreamIdleTimeout = 5 * time.Second
		c.Limits.ReadTimeout, c.Limits.WriteTimeout = 200*time.Millisecond, 200*time.Millisecond
	})
	ws, _ := dialSession(t, f, "/v1/realtime")
	time.Sleep(600 * time.Millisecond)
	require.NoError(t, websocket.Message.Send(ws, "after a pause"))
	assert.Equal(t, "one: after a pause", receive(t, ws))
	require.NoError(t, ws.Close())
	f.assertIdle()
	sessionsEnded(t, f, "ok", 1)
}

// An engine that crashes mid-session (its connection reset) ends the
// session as an upstream error, counted against the worker; the client's
// connection is closed.
func TestWebSocketEngineCrash(t *testing.T) {
	one, f := wsFleet(t, nil)
	ws, _ := dialSession(t, f, "/v1/realtime")
	require.NoError(t, websocket.Message.Send(ws, "before"))
	assert.Equal(t, "one: before", receive(t, ws))
	one.reset()
	require.NoError(t, ws.SetReadDeadline(time.Now().Add(5*time.Second)))
	var msg string
	assert.Error(t, websocket.Message.Receive(ws, &msg), "the client's connection is closed")
	f.assertIdle()
	sessionsEnded(t, f, "upstream_error", 1)
	assert.Equal(t, "1", metric(t, f, `fastroute_worker_failures_total{worker="1",reason="cut"}`))
}

// A browser, which cannot set Authorization on a WebSocket, names its API
// key among its subprotocols as OpenAI's realtime API takes it; the key
// goes no further: the engine is offered the other subprotocols (x/net's
// server refuses a handshake that offers it more than one) and gets the
// workers' key.
func TestWebSocketKeyAmongTheSubprotocols(t *testing.T) {
	one, f := wsFleet(t, func(c *config.Config) {
		c.APIKeysFile = keysFile(t, "team-a "+teamAKey)
		c.WorkerAPIKey = "sk-engines"
	})
	conf, err := websocket.NewConfig("ws://"+f.r.Addr()+"/v1/realtime", "https://app.example/")
	require.NoError(t, err)
	conf.Protocol = []string{"realtime", "openai-insecure-api-key." + teamAKey}
	ws, err := websocket.DialConfig(conf)
	require.NoError(t, err)
	defer ws.Close()
	assert.Equal(t, "created by one", receive(t, ws))
	h := one.header.Load().(http.Header)
	assert.Equal(t, "realtime", h.Get("Sec-WebSocket-Protocol"), "the key is not offered on")
	assert.Equal(t, "Bearer sk-engines", h.Get("Authorization"))
	require.NoError(t, websocket.Message.Send(ws, "hi"))
	assert.Equal(t, "one: hi", receive(t, ws))

	conf.Protocol = []string{"realtime", "openai-insecure-api-key.sk-not-a-key"}
	_, err = websocket.DialConfig(conf)
	assert.ErrorContains(t, err, "bad status", "an unknown key is a 401")
	require.NoError(t, ws.Close())
	f.assertIdle()
}

// refusingEngine is an engine that passes its health probes and answers
// every other request, a session's opening among them, status with body,
// until the test ends.
func refusingEngine(t *testing.T, status int, body string) *httptest.Server {
	e := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			_, _ = io.WriteString(w, "ok")
			return
		}
		http.Error(w, body, status)
	}))
	t.Cleanup(e.Close)
	return e
}

// A session whose worker answers a status of router.retry_statuses moves
// to another worker, as any request does; with no other, the client gets
// that answer.
func TestWebSocketRefusalMovesOn(t *testing.T) {
	overloaded := refusingEngine(t, http.StatusServiceUnavailable, `{"error":"overloaded"}`)
	two := startWSEngine(t, "two")
	f := startFleet(t, nil, func(c *config.Config) {
		c.Workers = []dataplane.WorkerSpec{{ID: 1, URL: overloaded.URL}, {ID: 2, URL: two.URL}}
		c.Router.RetryStatuses = []int{503}
		c.Health.EjectAfter = 0 // its 503s do not take it out: it must answer the last session
	})
	for range 4 {
		ws, greeting := dialSession(t, f, "/v1/realtime")
		assert.Equal(t, "created by two", greeting)
		require.NoError(t, ws.Close())
	}
	assert.NotZero(t, f.r.Frontend.Metrics().Retries(), "sessions moved off the overloaded worker")
	require.NoError(t, f.r.Registry.Drain(2))
	resp, body := openRaw(t, f, "/v1/realtime")
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "no other worker: its answer")
	assert.Contains(t, body, "overloaded")
	f.assertIdle()
}

// A session that names no model moves past a worker that answers 404 (an
// engine without the realtime API: another model's, a text-only one) to
// one that serves it, up to every worker; one that names its model does
// not (the model's workers serve it, or none does), nor does one where no
// worker serves the path.
func TestWebSocketSessionWithoutAModelFindsAnEngineThatServesIt(t *testing.T) {
	text := refusingEngine(t, http.StatusNotFound, "404 page not found")
	two := startWSEngine(t, "two")
	f := startFleet(t, nil, func(c *config.Config) {
		c.Workers = []dataplane.WorkerSpec{{ID: 1, URL: text.URL}, {ID: 2, URL: two.URL}}
	})
	for range 4 {
		ws, greeting := dialSession(t, f, "/v1/realtime")
		assert.Equal(t, "created by two", greeting)
		require.NoError(t, ws.Close())
	}
	assert.NotZero(t, f.r.Frontend.Metrics().Retries(), "sessions moved off the text-only worker")
	refused := 0
	for range 2 { // round robin: one of the two goes to worker 1 first
		resp, _ := openRaw(t, f, "/v1/realtime?model=mock-model")
		if resp.StatusCode == http.StatusNotFound {
			refused++
			assert.Equal(t, "1", resp.Header.Get("X-Fastroute-Worker"))
		}
	}
	assert.Equal(t, 1, refused, "a session naming its model stays where it was sent")
	resp, body := openRaw(t, f, "/v1/audio/stream")
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, body)
	f.assertIdle()
	require.Eventually(t, func() bool { return two.open.Load() == 0 }, 5*time.Second, 10*time.Millisecond)
}
