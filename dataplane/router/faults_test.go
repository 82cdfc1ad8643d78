package router

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/pickers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// faultServer is a raw TCP worker that answers /health and misbehaves on
// every other request; it counts those requests and closes everything on stop.
type faultServer struct {
	ln    net.Listener
	hits  atomic.Int64
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

// startFaultServer serves misbehave(conn, request) for generation requests.
func startFaultServer(t *testing.T, misbehave func(c net.Conn, req *http.Request)) *faultServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &faultServer{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				rd := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(rd)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					if req.URL.Path == "/health" || req.URL.Path == "/v1/models" {
						_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
						continue
					}
					if req.Method != http.MethodPost { // no engine metrics here: the router's scraper gets a 404
						_, _ = io.WriteString(c, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
						continue
					}
					s.hits.Add(1)
					misbehave(c, req)
					return
				}
			}()
		}
	}()
	t.Cleanup(s.stop)
	return s
}

func (s *faultServer) addr() string { return s.ln.Addr().String() }

func (s *faultServer) stop() {
	_ = s.ln.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// cutMidAnswer sends the headers and a first piece of the body, then resets.
func cutMidAnswer(c net.Conn, _ *http.Request) {
	_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
	chunk := "data: {\"partial\":1}\n\n"
	_, _ = fmt.Fprintf(c, "%x\r\n%s\r\n", len(chunk), chunk)
	time.Sleep(5 * time.Millisecond)
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0) // RST, not FIN
	}
}

// badHead answers a head that cannot be read (two lengths), then closes.
func badHead(c net.Conn, _ *http.Request) {
	_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}")
}

// stall reads the request and never answers (until stop).
func stall(c net.Conn, _ *http.Request) { _, _ = io.Copy(io.Discard, c) }

// outcome is how one client request ended.
type outcome struct {
	status int
	worker string
	full   bool   // a complete answer ([DONE] for a stream, JSON for the rest)
	broken bool   // 200 whose answer broke mid-way
	errMsg string // OpenAI error message for status >= 400
}

func doRequest(client *http.Client, base string, i int) (outcome, error) {
	stream := i%3 == 0
	path := []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings"}[i%3]
	body := fmt.Sprintf(`{"model":"mock-model","stream":%v,"prompt":"req-%d","input":["req-%d"],"messages":[]}`, stream, i, i)
	if path == "/v1/embeddings" {
		stream = false
	}
	resp, err := client.Post(base+path, "application/json", strings.NewReader(body))
	if err != nil {
		return outcome{}, fmt.Errorf("request %d got no answer: %w", i, err)
	}
	defer resp.Body.Close()
	o := outcome{status: resp.StatusCode, worker: resp.Header.Get("x-fastroute-worker")}
	data, rerr := io.ReadAll(resp.Body)
	switch {
	case o.status == http.StatusOK && stream:
		o.full = rerr == nil && strings.HasSuffix(strings.TrimSpace(string(data)), "data: [DONE]")
		o.broken = !o.full
	case o.status == http.StatusOK:
		// An event-stream answer is streamed even to a non-streaming
		// request, so a cut one reaches the client broken, as a stream does.
		o.full = rerr == nil && json.Valid(data)
		o.broken = !o.full
	default:
		var e struct {
			Error struct{ Message string } `json:"error"`
		}
		if rerr != nil || json.Unmarshal(data, &e) != nil || e.Error.Message == "" {
			return o, fmt.Errorf("request %d: status %d without an OpenAI error body: %q", i, o.status, data)
		}
		o.errMsg = e.Error.Message
	}
	return o, nil
}

// TestFaultInjectionUnderLoad sends 3000 mixed requests from 32 clients to a
// fleet with a worker that refuses connections, one that resets mid-answer,
// one whose answers' heads cannot be read, one that stalls past the
// upstream timeout, one that answers half its requests with 500, and one
// that is killed and restarted during the load.
// Every request must end in a full answer or a clear error; afterwards no
// reservation and no goroutine is left, and no request was retried once
// bytes had come back.
func TestFaultInjectionUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("load test")
	}
	baseline := liveGoroutines()
	cut := startFaultServer(t, cutMidAnswer)
	stalled := startFaultServer(t, stall)
	unreadable := startFaultServer(t, badHead)
	good := []mockworker.Options{
		{ID: 1, Tokens: 4, TokenInterval: time.Millisecond},
		{ID: 2, Tokens: 4, TokenInterval: time.Millisecond},
		{ID: 4, Tokens: 4, TokenInterval: time.Millisecond, FailRate: 0.5},
	}
	// Worker 3 is killed and restarted on the same address: on 127.0.0.3,
	// so that no other test's 127.0.0.1:0 listener takes its port meanwhile.
	restartable := mockworker.Options{ID: 3, Tokens: 4, TokenInterval: time.Millisecond}
	killed, err := mockworker.Start("127.0.0.3:0", restartable)
	require.NoError(t, err)
	f := startFleet(t, good, func(c *config.Config) {
		c.Router.Mode = pickers.ModeP2C
		c.Router.Retries = 3
		c.Limits.FirstByteTimeout = 300 * time.Millisecond
		c.Limits.ConnectTimeout = 200 * time.Millisecond
		c.Health.Interval, c.Health.UnhealthyAfter = 50*time.Millisecond, 2
		// Passive health ejects the failing workers for short spells, so
		// they keep being tried (and the restarted one comes back) in a
		// run this short.
		c.Health.EjectTime, c.Health.EjectMax = 100*time.Millisecond, 400*time.Millisecond
		c.Workers = append(c.Workers,
			dataplane.WorkerSpec{ID: 3, URL: killed.URL()},
			dataplane.WorkerSpec{ID: 5, URL: "http://" + deadAddr(t)},
			dataplane.WorkerSpec{ID: 6, URL: "http://" + cut.addr()},
			dataplane.WorkerSpec{ID: 7, URL: "http://" + stalled.addr()},
			dataplane.WorkerSpec{ID: 8, URL: "http://" + unreadable.addr()})
	})
	base := "http://" + f.r.Addr()
	const total, clients = 3000, 32
	outcomes := make([]outcome, total)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, total)
	// The last sixth waits until the restarted worker 3 is routable again,
	// so that whether it is used again does not hang on how fast the health
	// loop runs on a loaded machine.
	back := make(chan struct{})
	var backOnce sync.Once
	letBack := func() { backOnce.Do(func() { close(back) }) }
	defer letBack()
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= total {
					return
				}
				if i >= 5*total/6 {
					<-back
				}
				o, err := doRequest(f.client, base, i)
				if err != nil {
					errs <- err
				}
				outcomes[i] = o
			}
		}()
	}
	// Kill worker 3 a third of the way in, restart it on the same address at two thirds.
	addr := killed.Addr()
	require.Eventually(t, func() bool { return next.Load() > total/3 }, 30*time.Second, time.Millisecond)
	killed.Kill()
	require.Eventually(t, func() bool { return next.Load() > 2*total/3 }, 30*time.Second, time.Millisecond)
	restarted, err := mockworker.Start(addr, restartable)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return f.r.Registry.Snapshot().Has(3) }, 10*time.Second, time.Millisecond,
		"the restarted worker is routable again")
	letBack()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	counts := map[string]int{}
	servedBy := map[string]int{}
	for i, o := range outcomes {
		switch {
		case o.full:
			counts["full"]++
			servedBy[o.worker]++
		case o.broken:
			counts["broken stream"]++
			if o.worker != "6" && o.worker != "3" {
				t.Errorf("request %d: stream broke on worker %s, which neither resets nor was killed", i, o.worker)
			}
		case o.status == http.StatusInternalServerError:
			counts["500 from worker"]++
			if o.worker != "4" {
				t.Errorf("request %d: 500 from worker %q", i, o.worker)
			}
		case o.status >= 400:
			counts[fmt.Sprintf("%d", o.status)]++
		default:
			t.Errorf("request %d: status %d, neither a full answer nor a clear error", i, o.status)
		}
	}
	t.Logf("outcomes %v; full answers by worker %v; retries %d; cut server hits %d, unreadable server hits %d, stall server hits %d; worker 3 restarted served %d",
		counts, servedBy, f.r.Frontend.Metrics().Retries(), cut.hits.Load(), unreadable.hits.Load(), stalled.hits.Load(), restarted.Served())
	assert.Positive(t, counts["full"])
	assert.Positive(t, f.r.Frontend.Metrics().Retries(), "refused connections were retried")
	assert.Positive(t, restarted.Served(), "the restarted worker is used again")
	assert.Positive(t, f.r.Registry.Ejections(), "the refusing, resetting and stalling workers were ejected for spells")

	// No retry after the first byte: every request the resetting worker saw
	// came back to its client from that worker (a broken stream or a 502
	// naming it), none was answered again by another worker; every one the
	// worker of unreadable heads saw, a 502 naming it. Likewise every
	// request the stalling worker saw ended in a 504 naming it. So a fault
	// server's count of requests is at most the outcomes naming it, and at
	// least those it must have seen (sure). The difference is the 504s of
	// first_byte_timeout naming it, which on a loaded machine may come
	// before the request reached it (the server had not read it, or the
	// router had not sent it yet). A request whose connect timed out (its
	// SYN unanswered, no retry left) never reached it and is not counted.
	type tally struct{ sure, maybe int }
	byWorker := map[string]*tally{"6": {}, "7": {}, "8": {}}
	namedErrors := map[string]int{}
	for _, o := range outcomes {
		for id, n := range byWorker {
			named := strings.Contains(o.errMsg, "worker "+id+" ")
			switch {
			case named && strings.Contains(o.errMsg, "connect timed out"):
				namedErrors[o.errMsg]++
			case named && strings.Contains(o.errMsg, "no answer within limits.first_byte_timeout"):
				n.maybe++
			case named, o.worker == id && o.broken:
				n.sure++
			}
		}
	}
	// A fault server counts a request when it has read it, which on a
	// loaded machine can be after the last client had its answer: counts
	// only grow, so each may still rise to its sure count.
	for _, c := range []struct {
		id   string
		hits *atomic.Int64
		what string
	}{
		{"6", &cut.hits, "requests cut after the first byte were not retried"},
		{"8", &unreadable.hits, "requests answered with an unreadable head were not retried"},
		{"7", &stalled.hits, "timed-out requests were not retried"},
	} {
		n := byWorker[c.id]
		assert.Eventually(t, func() bool { return c.hits.Load() >= int64(n.sure) }, 5*time.Second, 10*time.Millisecond, "%s: sure %d", c.what, n.sure)
		assert.LessOrEqual(t, c.hits.Load(), int64(n.sure+n.maybe), "%s: sure %d, maybe %d", c.what, n.sure, n.maybe)
		assert.Positive(t, c.hits.Load(), c.what)
	}
	t.Logf("outcomes naming the fault servers %s; errors of connects that timed out: %v", fmt.Sprint(*byWorker["6"], *byWorker["7"], *byWorker["8"]), namedErrors)

	f.assertIdle()
	var accounted uint64
	for _, rt := range []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings"} {
		for _, oc := range []string{"ok", "cancelled", "upstream_error", "timeout", "no_endpoints", "exhausted", "invalid"} {
			accounted += f.r.Frontend.Metrics().Requests(rt, oc)
		}
	}
	assert.EqualValues(t, total, accounted, "every request counted once")

	// Tear everything down and check that no goroutine outlives it.
	f.client.CloseIdleConnections()
	require.NoError(t, f.r.Close())
	for _, m := range f.mocks {
		_ = m.Close()
	}
	_ = restarted.Close()
	cut.stop()
	stalled.stop()
	unreadable.stop()
	deadline := time.Now().Add(10 * time.Second) // polled here: testify's Eventually adds a goroutine of its own
	for liveGoroutines() > baseline && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := liveGoroutines(); n > baseline {
		buf := make([]byte, 1<<20)
		t.Errorf("goroutines outlive the router: %d at start, %d now:\n%s", baseline, n, buf[:runtime.Stack(buf, true)])
	}
}

// liveGoroutines counts the goroutines other than fasthttp's process-wide
// helpers (the server date updater, the dialer's address cache cleaner) and
// its idle-connection cleaners (per HostClient and per Client), which sleep
// out their period and exit once their client has no connection left.
func liveGoroutines() int {
	buf := make([]byte, 1<<20)
	n := 0
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if !strings.Contains(g, "fasthttp.updateServerDate") && !strings.Contains(g, "tcpAddrsClean") &&
			!strings.Contains(g, "HostClient).connsCleaner") && !strings.Contains(g, "Client).mCleaner") {
			n++
		}
	}
	return n
}
