package floor

import (
	"net"
	"runtime"
	"syscall"

	"github.com/fastroute/fastroute/internal/rawsock"
)

// conn is one socket of the event loop: a client's, or one to a worker.
type conn struct {
	fd        int
	worker    int   // a worker connection's worker; -1: a client's
	peer      *conn // a client's worker connection while its request is out; a worker connection's client
	in        []byte
	out       []byte // what waits for room to be sent
	connected bool   // a worker connection's connect completed
	answer    body   // a worker connection's answer, once its head came (answering)
	answering bool
	closed    bool
}

// loop is the event loop of the epoll model.
type loop struct {
	epfd, lfd, wake int
	conns           []*conn // by descriptor
	idle            [][]*conn
	workers         []syscall.Sockaddr
	next            int
}

func startEpoll(ln *net.TCPListener, workers []string) (stop func(), err error) {
	l := &loop{idle: make([][]*conn, len(workers)), epfd: -1, lfd: -1, wake: -1}
	for _, w := range workers {
		a, err := net.ResolveTCPAddr("tcp", w)
		if err != nil {
			return nil, err
		}
		if ip4 := a.IP.To4(); ip4 != nil {
			sa := &syscall.SockaddrInet4{Port: a.Port}
			copy(sa.Addr[:], ip4)
			l.workers = append(l.workers, sa)
		} else {
			sa := &syscall.SockaddrInet6{Port: a.Port}
			copy(sa.Addr[:], a.IP.To16())
			l.workers = append(l.workers, sa)
		}
	}
	if err := l.open(ln); err != nil {
		l.closeAll()
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		l.run()
		l.closeAll()
	}()
	return func() {
		_ = rawsock.Wake(l.wake)
		<-done
		_ = ln.Close()
	}, nil
}

// open makes the epoll set with a non-blocking copy of ln's descriptor and
// the eventfd that stops the loop.
func (l *loop) open(ln *net.TCPListener) error {
	raw, err := ln.SyscallConn()
	if err != nil {
		return err
	}
	if cerr := raw.Control(func(fd uintptr) { l.lfd, err = syscall.Dup(int(fd)) }); cerr != nil {
		return cerr
	}
	if err != nil {
		return err
	}
	if err := syscall.SetNonblock(l.lfd, true); err != nil {
		return err
	}
	if l.epfd, l.wake, err = rawsock.EpollWithWake(syscall.EPOLLIN); err != nil {
		return err
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(l.lfd)}
	return syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_ADD, l.lfd, &ev)
}

func (l *loop) closeAll() {
	for _, c := range l.conns {
		if c != nil {
			_ = syscall.Close(c.fd)
		}
	}
	for _, fd := range []int{l.lfd, l.wake, l.epfd} {
		if fd >= 0 {
			_ = syscall.Close(fd)
		}
	}
}

func (l *loop) run() {
	events := make([]syscall.EpollEvent, 256)
	for {
		n, err := syscall.EpollWait(l.epfd, events, -1)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return
		}
		for _, ev := range events[:n] {
			switch fd := int(ev.Fd); fd {
			case -1: // the wake eventfd
				return
			case l.lfd:
				l.accept()
			default:
				l.ready(l.conns[fd], ev.Events)
			}
		}
	}
}

func (l *loop) accept() {
	for {
		fd, _, err := syscall.Accept4(l.lfd, syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC)
		if err != nil {
			return // EAGAIN: none left
		}
		_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
		if !l.add(&conn{fd: fd, worker: -1, connected: true}) {
			_ = syscall.Close(fd)
		}
	}
}

// add watches c for reads and room, edge-triggered.
func (l *loop) add(c *conn) bool {
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLOUT | syscall.EPOLLRDHUP | rawsock.EpollET, Fd: int32(c.fd)}
	if syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_ADD, c.fd, &ev) != nil {
		return false
	}
	for len(l.conns) <= c.fd {
		l.conns = append(l.conns, nil)
	}
	l.conns[c.fd] = c
	return true
}

func (l *loop) ready(c *conn, events uint32) {
	if c == nil {
		return
	}
	if events&syscall.EPOLLOUT != 0 {
		if !c.connected {
			if soErr, err := syscall.GetsockoptInt(c.fd, syscall.SOL_SOCKET, syscall.SO_ERROR); err != nil || soErr != 0 {
				l.drop(c)
				return
			}
			c.connected = true
		}
		l.send(c, nil)
	}
	if c.closed || events&(syscall.EPOLLIN|syscall.EPOLLRDHUP|syscall.EPOLLHUP|syscall.EPOLLERR) == 0 {
		return
	}
	if !l.fill(c) {
		l.drop(c)
		return
	}
	if c.worker < 0 {
		l.request(c)
	} else {
		l.relay(c)
	}
}

// fill reads what came: a read that does not fill the room it was given
// took all there was (nginx's rule). False: the peer closed, or the read
// failed.
func (l *loop) fill(c *conn) bool {
	for {
		if cap(c.in)-len(c.in) < 4<<10 {
			c.in = append(make([]byte, 0, 2*cap(c.in)+16<<10), c.in...)
		}
		room := c.in[len(c.in):cap(c.in)]
		n, errno := rawsock.Read(uintptr(c.fd), room)
		switch {
		case errno == syscall.EAGAIN:
			return true
		case errno == syscall.EINTR:
			continue
		case errno != 0 || n == 0:
			return false
		}
		c.in = c.in[:len(c.in)+n]
		if n < len(room) {
			return true
		}
	}
}

// request sends a client's whole request, if one came and none is out, to
// the next worker.
func (l *loop) request(c *conn) {
	if c.peer != nil {
		return
	}
	h, ok, err := parseHead(c.in)
	if err != nil || h.chunked {
		l.drop(c)
		return
	}
	if !ok || len(c.in) < h.size+h.length {
		return
	}
	u := l.workerConn()
	if u == nil {
		l.drop(c)
		return
	}
	u.peer, c.peer = c, u
	size := h.size + h.length
	l.send(u, c.in[:size])
	c.in = c.in[:copy(c.in, c.in[size:])]
}

// workerConn is an idle connection to the next worker, or a new one.
func (l *loop) workerConn() *conn {
	w := l.next % len(l.workers)
	l.next++
	if k := len(l.idle[w]); k > 0 {
		u := l.idle[w][k-1]
		l.idle[w] = l.idle[w][:k-1]
		return u
	}
	family := syscall.AF_INET
	if _, ok := l.workers[w].(*syscall.SockaddrInet6); ok {
		family = syscall.AF_INET6
	}
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
	if err := syscall.Connect(fd, l.workers[w]); err != nil && err != syscall.EINPROGRESS {
		_ = syscall.Close(fd)
		return nil
	}
	u := &conn{fd: fd, worker: w}
	if !l.add(u) {
		_ = syscall.Close(fd)
		return nil
	}
	return u
}

// relay passes what came of a worker's answer to its client, and once the
// answer ended makes the connection idle and sends the client's next
// request if it came.
func (l *loop) relay(u *conn) {
	c := u.peer
	if c == nil { // an idle connection: the worker sent what nobody asked for
		l.drop(u)
		return
	}
	start := 0
	if !u.answering {
		h, ok, err := parseHead(u.in)
		if err != nil {
			l.drop(u)
			return
		}
		if !ok {
			return
		}
		u.answer, u.answering, start = newBody(h), true, h.size
	}
	n, done, err := u.answer.scan(u.in[start:])
	if err != nil {
		l.drop(u)
		return
	}
	l.send(c, u.in[:start+n])
	u.in = u.in[:copy(u.in, u.in[start+n:])]
	if !done {
		return
	}
	u.answering, u.peer, c.peer = false, nil, nil
	l.idle[u.worker] = append(l.idle[u.worker], u)
	if !c.closed {
		l.request(c) // pipelined
	}
}

// send sends p after whatever waits for room, keeping the rest for the
// next EPOLLOUT.
func (l *loop) send(c *conn, p []byte) {
	if c.closed {
		return
	}
	if len(c.out) > 0 || !c.connected {
		c.out = append(c.out, p...)
		if !c.connected {
			return
		}
		p, c.out = c.out, c.out[:0]
	}
	for len(p) > 0 {
		n, errno := rawsock.Write(uintptr(c.fd), p)
		switch errno {
		case 0:
			p = p[n:]
		case syscall.EINTR:
		case syscall.EAGAIN:
			c.out = append(c.out, p...)
			return
		default:
			l.drop(c)
			return
		}
	}
}

// drop closes c, and its peer with it when a request is out between them.
func (l *loop) drop(c *conn) {
	if c.closed {
		return
	}
	c.closed = true
	l.conns[c.fd] = nil
	_ = syscall.Close(c.fd)
	if c.worker >= 0 {
		l.idle[c.worker] = removeConn(l.idle[c.worker], c)
	}
	if p := c.peer; p != nil {
		c.peer, p.peer = nil, nil
		l.drop(p)
	}
}

func removeConn(cs []*conn, c *conn) []*conn {
	for i, x := range cs {
		if x == c {
			return append(cs[:i], cs[i+1:]...)
		}
	}
	return cs
}
