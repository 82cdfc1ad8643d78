package frontend

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
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
// pool would lend one whose worker closed it just after the pool looked.
type lendsAll struct {
	connPool
	hc *fasthttp.HostClient
}

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
			burst(t, url, 4)
			opened := map[string]bool{}
			for range 4 {
				opened[<-ports] = true
			}
			w, _ := reg.Get(1)
			if lent {
				u := s.upstreamOf(w)
				u.conns = lendsAll{u.conns, u.hc}
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
			assert.EqualValues(t, len(opened), st.closedByWorker.Value(), "the burst's connections, dropped")
			assert.EqualValues(t, len(opened)+1, st.connects.Value(), "the burst's, then one for the requests one at a time")
			assert.Equal(t, 1, st.open())
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
