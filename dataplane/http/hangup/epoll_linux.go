package hangup

import (
	"errors"
	"sync/atomic"
	"syscall"

	"github.com/fastroute/fastroute/internal/rawsock"
)

// maxSlots bounds the table of watched descriptors; a descriptor beyond it,
// or beyond the process's open-file limit, is not watched.
const maxSlots = 1 << 20

// Watcher watches connections for the peer's close and calls its callback
// with the work the connection is doing at that moment, if any.
type Watcher[T any] struct {
	epfd     int
	wake     int // eventfd that ends the wait loop
	slots    []slot[T]
	gens     atomic.Uint32
	onHangup func(t *T, gen uint32)
	closed   atomic.Bool
	done     chan struct{}
}

// slot is the state of the connection watched under one descriptor.
type slot[T any] struct {
	state atomic.Uint64     // gen<<1 of the connection, | 1 once its peer closed; 0: none
	cur   atomic.Pointer[T] // the work in progress (Begin to End)
}

// New starts a Watcher. onHangup runs on the Watcher's goroutine with the
// work in progress on a connection whose peer closed, and the connection's
// generation; it must be quick and must check the work is still the
// connection's (it may have ended meanwhile).
func New[T any](onHangup func(t *T, gen uint32)) (*Watcher[T], error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return nil, err
	}
	n := min(lim.Cur, maxSlots)
	epfd, wake, err := rawsock.EpollWithWake(syscall.EPOLLIN)
	if err != nil {
		return nil, err
	}
	w := &Watcher[T]{epfd: epfd, wake: wake, slots: make([]slot[T], n), onHangup: onHangup, done: make(chan struct{})}
	go w.loop()
	return w, nil
}

// Add watches the connection with descriptor fd, from its start to its
// close, for the peer's close (one epoll_ctl call). ok is false for a
// descriptor it cannot watch.
func (w *Watcher[T]) Add(fd int) (c Conn, ok bool) {
	if fd < 0 || fd >= len(w.slots) || w.closed.Load() {
		return Conn{}, false
	}
	gen := w.gens.Add(1)
	if gen == 0 {
		gen = w.gens.Add(1)
	}
	s := &w.slots[fd]
	s.cur.Store(nil)
	s.state.Store(uint64(gen) << 1)
	// One shot: a closed peer stays closed, reported once is enough.
	ev := syscall.EpollEvent{Events: syscall.EPOLLRDHUP | syscall.EPOLLONESHOT, Fd: int32(fd), Pad: int32(gen)}
	err := syscall.EpollCtl(w.epfd, syscall.EPOLL_CTL_ADD, fd, &ev)
	if err == syscall.EEXIST { // the socket is in the set still (its close came late): renew it
		err = syscall.EpollCtl(w.epfd, syscall.EPOLL_CTL_MOD, fd, &ev)
	}
	if err != nil {
		s.state.CompareAndSwap(uint64(gen)<<1, 0)
		return Conn{}, false
	}
	return Conn{fd: int32(fd), gen: gen}, true
}

// Begin names t the work in progress on c until End, so a close of the
// peer meanwhile reaches onHangup with t. It returns false, naming nothing,
// when the peer has already closed. It allocates nothing and makes no
// system call.
func (w *Watcher[T]) Begin(c Conn, t *T) bool {
	if c.gen == 0 {
		return true
	}
	s := &w.slots[c.fd]
	s.cur.Store(t)
	if s.state.Load() != uint64(c.gen)<<1 {
		s.cur.CompareAndSwap(t, nil)
		return false
	}
	return true
}

// Closed says the peer of c was seen to close (a close not yet reported to
// the Watcher's goroutine is not). It makes no system call.
func (w *Watcher[T]) Closed(c Conn) bool {
	return c.gen != 0 && w.slots[c.fd].state.Load() != uint64(c.gen)<<1
}

// End ends t's work on c. A close reported just before may still reach
// onHangup with t afterwards.
func (w *Watcher[T]) End(c Conn, t *T) {
	if c.gen != 0 {
		w.slots[c.fd].cur.CompareAndSwap(t, nil)
	}
}

// Remove forgets a connection that is closed (the kernel already dropped
// it from the epoll set).
func (w *Watcher[T]) Remove(c Conn) {
	if c.gen == 0 {
		return
	}
	s := &w.slots[c.fd]
	for v := s.state.Load(); v>>1 == uint64(c.gen); v = s.state.Load() {
		if s.state.CompareAndSwap(v, 0) {
			s.cur.Store(nil)
			return
		}
	}
}

// Close stops the Watcher's goroutine and waits for it.
func (w *Watcher[T]) Close() error {
	if w.closed.Swap(true) {
		return nil
	}
	err := rawsock.Wake(w.wake)
	<-w.done
	_ = syscall.Close(w.wake)
	return errors.Join(err, syscall.Close(w.epfd))
}

func (w *Watcher[T]) loop() {
	defer close(w.done)
	events := make([]syscall.EpollEvent, 128)
	for {
		n, err := syscall.EpollWait(w.epfd, events, -1)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return
		}
		for _, ev := range events[:n] {
			if ev.Fd < 0 {
				return // woken by Close
			}
			gen := uint32(ev.Pad)
			s := &w.slots[ev.Fd]
			if !s.state.CompareAndSwap(uint64(gen)<<1, uint64(gen)<<1|1) {
				continue // a connection gone since
			}
			if t := s.cur.Load(); t != nil {
				w.onHangup(t, gen)
			}
		}
	}
}
