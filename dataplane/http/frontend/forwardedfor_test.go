package frontend

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// forwardedThrough sends a chat request with the given header lines on a
// new connection to the router at url, after opening (a PROXY protocol
// header, say), and returns the answer's status.
func forwardedThrough(t *testing.T, url, opening string, lines ...string) int {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/v1/chat/completions"))
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(5*time.Second)))
	body := `{"model":"m","messages":[]}`
	head := opening + "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\n"
	for _, l := range lines {
		head += l + "\r\n"
	}
	_, err = fmt.Fprintf(c, "%sContent-Length: %d\r\n\r\n%s", head, len(body), body)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// With AddXForwardedFor, a request reaches its worker with one
// X-Forwarded-For line: the client's own lines in their order (empty ones
// left out), then the router's peer, the address a PROXY protocol header
// named where one did. A request moved to another worker after a failed
// attempt carries the peer once, not once per attempt. A client that names
// the header in Connection has it dropped as hop-by-hop. Without the
// option the client's header passes as it came, and none is added.
func TestXForwardedForEndsWithThePeer(t *testing.T) {
	var failed atomic.Int32
	seen := make(chan []string, 16)
	broken := rawServer(t, func(_ net.Conn, req *http.Request) bool {
		failed.Add(1)
		seen <- req.Header.Values("X-Forwarded-For")
		return false // closed before an answer: the request moves on
	})
	answering := rawServer(t, func(c net.Conn, req *http.Request) bool {
		seen <- req.Header.Values("X-Forwarded-For")
		_, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
		return err == nil
	})
	reg, _, url := serveOne(t, broken, Options{Policy: Policy{AddXForwardedFor: true}, Retries: 1}, nil)
	_, err := reg.Add(dataplane.WorkerSpec{ID: 2, URL: "http://" + answering})
	require.NoError(t, err)
	// sent returns the lines each attempt's worker got, the last one the
	// worker that answered.
	sent := func(opening string, lines ...string) [][]string {
		t.Helper()
		require.Equal(t, http.StatusOK, forwardedThrough(t, url, opening, lines...))
		var got [][]string
		for {
			select {
			case v := <-seen:
				got = append(got, v)
			default:
				return got
			}
		}
	}
	for range 2 { // round robin sends about half the requests to the broken worker first
		for _, tc := range []struct {
			lines []string
			want  string
		}{
			{nil, "127.0.0.1"},
			{[]string{"X-Forwarded-For: 203.0.113.7"}, "203.0.113.7, 127.0.0.1"},
			{[]string{"x-forwarded-for: 198.51.100.1", "X-Forwarded-For:  203.0.113.7, 10.0.0.1 ", "X-Forwarded-For:"},
				"198.51.100.1, 203.0.113.7, 10.0.0.1, 127.0.0.1"},
		} {
			for _, got := range sent("", tc.lines...) {
				assert.Equal(t, []string{tc.want}, got, "sent %q", tc.lines)
			}
		}
	}
	for _, got := range sent("", "Connection: X-Forwarded-For", "X-Forwarded-For: 203.0.113.7") {
		assert.Empty(t, got, "a header the client named hop-by-hop is dropped, the router's line with it")
	}
	assert.NotZero(t, failed.Load(), "some requests were moved after a failed attempt")
	for _, id := range []uint64{1, 2} {
		w, _ := reg.Get(id)
		require.Eventually(t, func() bool { return w.Occupancy() == 0 }, 2*time.Second, 10*time.Millisecond)
	}

	_, _, behind := serveOne(t, answering, Options{Policy: Policy{AddXForwardedFor: true},
		ProxyProtocol: &ProxyProtocol{From: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}}, nil)
	require.Equal(t, http.StatusOK, forwardedThrough(t, behind, "PROXY TCP4 192.0.2.9 10.0.0.1 5555 8000\r\n", "X-Forwarded-For: 203.0.113.7"))
	assert.Equal(t, []string{"203.0.113.7, 192.0.2.9"}, <-seen, "the balancer's client is the peer")

	_, _, off := serveOne(t, answering, Options{}, nil)
	require.Equal(t, http.StatusOK, forwardedThrough(t, off, "", "X-Forwarded-For: 203.0.113.7"))
	assert.Equal(t, []string{"203.0.113.7"}, <-seen, "without the option the client's header passes as it came")
	require.Equal(t, http.StatusOK, forwardedThrough(t, off, ""))
	assert.Empty(t, <-seen, "and none is added")
}

// Appending the peer allocates nothing once the exchange's scratch and the
// header's buffers have grown: the request path stays free of allocations
// with AddXForwardedFor on.
func TestXForwardedForAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	var h fasthttp.RequestHeader
	peer := &net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.9"), Port: 5555}
	var buf []byte
	add := func() {
		h.Del(headerForwardedFor)
		h.Add(headerForwardedFor, "203.0.113.7")
		h.Add(headerForwardedFor, "10.0.0.1")
		buf = addForwardedFor(&h, peer, buf)
	}
	add()
	assert.Zero(t, testing.AllocsPerRun(100, add))
	assert.Equal(t, "203.0.113.7, 10.0.0.1, 192.0.2.9", string(h.Peek(headerForwardedFor)), "an IPv4-mapped peer is named as IPv4")
	var unix fasthttp.RequestHeader
	addForwardedFor(&unix, &net.UnixAddr{Net: "unix"}, nil)
	assert.Equal(t, "unknown", string(unix.Peek(headerForwardedFor)), "a peer without an IP address")
}
