package frontend

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// answerScript is how the worker of FuzzAnswersReachTheClientWhole answers.
type answerScript struct {
	body   []byte
	pieces []byte // sizes of the writes (and of the chunks, chunked)
	frame  byte   // 0: Content-Length, 1: chunked, 2: to the close, 3: HTTP/1.0 to the close
	sse    bool   // text/event-stream, else JSON
	cut    bool   // the worker closes before the end (Content-Length, chunked)
}

// write answers on c as the script says; false: c is to be closed.
func (s *answerScript) write(c net.Conn) bool {
	typ := "application/json"
	if s.sse {
		typ = "text/event-stream"
	}
	head := map[byte]string{
		0: fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n", typ, len(s.body)),
		1: "HTTP/1.1 200 OK\r\nContent-Type: " + typ + "\r\nTransfer-Encoding: chunked\r\n\r\n",
		2: "HTTP/1.1 200 OK\r\nContent-Type: " + typ + "\r\n\r\n",
		3: "HTTP/1.0 200 OK\r\nContent-Type: " + typ + "\r\n\r\n",
	}[s.frame]
	if _, err := io.WriteString(c, head); err != nil {
		return false
	}
	if writePieces(c, s.body, s.pieces, s.cut, s.frame == 1) != nil || s.cut || s.frame >= 2 {
		return false
	}
	if s.frame == 1 {
		_, err := io.WriteString(c, "0\r\n\r\n")
		return err == nil
	}
	return true
}

// writePieces writes body (its first half when cut) to c in pieces of the
// sizes pieces give (whole when none), each a chunk when chunked (the last
// chunk is the caller's), in 256 pieces at most, every third of the first
// 30 a millisecond after the one before, so that some come apart. (A body
// of thousands of pieces, a pause after every third, took seconds an input:
// a minute's fuzzing ran about 60.)
func writePieces(c net.Conn, body, pieces []byte, cut, chunked bool) error {
	rest := body
	if cut {
		rest = rest[:len(rest)/2]
	}
	for i := 0; len(rest) > 0; i++ {
		n := len(rest)
		if len(pieces) > 0 {
			n = min(n, max(int(pieces[i%len(pieces)])*32+1, len(body)/256))
		}
		out := rest[:n]
		if chunked {
			out = fmt.Appendf(nil, "%x\r\n%s\r\n", n, out)
		}
		if _, err := c.Write(out); err != nil {
			return err
		}
		rest = rest[n:]
		if i%3 == 2 && i < 30 {
			time.Sleep(time.Millisecond)
		}
	}
	return nil
}

// FuzzAnswersReachTheClientWhole: whatever a worker answers (a body of any
// bytes, of known length, chunked in pieces or read to the close, JSON or
// an event stream, for a request that asked for a stream or not), the
// client gets that body as it was, once; an answer the worker cut short
// reaches the client cut (a failed read or a 502), never longer or
// different. Every reservation is released.
func FuzzAnswersReachTheClientWhole(f *testing.F) {
	f.Add([]byte(`{"a":1}`), []byte{0}, byte(0), false, false, false)
	f.Add([]byte("data: a\n\ndata: b\n\n"), []byte{0, 1}, byte(1), true, true, false)
	f.Add(bytes.Repeat([]byte("xyz"), 5000), []byte{200, 3}, byte(2), false, false, false)
	f.Add(bytes.Repeat([]byte("data: t\n\n"), 900), []byte{7}, byte(3), true, true, false)
	f.Add(bytes.Repeat([]byte("q"), 9000), []byte{100}, byte(0), false, false, true)
	f.Add([]byte("data: a\n\n"), []byte{}, byte(1), true, false, true)
	var script atomic.Pointer[answerScript]
	addr := rawServer(f, func(c net.Conn, _ *http.Request) bool { return script.Load().write(c) })
	reg, _, url := serveOne(f, addr, Options{}, nil)
	client := &http.Client{Timeout: 5 * time.Second}
	w, _ := reg.Get(1)
	f.Fuzz(func(t *testing.T, body, pieces []byte, frame byte, sse, stream, cut bool) {
		s := &answerScript{body: body, pieces: pieces, frame: frame % 4, sse: sse, cut: cut && frame%4 < 2 && len(body) > 1}
		script.Store(s)
		req := `{"model":"m"}`
		if stream {
			req = `{"model":"m","stream":true}`
		}
		resp, err := client.Post(url, "application/json", strings.NewReader(req))
		require.NoError(t, err)
		got, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case !s.cut:
			require.NoError(t, rerr)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", got)
			require.Equal(t, string(body), string(got), "the body as the worker sent it")
		case resp.StatusCode == http.StatusOK:
			require.Error(t, rerr, "a cut answer is cut for the client")
			if s.sse && s.frame != 0 { // then the SSE event that says why (no room in a stated length)
				var event []byte
				got, event, _ = bytes.Cut(got, []byte("\n\ndata: {\"error\":"))
				require.Contains(t, string(event), "worker 1 broke the stream")
			}
			require.True(t, bytes.HasPrefix(body, got), "what came of a cut answer is its start: %q of %q", got, body)
		default:
			require.Equal(t, http.StatusBadGateway, resp.StatusCode)
		}
		require.Eventually(t, func() bool { return w.Occupancy() == 0 }, 2*time.Second, time.Millisecond)
	})
}

// FuzzRequestsReachTheWorkerWhole: whatever body a client sends (any
// bytes, of stated length or chunked, in random pieces), the worker gets
// it as sent, once; a request whose client closes before its body is whole
// reaches no worker. Every reservation is released.
func FuzzRequestsReachTheWorkerWhole(f *testing.F) {
	f.Add([]byte("RIFF"), []byte{0}, false, false)
	f.Add(bytes.Repeat([]byte("abc"), 7000), []byte{3, 200}, true, false)
	f.Add(bytes.Repeat([]byte{0, 1, 2}, 3000), []byte{40}, false, true)
	f.Add([]byte("x\r\n0\r\n\r\n"), []byte{}, true, true)
	got := make(chan []byte, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(f, err)
	worker := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			b = append(b, "<read failed>"...)
		}
		got <- b
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, "{}")
	})}
	go func() { _ = worker.Serve(ln) }()
	f.Cleanup(func() { _ = worker.Close() })
	reg, _, url := serveOne(f, ln.Addr().String(), Options{ClientLimits: ClientLimits{MaxBodyBytes: 1 << 20}}, nil)
	front := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/v1/chat/completions")
	w, _ := reg.Get(1)
	f.Fuzz(func(t *testing.T, body, pieces []byte, chunked, cut bool) {
		cut = cut && len(body) > 1
		c, err := net.Dial("tcp", front)
		require.NoError(t, err)
		defer c.Close()
		head := "POST /v1/audio/x HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
		if chunked {
			head += "Transfer-Encoding: chunked\r\n\r\n"
		} else {
			head += fmt.Sprintf("Content-Length: %d\r\n\r\n", len(body))
		}
		_, err = io.WriteString(c, head)
		require.NoError(t, err)
		require.NoError(t, writePieces(c, body, pieces, cut, chunked))
		if cut {
			require.NoError(t, c.(*net.TCPConn).CloseWrite())
		} else if chunked {
			_, err = io.WriteString(c, "0\r\n\r\n")
			require.NoError(t, err)
		}
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if cut {
			if err == nil {
				require.NotEqual(t, http.StatusOK, resp.StatusCode, "a request cut short is not answered by a worker")
			}
			select {
			case b := <-got:
				t.Fatalf("the worker got a request cut short: %q", b)
			case <-time.After(20 * time.Millisecond):
			}
		} else {
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			select {
			case b := <-got:
				require.Equal(t, string(body), string(b), "the body as the client sent it")
			case <-time.After(5 * time.Second):
				t.Fatal("the worker got nothing")
			}
		}
		require.Eventually(t, func() bool { return w.Occupancy() == 0 }, 2*time.Second, time.Millisecond)
	})
}

// FuzzAConnectionCarriesRequestAfterRequest: on one client connection, any
// sequence of requests, streamed or not, answered in any framing (stated
// length, chunked, read to the worker's close; JSON or an event stream),
// each gets its own answer whole and in order, and the connection stays
// open after every one (an answer read to its worker's close is chunked
// for the client). Occupancy returns to 0.
func FuzzAConnectionCarriesRequestAfterRequest(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7})
	f.Add([]byte{7, 7, 0, 0, 5, 2})
	addr := rawServer(f, func(c net.Conn, req *http.Request) bool {
		var op byte
		_, _ = fmt.Sscanf(req.URL.Path, "/v1/x/%d", &op)
		s := &answerScript{body: fmt.Appendf(nil, "answer %d %s", op, bytes.Repeat([]byte{'a' + op%26}, int(op)*37)),
			pieces: []byte{op}, frame: op % 3, sse: op&4 != 0}
		return s.write(c)
	})
	reg, _, url := serveOne(f, addr, Options{}, nil)
	front := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/v1/chat/completions")
	w, _ := reg.Get(1)
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 32 {
			ops = ops[:32]
		}
		c, err := net.Dial("tcp", front)
		require.NoError(t, err)
		defer c.Close()
		br := bufio.NewReader(c)
		for i, op := range ops {
			body := `{"model":"m"}`
			if op&8 != 0 {
				body = `{"model":"m","stream":true}`
			}
			_, err := fmt.Fprintf(c, "POST /v1/x/%d HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", op, len(body), body)
			require.NoError(t, err, "request %d", i)
			require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err, "answer %d", i)
			got, err := io.ReadAll(resp.Body)
			require.NoError(t, err, "answer %d", i)
			want := fmt.Sprintf("answer %d %s", op, bytes.Repeat([]byte{'a' + op%26}, int(op)*37))
			require.Equal(t, want, string(got), "answer %d", i)
			require.False(t, resp.Close, "answer %d keeps the connection", i)
		}
		require.Eventually(t, func() bool { return w.Occupancy() == 0 }, 2*time.Second, time.Millisecond)
	})
}

// FuzzAClientThatLeavesReleasesItsWorker: a client that closes its
// connection at any point (while sending its request, while its worker
// thinks, after some of its answer, which streams whether or not it asked)
// releases its reservation, and the worker has its connection closed (how
// an engine learns to stop) long before its answer would end. The next
// request is answered whole.
func FuzzAClientThatLeavesReleasesItsWorker(f *testing.F) {
	f.Add(byte(0), byte(3), false)
	f.Add(byte(1), byte(0), true)
	f.Add(byte(2), byte(5), true)
	f.Add(byte(3), byte(200), false)
	var open atomic.Int32 // worker connections open
	addr := rawServer(f, func(c net.Conn, req *http.Request) bool {
		if req.URL.Path == "/v1/x/whole" {
			_, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
			return err == nil
		}
		open.Add(1)
		defer open.Add(-1)
		var think, chunks int
		_, _ = fmt.Sscanf(req.URL.Path, "/v1/x/%d/%d", &think, &chunks)
		time.Sleep(time.Duration(think) * time.Millisecond)
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"); err != nil {
			return false
		}
		for range chunks { // until the router closes the connection
			if _, err := io.WriteString(c, "9\r\ndata: a\n\n\r\n"); err != nil {
				return false
			}
			time.Sleep(2 * time.Millisecond)
		}
		_, err := io.WriteString(c, "0\r\n\r\n")
		return err == nil
	})
	reg, _, url := serveOne(f, addr, Options{}, nil)
	front := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/v1/chat/completions")
	w, _ := reg.Get(1)
	f.Fuzz(func(t *testing.T, when, after byte, stream bool) {
		body := `{"model":"m"}`
		if stream {
			body = `{"model":"m","stream":true}`
		}
		// A worker that thinks 20 ms, then streams 400 chunks 2 ms apart.
		req := fmt.Sprintf("POST /v1/x/20/400 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		c, err := net.Dial("tcp", front)
		require.NoError(t, err)
		switch when % 4 {
		case 0: // part of the request
			_, err = io.WriteString(c, req[:int(after)%len(req)])
		case 1: // the request, then gone while the worker thinks
			_, err = io.WriteString(c, req)
			require.Eventually(t, func() bool { return open.Load() == 1 }, 2*time.Second, time.Millisecond, "the worker has it")
			time.Sleep(time.Duration(after%20) * time.Millisecond)
		default: // some of the answer, then gone
			_, err = io.WriteString(c, req)
			if err == nil {
				_, err = io.ReadFull(c, make([]byte, 64+int(after)*4))
			}
		}
		require.NoError(t, err)
		require.NoError(t, c.Close())
		require.Eventually(t, func() bool { return w.Occupancy() == 0 }, 2*time.Second, time.Millisecond, "released")
		require.Eventually(t, func() bool { return open.Load() == 0 }, 500*time.Millisecond, time.Millisecond,
			"the worker's connection closed (its answer would take 800 ms)")
		resp, err := http.Post(strings.TrimSuffix(url, "/chat/completions")+"/x/whole", "application/json", strings.NewReader(`{}`))
		require.NoError(t, err)
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, "{}", string(got))
		require.Eventually(t, func() bool { return w.Occupancy() == 0 }, 2*time.Second, time.Millisecond)
	})
}
