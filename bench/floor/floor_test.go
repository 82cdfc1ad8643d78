package floor

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
)

// startWorkers starts two mock workers answering with tokens chunks.
func startWorkers(t *testing.T, tokens int) []string {
	t.Helper()
	var addrs []string
	for id := uint64(1); id <= 2; id++ {
		w, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: id, Tokens: tokens, TokenInterval: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Close() })
		addrs = append(addrs, w.Addr())
	}
	return addrs
}

func startFloor(t *testing.T, model string, workers []string) (addr string, stop func()) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	stop, err = Start(model, ln, workers)
	if err != nil {
		t.Fatal(err)
	}
	return ln.Addr().String(), stop
}

func chatRequest(body string) string {
	return fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: floor\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}

// exchange sends raw (one or more requests in one write) on c and reads
// n answers, each whole.
func exchange(t *testing.T, c net.Conn, br *bufio.Reader, raw string, n int) (workers, bodies []string) {
	t.Helper()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	for range n {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("answer %d, %v: %s", resp.StatusCode, err, b)
		}
		workers, bodies = append(workers, resp.Header.Get("X-Mock-Worker")), append(bodies, string(b))
	}
	return workers, bodies
}

func TestFloorsProxyRequestsStreamsAndPipelines(t *testing.T) {
	workers := startWorkers(t, 16)
	prompt := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 1500) // 67 KB: more than a read
	short := chatRequest(`{"model":"mock-model","messages":[{"role":"user","content":"hi"}]}`)
	long := chatRequest(`{"model":"mock-model","messages":[{"role":"user","content":"` + prompt + `"}]}`)
	stream := chatRequest(`{"model":"mock-model","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	for _, model := range Models {
		t.Run(model, func(t *testing.T) {
			addr, stop := startFloor(t, model, workers)
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			br := bufio.NewReader(c)
			var served []string
			for range 2 {
				w, b := exchange(t, c, br, short, 1)
				if !strings.Contains(b[0], `"completion_tokens":16`) {
					t.Fatalf("answer: %s", b[0])
				}
				served = append(served, w...)
			}
			if served[0] == served[1] {
				t.Fatalf("both requests went to worker %s: not round robin", served[0])
			}
			_, b := exchange(t, c, br, long, 1)
			if want := fmt.Sprintf(`"prompt_tokens":%d`, len(`{"model":"mock-model","messages":[{"role":"user","content":"`+prompt+`"}]}`)/4); !strings.Contains(b[0], want) {
				t.Fatalf("the long prompt's answer lacks %s: %.300s", want, b[0])
			}
			_, b = exchange(t, c, br, stream, 1)
			if !wholeStream(b[0]) {
				t.Fatalf("a stream: %q", b[0])
			}
			_, b = exchange(t, c, br, stream+short+stream, 3) // pipelined
			if !wholeStream(b[0]) || !strings.Contains(b[1], `"completion_tokens":16`) || !wholeStream(b[2]) {
				t.Fatalf("pipelined answers: %q", b)
			}
			stop()
			if _, err := br.ReadByte(); err == nil {
				t.Fatal("the client connection is open after stop")
			}
			if c2, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
				c2.Close()
				t.Fatal("the listener accepts after stop")
			}
		})
	}
}

// wholeStream says an answer holds the workers' 16 chunks and their end.
func wholeStream(b string) bool {
	return strings.Count(b, "data: ") == 17 && strings.Contains(b, `"content":"tok15 "`) && strings.HasSuffix(b, "data: [DONE]\n\n")
}

func TestStartRefusesAnUnknownModelAndNoWorkers(t *testing.T) {
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := Start("threads", ln, []string{"127.0.0.1:1"}); err == nil || !strings.Contains(err.Error(), `"threads"`) {
		t.Fatalf("unknown model: %v", err)
	}
	if _, err := Start("epoll", ln, nil); err == nil {
		t.Fatal("no workers: no error")
	}
}

// TestBodyFindsAChunkedEndAcrossEverySplit scans a chunked body cut in two
// at every byte: its end is found at the same byte, and nothing after it
// is taken.
func TestBodyFindsAChunkedEndAcrossEverySplit(t *testing.T) {
	stream := []byte("5\r\nhello\r\n1a;ext=1\r\nabcdefghijklmnopqrstuvwxyz\r\nA\r\n0123456789\r\n0\r\n\r\n")
	after := []byte("HTTP/1.1 200 OK\r\n")
	all := append(append([]byte{}, stream...), after...)
	for cut := range len(all) + 1 {
		b := newBody(head{chunked: true})
		n1, done, err := b.scan(all[:cut])
		if err != nil {
			t.Fatalf("cut %d: %v", cut, err)
		}
		total := n1
		if !done {
			n2, done2, err := b.scan(all[cut:])
			if err != nil || !done2 {
				t.Fatalf("cut %d: end not found (%v)", cut, err)
			}
			total += n2
		}
		if total != len(stream) {
			t.Fatalf("cut %d: the body ended after %d bytes, not %d", cut, total, len(stream))
		}
	}
	for _, bad := range []string{"g\r\n", "5\n", "0\r\nX: y\r\n\r\n"} {
		b := newBody(head{chunked: true})
		if _, _, err := b.scan([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	b := newBody(head{length: 3})
	if n, done, _ := b.scan([]byte("abcdef")); n != 3 || !done {
		t.Fatalf("a length of 3 took %d bytes (ended: %v)", n, done)
	}
}

func TestParseHeadReadsTheFraming(t *testing.T) {
	for _, c := range []struct {
		in   string
		want head
		ok   bool
		err  bool
	}{
		{"HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\nbody", head{size: 39, length: 12}, true, false},
		{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", head{size: 47, chunked: true}, true, false},
		{"HTTP/1.1 200 OK\r\nContent-Length: 1", head{}, false, false},
		{"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", head{}, false, true},
		{"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", head{}, false, true},
	} {
		h, ok, err := parseHead([]byte(c.in))
		if h != c.want || ok != c.ok || (err != nil) != c.err {
			t.Errorf("%q: %+v %v %v", c.in, h, ok, err)
		}
	}
}
