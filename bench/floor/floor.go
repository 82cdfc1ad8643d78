// Package floor holds the two reference proxies of `fastroute bench-e2e`:
// the least a reverse proxy written in Go does per request, in each of the
// ways a Go program can serve connections. Both read a request's head
// and body, pass them whole to a kept-alive worker connection (round
// robin), and pass the worker's answer back, a stream's chunks as they
// come; they parse no field but the framing, route nothing, count nothing
// and retry nothing. Their CPU per request beside fastroute's and nginx's
// says how much of fastroute's cost is its own code and how much the model
// it serves connections in (issue 18).
//
//   - Goroutines: a goroutine per client connection over Go's net package
//     and its poller, the model of net/http, fasthttp and fastroute.
//   - Epoll: one goroutine on one thread running an edge-triggered epoll
//     loop over non-blocking sockets with raw system calls, nginx's model
//     (Linux only).
//   - Coroutines: the goroutine model's own code, each client connection's
//     run as a coroutine of one epoll loop (package coloop), its reads and
//     writes waiting through the loop instead of Go's poller (Linux only).
//     Beside the goroutine model, it measures what the way Go waits costs
//     the same code.
//
// They are benchmark references, not proxies to run: no timeouts, no
// limits, no header checks, and a worker that fails ends the request's
// client connection.
package floor

import (
	"bytes"
	"errors"
	"net"
	"strconv"
	"strings"
)

// Models are the names Start takes.
var Models = []string{"goroutines", "epoll", "coroutines"}

// Start serves ln with the proxy of model (one of Models),
// spreading requests round-robin over workers (host:port). stop ends it
// and closes ln.
func Start(model string, ln *net.TCPListener, workers []string) (stop func(), err error) {
	if len(workers) == 0 {
		return nil, errors.New("floor: no workers")
	}
	switch model {
	case "goroutines":
		return startGoroutines(ln, workers), nil
	case "epoll":
		return startEpoll(ln, workers)
	case "coroutines":
		return startCoroutines(ln, workers)
	}
	return nil, errors.New("floor: unknown model " + strconv.Quote(model) + " (" + strings.Join(Models, " or ") + ")")
}

// errFraming is a message whose framing the floor does not read.
var errFraming = errors.New("floor: unsupported message framing")

// head is what the floor reads of a message head: its length and its
// body's framing.
type head struct {
	size    int // the head's bytes, its blank line included
	length  int // Content-Length (0 when absent)
	chunked bool
}

// parseHead reads the head at the front of b; ok is false while the head
// is not whole yet.
func parseHead(b []byte) (h head, ok bool, err error) {
	end := bytes.Index(b, []byte("\r\n\r\n"))
	if end < 0 {
		return head{}, false, nil
	}
	h.size = end + 4
	lines := b[:end+2]
	for len(lines) > 0 {
		i := bytes.IndexByte(lines, '\n')
		line := lines[:i-1] // without its CRLF
		lines = lines[i+1:]
		name, value, found := bytes.Cut(line, []byte(":"))
		switch {
		case !found:
		case bytes.EqualFold(name, []byte("Content-Length")):
			if h.length, err = strconv.Atoi(string(bytes.TrimSpace(value))); err != nil || h.length < 0 {
				return head{}, false, errFraming
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			if !bytes.EqualFold(bytes.TrimSpace(value), []byte("chunked")) {
				return head{}, false, errFraming
			}
			h.chunked = true
		}
	}
	return h, true, nil
}

// body finds where a message's body ends as its bytes come.
type body struct {
	chunked bool
	left    int // bytes still to come: of the length, or of the chunk's data and its CRLF
	state   chunkState
	size    int // the chunk size read so far
}

type chunkState uint8

const (
	sizeLine  chunkState = iota // the chunk size's hex digits
	extension                   // a chunk extension, up to the CR
	sizeLF                      // the LF that ends the size line
	data                        // the chunk's data and CRLF (left)
	lastCR                      // the CR of the blank line after the last chunk
	lastLF                      // its LF
)

// newBody tracks the body h frames.
func newBody(h head) body {
	return body{chunked: h.chunked, left: h.length}
}

// scan takes the body's next bytes from p: n of them belong to it, done
// says it ended with them.
func (b *body) scan(p []byte) (n int, done bool, err error) {
	if !b.chunked {
		n = min(b.left, len(p))
		b.left -= n
		return n, b.left == 0, nil
	}
	for n < len(p) {
		c := p[n]
		switch b.state {
		case data:
			k := min(b.left, len(p)-n)
			b.left -= k
			n += k
			if b.left == 0 {
				b.state = sizeLine
			}
			continue
		case sizeLine:
			switch v := hexValue(c); {
			case v >= 0:
				b.size = b.size<<4 | v
			case c == ';':
				b.state = extension
			case c == '\r':
				b.state = sizeLF
			default:
				return n, false, errFraming
			}
		case extension:
			if c == '\r' {
				b.state = sizeLF
			}
		case sizeLF:
			if c != '\n' {
				return n, false, errFraming
			}
			if b.size == 0 {
				b.state = lastCR // no trailer fields: the floor's workers send none
			} else {
				b.state, b.left, b.size = data, b.size+2, 0
			}
		case lastCR:
			if c != '\r' {
				return n, false, errFraming
			}
			b.state = lastLF
		case lastLF:
			if c != '\n' {
				return n, false, errFraming
			}
			return n + 1, true, nil
		}
		n++
	}
	return n, false, nil
}

func hexValue(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}
