package frontend

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"syscall"

	"github.com/pires/go-proxyproto"
)

// ProxyProtocol has the front end read the PROXY protocol header
// (HAProxy's, version 1 or 2) that a load balancer in front of it, such as
// an AWS Network Load Balancer or HAProxy in TCP mode, opens each
// connection with, and take the client address it names for the
// connection's: the access log then shows the client behind the balancer,
// not the balancer.
type ProxyProtocol struct {
	// From are the addresses whose connections carry a header: each must
	// begin with one, or it is closed unserved. A connection from
	// elsewhere is served as it is, under its own address, and a header
	// it sends is a malformed request: no client that reaches the router
	// past the balancer names an address of its choosing. None: every
	// connection carries one.
	From []netip.Prefix
}

// expects says whether a connection from addr must begin with a header.
func (p *ProxyProtocol) expects(addr net.Addr) bool {
	if len(p.From) == 0 {
		return true
	}
	peer, ok := peerOf(addr)
	return ok && within(p.From, peer.Addr())
}

// within says whether a is in one of prefixes.
func within(prefixes []netip.Prefix, a netip.Addr) bool {
	for _, p := range prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// proxyV1Max is the longest version 1 header, its CRLF included; a
// version 2 header is 16 bytes and the length its last two give, refused
// beyond a lent buffer (4 KiB: its addresses and a balancer's TLVs take
// a few hundred bytes at most).
const proxyV1Max = 107

var (
	errNoProxyHeader   = errors.New("the connection did not begin with a PROXY protocol header")
	errProxyHeaderSize = errors.New("PROXY protocol header too long")
	errProxyHeaderPart = errors.New("the PROXY protocol header is not whole yet")
)

// proxyHeaderSize returns the length of the PROXY protocol header that b
// begins with: errProxyHeaderPart while b may be the start of one,
// errNoProxyHeader once it cannot be.
func proxyHeaderSize(b []byte) (int, error) {
	switch {
	case startsWith(b, proxyproto.SIGV1):
		if i := bytes.Index(b[:min(len(b), proxyV1Max)], []byte("\r\n")); i >= 0 {
			return i + 2, nil
		}
		if len(b) >= proxyV1Max {
			return 0, errProxyHeaderSize
		}
	case startsWith(b, proxyproto.SIGV2):
		if len(b) >= 16 {
			return 16 + int(binary.BigEndian.Uint16(b[14:16])), nil
		}
	default:
		return 0, errNoProxyHeader
	}
	return 0, errProxyHeaderPart
}

// startsWith says whether b begins with sig, or is the start of sig.
func startsWith(b, sig []byte) bool {
	n := min(len(b), len(sig))
	return bytes.Equal(b[:n], sig[:n])
}

// readProxyHeader waits, under the socket's read deadline, for the PROXY
// protocol header its connection begins with, reads exactly that (the
// request after it stays unread, for the read that waits for it) and
// returns the client address it names: nil for a balancer's own
// connection (a version 2 LOCAL, its health check) or a version 1
// UNKNOWN, which keep the connection's address.
func readProxyHeader(sock syscall.RawConn) (net.Addr, error) {
	bp, size, err := peekProxyHeader(sock)
	if err != nil {
		return nil, err
	}
	defer lentBufs.Put(bp)
	buf := (*bp)[:size]
	var n int
	var errno syscall.Errno
	if err := sock.Read(func(fd uintptr) bool {
		n, errno = recvSome(fd, buf) // peeked: they are there
		return true
	}); err != nil {
		return nil, err
	}
	if errno != 0 || n != size {
		return nil, fmt.Errorf("reading the PROXY protocol header: %d of %d bytes (%v)", n, size, errno)
	}
	return clientOf(buf)
}

// clientOf parses a whole PROXY protocol header and returns the client
// address it names, nil for none (LOCAL, UNKNOWN).
func clientOf(header []byte) (net.Addr, error) {
	h, err := proxyproto.Read(bufio.NewReaderSize(bytes.NewReader(header), len(header)))
	if err != nil {
		return nil, fmt.Errorf("malformed PROXY protocol header: %w", err)
	}
	if src, ok := h.SourceAddr.(*net.TCPAddr); ok && src != nil && h.Command.IsProxy() {
		return src, nil
	}
	return nil, nil
}

// peekProxyHeader waits until the socket holds a whole PROXY protocol
// header and returns its length, and a lent buffer it was peeked into. A
// connection holds none while it waits.
func peekProxyHeader(sock syscall.RawConn) (bp *[]byte, size int, err error) {
	var herr error
	var errno syscall.Errno
	if err := sock.Read(func(fd uintptr) bool {
		bp = lentBufs.Get().(*[]byte)
		buf := *bp
		var n int
		n, errno = peekSome(fd, buf)
		switch {
		case errno == syscall.EAGAIN:
		case errno != 0:
			return true
		case n == 0:
			herr = io.ErrUnexpectedEOF
			return true
		default:
			size, herr = proxyHeaderSize(buf[:n])
			switch {
			case herr == nil && size > len(buf), herr == errProxyHeaderPart && n == len(buf):
				herr = errProxyHeaderSize
				return true
			case herr == nil && size <= n, herr == errNoProxyHeader:
				return true
			}
		}
		lentBufs.Put(bp) // the rest is to come: a wake-up says it came
		bp = nil
		return false
	}); err != nil {
		herr = err
	} else if errno != 0 {
		herr = fmt.Errorf("reading the PROXY protocol header: %w", errno)
	} else if herr == io.ErrUnexpectedEOF {
		herr = fmt.Errorf("the connection closed before its PROXY protocol header: %w", herr)
	}
	if herr != nil {
		if bp != nil {
			lentBufs.Put(bp)
		}
		return nil, 0, herr
	}
	return bp, size, nil
}

// peekSome reads what the socket fd holds into p, up to its length,
// leaving it there (MSG_PEEK), again when a signal cut the call short.
func peekSome(fd uintptr, p []byte) (int, syscall.Errno) {
	for {
		n, _, err := syscall.Recvfrom(int(fd), p, syscall.MSG_PEEK)
		if err == nil {
			return n, 0
		}
		errno, ok := err.(syscall.Errno)
		if !ok {
			return 0, syscall.EIO
		}
		if errno != syscall.EINTR {
			return 0, errno
		}
	}
}
