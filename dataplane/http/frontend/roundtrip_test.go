package frontend

import (
	"bytes"
	"context"
	"net"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/aliases"
	"github.com/fastroute/fastroute/dataplane/apikeys"
	"github.com/fastroute/fastroute/dataplane/mirrors"
	"github.com/fastroute/fastroute/dataplane/tracing"
	"github.com/fastroute/fastroute/internal/bearer"
	"github.com/stretchr/testify/require"
)

// The request of the round trips below (bench/wrk-chat.lua's) and the
// worker's answer to it, with uvicorn's headers (as vLLM and SGLang answer:
// lowercase names, a date that the router's replaces).
const (
	roundTripRequest = "POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nContent-Length: 66\r\n\r\n" +
		`{"model":"mock-model","messages":[{"role":"user","content":"hi"}]}`
	roundTripAnswer = "HTTP/1.1 200 OK\r\ndate: Fri, 04 Dec 2026 14:00:00 GMT\r\nserver: uvicorn\r\ncontent-length: 27\r\ncontent-type: application/json\r\n\r\n" +
		`{"choices":[{"text":"hi"}]}`
)

// readMessage reads one HTTP/1.1 message with a Content-Length (or none:
// no body) from c into buf and returns its length; 0 when c failed first.
// It allocates nothing.
func readMessage(c net.Conn, buf []byte) int {
	n := 0
	for {
		if end := bytes.Index(buf[:n], []byte("\r\n\r\n")); end >= 0 {
			want := end + 4 + contentLength(buf[:end])
			for n < want {
				m, err := c.Read(buf[n:])
				if err != nil {
					return 0
				}
				n += m
			}
			return want
		}
		m, err := c.Read(buf[n:])
		if err != nil {
			return 0
		}
		n += m
	}
}

// contentLength is the Content-Length of a message head (0: none).
func contentLength(head []byte) int {
	for _, name := range [][]byte{[]byte("\r\nContent-Length: "), []byte("\r\ncontent-length: ")} {
		if i := bytes.Index(head, name); i >= 0 {
			v := head[i+len(name):]
			if j := bytes.IndexByte(v, '\r'); j >= 0 {
				v = v[:j]
			}
			n, _ := strconv.Atoi(string(v))
			return n
		}
	}
	return 0
}

// roundTripper is a client connection to a front end over one raw worker,
// both of which allocate nothing per request: what a round trip
// allocates is the front end's.
type roundTripper struct {
	c   net.Conn
	buf []byte
	reg *dataplane.Registry
	s   *Server
}

func newRoundTripper(t testing.TB, opts Options) *roundTripper {
	worker := serveConns(t, func(c net.Conn) {
		buf, answer := make([]byte, 4096), []byte(roundTripAnswer)
		for readMessage(c, buf) > 0 {
			if _, err := c.Write(answer); err != nil {
				return
			}
		}
	})
	reg, s, front := serveOne(t, worker, opts, nil)
	c, err := net.Dial("tcp", front[len("http://"):len(front)-len("/v1/chat/completions")])
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return &roundTripper{c: c, buf: make([]byte, 4096), reg: reg, s: s}
}

// do sends the request and reads the front end's answer to it.
func (r *roundTripper) do(tb testing.TB, request []byte) {
	if _, err := r.c.Write(request); err != nil {
		tb.Fatal(err)
	}
	n := readMessage(r.c, r.buf)
	if n == 0 || !bytes.HasPrefix(r.buf, []byte("HTTP/1.1 200 ")) || !bytes.HasSuffix(r.buf[:n], []byte(`"hi"}]}`)) {
		tb.Fatalf("answer %q", r.buf[:n])
	}
}

// A proxied request allocates one byte in steady state, from its request's
// first byte to its answer's last, connection pools and parsers warm:
// counted over real sockets, with a client and a worker that allocate
// nothing themselves. The byte is fasthttp's: with ReduceMemoryUsage a
// connection's wait for its next request reads the first byte into an
// array of its own, which escapes (acquireByteReader, fasthttp v1.79.0).
// The tiny allocator puts sixteen of those in one block. The books are
// closed after each (occupancy 0).
func TestAProxiedRequestAllocatesOnlyFasthttpsFirstByte(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector drops pooled entries at random")
	}
	var keys apikeys.Keys
	keys.Set([]apikeys.Entry{{Name: "team-a", Key: "sk-team-a-0123456789", MaxInflight: 4}})
	withKey := strings.Replace(roundTripRequest, "Host: router\r\n", "Host: router\r\nAuthorization: Bearer sk-team-a-0123456789\r\n", 1)
	alias, err := aliases.New([]aliases.Alias{{Name: "mock-model", Targets: []aliases.Target{
		{Model: "mock-model-v1", Weight: 1}, {Model: "mock-model-v2", Weight: 1}}}})
	require.NoError(t, err)
	mirror, err := mirrors.New([]mirrors.Mirror{{Model: "other-model", To: "other-model-next", Percent: 100}})
	require.NoError(t, err)
	// A tracer whose export never starts: its queue (8192) takes every
	// span of a case's 2,200 requests.
	tracer := func() *tracing.Tracer {
		tr, err := tracing.New(tracing.Config{OTLPEndpoint: "http://127.0.0.1:1", SampleRatio: 1, ServiceName: "t"}, tracing.Options{})
		require.NoError(t, err)
		return tr
	}
	traced := strings.Replace(roundTripRequest, "Host: router\r\n",
		"Host: router\r\ntraceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\n", 1)
	tracers := []*tracing.Tracer{tracer(), tracer()}
	forwarded := strings.Replace(roundTripRequest, "Host: router\r\n", "Host: router\r\nX-Forwarded-For: 203.0.113.7\r\n", 1)
	for _, tc := range []struct {
		name    string
		opts    Options
		request string
		aliases *aliases.Table
		mirrors *mirrors.Table
	}{
		{"plain", Options{}, roundTripRequest, nil, nil},
		// The key is checked and taken off, the workers' put on, a slot
		// of the client's taken and given back: nothing more allocated.
		{"with API keys", Options{APIKeys: &keys, WorkerAPIKey: bearer.New("sk-engine-0123456789")}, withKey, nil, nil},
		// The model is an alias: a target drawn, the body rewritten into
		// the exchange's buffer.
		{"with a model alias", Options{}, roundTripRequest, alias, nil},
		// Another model is mirrored: the request's model looked up.
		{"with a mirror of another model", Options{}, roundTripRequest, nil, mirror},
		// Traced: a span begun in the client's trace, the traceparent
		// sent on rewritten, the span queued at the end.
		{"traced in the client's trace", Options{Tracer: tracers[0]}, traced, nil, nil},
		// Traced in a trace of its own (sample ratio 1).
		{"traced in a new trace", Options{Tracer: tracers[1]}, roundTripRequest, nil, nil},
		// The peer appended to the client's X-Forwarded-For.
		{"adding X-Forwarded-For", Options{Policy: Policy{AddXForwardedFor: true}}, forwarded, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := newRoundTripper(t, tc.opts)
			rt.s.SetAliases(tc.aliases)
			rt.s.SetMirrors(tc.mirrors)
			request := []byte(tc.request)
			for range 200 {
				rt.do(t, request)
			}
			const n = 2000
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for range n {
				rt.do(t, request)
			}
			runtime.ReadMemStats(&after)
			// Timers and tickers of the process may allocate now and then; one
			// more allocation per request would show n more.
			require.Less(t, after.Mallocs-before.Mallocs, uint64(n+n/20), "allocations in %d round trips", n)
			w, _ := rt.reg.Get(1)
			require.Eventually(t, func() bool { return w.Occupancy() == 0 }, time.Second, time.Millisecond)
		})
	}
	require.Equal(t, int64(0), keys.Clients()[0].Inflight())
	require.Equal(t, uint64(2200), keys.Clients()[0].Admitted())
	for _, tr := range tracers { // each request's span was queued: its export to no collector fails them all
		tr.Close(context.Background())
		exported, dropped, failed := tr.Counts()
		require.Equal(t, [3]uint64{0, 0, 2200}, [3]uint64{exported, dropped, failed})
	}
}

// BenchmarkProxiedRequest is one round trip of a non-streaming request
// through the front end over loopback, one at a time, client and worker in
// the process: its time and its CPU per op (cpu-ns/op, the process's user
// and system time) include theirs, so it compares front ends built from two
// versions, not front ends and nginx (make bench-e2e).
func BenchmarkProxiedRequest(b *testing.B) {
	rt := newRoundTripper(b, Options{})
	request := []byte(roundTripRequest)
	b.ReportAllocs()
	cpu0 := processCPU(b)
	for b.Loop() {
		rt.do(b, request)
	}
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
}

// processCPU is the process's user and system time so far.
func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
