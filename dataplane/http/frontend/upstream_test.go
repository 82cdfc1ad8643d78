package frontend

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// keepAliveWorker answers every request after pause, and closes a
// connection that brings no new request within keepAlive of its last
// answer, as uvicorn does (its timeout_keep_alive): it sends its FIN but
// still reads for a second, and counts in late the connections on which a
// request came after its close (a request lost, in a real worker). Each
// request's connection, by its client port, goes to ports.
func keepAliveWorker(t *testing.T, pause, keepAlive time.Duration, late *atomic.Int32, ports chan<- string) string {
	return serveConns(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				_ = c.(*net.TCPConn).CloseWrite()
				_ = c.SetReadDeadline(time.Now().Add(time.Second))
				if _, err := br.ReadByte(); err == nil {
					late.Add(1)
				}
				return
			}
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			ports <- c.RemoteAddr().String()
			time.Sleep(pause)
			if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"); err != nil {
				return
			}
			_ = c.SetReadDeadline(time.Now().Add(keepAlive))
		}
	})
}

// burst sends n requests at once and waits for their answers.
func burst(t *testing.T, url string, n int) {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { postChat(t, url) })
	}
	wg.Wait()
}

func postChat(t *testing.T, url string) {
	resp, err := http.Post(url, "application/json", strings.NewReader(`{"model":"m","messages":[]}`))
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

// lendsAll lends the pooled connections their worker closed too, as the
// pool would lend one whose worker closed it just after the pool looked;
// it pools them unwatched, so that the watch does not close them first (as
// it does not close one already lent).
type lendsAll struct {
	connPool
	hc *fasthttp.HostClient
}

func (p lendsAll) release(h any, reuse bool) {
	if !reuse {
		p.connPool.release(h, false)
		return
	}
	releaseAs(p.hc.ReleaseConn, h)
}

// releaseAs gives h back with release, whose type of connection record
// (fasthttp's, unexported) it infers.
func releaseAs[C any](release func(C), h any) { release(h.(C)) }

func (p lendsAll) acquire() (any, *trackedConn, error) {
	cc, err := p.hc.AcquireConn(0, false)
	if err != nil {
		return nil, nil, err
	}
	return cc, cc.Conn().(*trackedConn), nil
}

// No request goes to a connection its worker closed while it idled (its
// keep-alive timeout ran out), to be lost and sent again. The pool does
// not lend one. A request lent one all the same (its worker closed it just
// after the pool looked: lendsAll) is not sent on it either: the wait for
// its answer, which does not read before it waits, would have missed the
// close and waited out the first-byte timeout for an answer that never
// comes (a worker that closes and still reads, as a lingering close does,
// sends no reset to wake it). Each request after the pause goes on a new
// connection at once, and gets its answer.
func TestNoRequestGoesToAConnectionItsWorkerClosed(t *testing.T) {
	for _, lent := range []bool{false, true} {
		t.Run(fmt.Sprintf("lent %v", lent), func(t *testing.T) {
			var late atomic.Int32
			ports := make(chan string, 100)
			addr := keepAliveWorker(t, 20*time.Millisecond, 50*time.Millisecond, &late, ports)
			reg, s, url := serveOne(t, addr, Options{}, nil)
			w, _ := reg.Get(1)
			if lent {
				u := s.upstreamOf(w)
				u.conns = lendsAll{u.conns, u.hc}
			}
			burst(t, url, 4)
			opened := map[string]bool{}
			for range 4 {
				opened[<-ports] = true
			}
			time.Sleep(200 * time.Millisecond) // the worker closes every connection
			for range 4 {
				start := time.Now()
				postChat(t, url)
				assert.Less(t, time.Since(start), time.Second, "the first-byte timeout is 5 s")
			}
			time.Sleep(100 * time.Millisecond) // a request sent on a closed connection would arrive by now
			assert.Zero(t, late.Load(), "requests sent on connections the worker had closed")
			assert.Zero(t, w.Occupancy())
			st := s.statsOf(w)
			assert.EqualValues(t, len(opened)+1, st.connects.Value(), "the burst's, then one for the requests one at a time")
			if lent { // dropped when lent; the last one idles unwatched
				assert.EqualValues(t, len(opened), st.closedByWorker.Value(), "the burst's connections, dropped")
				assert.EqualValues(t, 1, st.open.Load())
				return
			}
			// Each closed by the watch as its worker closed it: the burst's,
			// then the last one.
			assert.Eventually(t, func() bool { return st.closedByWorker.Value() == uint64(len(opened)+1) }, 2*time.Second, 5*time.Millisecond)
			assert.Zero(t, st.open.Load())
		})
	}
}

// The worker's connection released last is lent first: after a burst
// opened several, requests one at a time all go on one of them, and the
// others idle until they are closed (by the worker, or after
// MaxIdleConnDuration), instead of each being kept alive by its turn.
func TestTheConnectionReleasedLastIsLentFirst(t *testing.T) {
	var late atomic.Int32
	ports := make(chan string, 100)
	addr := keepAliveWorker(t, 30*time.Millisecond, time.Minute, &late, ports)
	_, _, url := serveOne(t, addr, Options{}, nil)
	burst(t, url, 4)
	burst := map[string]bool{}
	for range 4 {
		burst[<-ports] = true
	}
	require.Len(t, burst, 4, "the burst opened four connections")
	seen := map[string]bool{}
	for range 8 {
		postChat(t, url)
		seen[<-ports] = true
	}
	assert.Len(t, seen, 1, "requests one at a time went on %v", seen)
}

// A pooled connection its worker closes while it idles is closed at once,
// as nginx's keepalive cache closes it: no socket of the router's waits in
// CLOSE_WAIT (read from /proc/net/tcp) until the next request or the pool's
// idle sweep finds it, and the metrics count it closed by its worker and
// no longer open. The next request goes on a new connection.
func TestAConnectionItsWorkerClosedWhileItIdledClosesAtOnce(t *testing.T) {
	var late atomic.Int32
	ports := make(chan string, 100)
	// A keep-alive long enough for the checks between the requests and
	// the worker's closes, under the race detector on a busy machine.
	addr := keepAliveWorker(t, 20*time.Millisecond, 300*time.Millisecond, &late, ports)
	reg, s, url := serveOne(t, addr, Options{}, nil)
	burst(t, url, 4)
	opened := map[string]bool{}
	for range 4 {
		opened[<-ports] = true
	}
	w, _ := reg.Get(1)
	st := s.statsOf(w)
	assert.EqualValues(t, len(opened), st.open.Load(), "the burst's connections, kept alive")
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return st.closedByWorker.Value() == uint64(len(opened)) }, 3*time.Second, 5*time.Millisecond,
		"each connection closed once its worker closed it")
	assert.Zero(t, st.open.Load())
	assert.Zero(t, closeWaits(t, port), "sockets to the worker left in CLOSE_WAIT")
	postChat(t, url)
	<-ports
	assert.EqualValues(t, len(opened), st.closedByWorker.Value(), "counted once")
	assert.EqualValues(t, len(opened)+1, st.connects.Value())
	assert.EqualValues(t, 1, st.open.Load())
	assert.Zero(t, late.Load(), "requests sent on connections the worker had closed")
	assert.Zero(t, w.Occupancy())
}

// closeWaits counts this machine's IPv4 sockets in CLOSE_WAIT (state 08)
// whose peer's port is port (hex in /proc/net/tcp).
func closeWaits(t *testing.T, port string) int {
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Skipf("no /proc/net/tcp: %v", err)
	}
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	peer := fmt.Sprintf(":%04X", p)
	n := 0
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 3 && strings.HasSuffix(f[2], peer) && f[3] == "08" {
			n++
		}
	}
	return n
}

// Requests and a worker that closes idle connections almost at once (2 ms)
// race: the pool lends, the watch closes what idles, each in turn on the
// same connections. Every request is answered, and once the requests stop
// every connection is closed (none open, none in CLOSE_WAIT) and no
// reservation is held.
func TestRequestsAndTheClosesOfIdleConnectionsRace(t *testing.T) {
	var late atomic.Int32
	ports := make(chan string, 1000)
	addr := keepAliveWorker(t, 0, 2*time.Millisecond, &late, ports)
	reg, s, url := serveOne(t, addr, Options{}, nil)
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			for i := range 40 {
				postChat(t, url)
				<-ports
				time.Sleep(time.Duration((g+i)%4) * time.Millisecond) // 0 to 3 ms: before or after the worker's close
			}
		})
	}
	wg.Wait()
	w, _ := reg.Get(1)
	st := s.statsOf(w)
	assert.Eventually(t, func() bool { return st.open.Load() == 0 }, 2*time.Second, 5*time.Millisecond, "connections left open: %d", st.open.Load())
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	assert.Zero(t, closeWaits(t, port), "sockets to the worker left in CLOSE_WAIT")
	assert.Zero(t, w.Occupancy())
	assert.LessOrEqual(t, st.closedByWorker.Value(), st.connects.Value())
	t.Logf("%d connections opened, %d closed by the worker before a request went on them, %d requests on connections it had closed",
		st.connects.Value(), st.closedByWorker.Value(), late.Load())
}

// movedResolver resolves every name to the address it holds now.
type movedResolver struct{ ip atomic.Value }

func (r *movedResolver) LookupIPAddr(context.Context, string) ([]net.IPAddr, error) {
	return []net.IPAddr{{IP: net.ParseIP(r.ip.Load().(string))}}, nil
}

// namedWorker listens at addr and answers each request with name, closing
// the connection after it: every request is a new connect. The test skips
// where it cannot listen there.
func namedWorker(t *testing.T, addr, name string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen on %s: %v", addr, err)
	}
	serveOn(t, ln, func(c net.Conn) {
		if req, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
			_, _ = io.Copy(io.Discard, req.Body)
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(name), name)
		}
	})
}

// A worker named by a host name is looked up again once its addresses are
// NameCacheTime old: when it moves to another address (its container
// restarted), new connections go there, not to its old address for
// fasthttp's minute.
func TestAWorkerNameIsLookedUpAgain(t *testing.T) {
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := probe.Addr().(*net.TCPAddr).Port
	probe.Close()
	namedWorker(t, fmt.Sprintf("127.0.0.1:%d", port), "old")
	namedWorker(t, fmt.Sprintf("127.0.0.2:%d", port), "new") // all of 127/8 is loopback on Linux
	var names movedResolver
	names.ip.Store("127.0.0.1")
	_, _, url := serveOne(t, fmt.Sprintf("engine.fastroute.test:%d", port), Options{NameCacheTime: time.Second}, nil,
		func(s *Server, ln net.Listener) net.Listener {
			s.names.Resolver = &names
			return ln
		})
	answer := func() string {
		resp, err := http.Post(url, "application/json", strings.NewReader(`{"model":"m","messages":[]}`))
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	assert.Equal(t, "old", answer())
	names.ip.Store("127.0.0.2") // the worker moved
	assert.Equal(t, "old", answer(), "its old address, for NameCacheTime")
	time.Sleep(1100 * time.Millisecond)
	assert.Equal(t, "new", answer(), "its new address, once looked up again")
}
