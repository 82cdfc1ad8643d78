//go:build linux

// Package coloop runs code written in the blocking style of Go's net
// package as coroutines over one epoll loop: a task (Loop.Go) reads and
// writes its connections (Loop.Conn) as it would any net.Conn, and where a
// read finds nothing or a write no room, the task yields to the loop,
// which resumes it once epoll says the socket is ready. A task switch is
// the runtime's direct hand-over between coroutines (iter.Pull), not a
// goroutine's park in the poller and its wake-up through the scheduler;
// the loop itself parks in the poller only while no socket of its set is
// ready, once per batch of events.
//
// Issue 18's floor proxies measured the difference on the same proxy code:
// served by a goroutine per connection it cost 1.09–1.13× the CPU per
// short request of nginx with one worker process; as coroutines of one
// loop, 0.93–0.98× (package bench/floor, model "coroutines"; the README's
// "What Go itself costs").
//
// The rules a task keeps:
//   - It blocks only in its connections' reads and writes, and in Block.
//     Anything else that waits (a channel, a lock held long, a plain
//     net.Conn, time.Sleep) holds up every task of the loop until it ends;
//     run it through Block instead.
//   - A Conn is used by the tasks of its loop. Another goroutine may Close
//     it, which wakes the task waiting on it.
//
// Deadlines are the loop's own timers. A task's wait tolerates spurious
// wake-ups: a read or write is tried again, and waits again on EAGAIN.
package coloop

import (
	"container/heap"
	"errors"
	"io"
	"iter"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/fastroute/fastroute/internal/rawsock"
)

// ErrStopped is what a wait returns once the loop stops: the task should
// return.
var ErrStopped = errors.New("coloop: the loop stopped")

// Loop is one epoll set and the tasks it runs.
type Loop struct {
	epfd    *os.File        // the epoll set, parked on through the poller
	raw     syscall.RawConn // its descriptor's
	wake    int             // an eventfd in the set: the mailbox has news
	conns   []*Conn         // by slot (the epoll events' data)
	free    []int32         // slots of closed connections, for reuse
	current *Task           // the task running now; nil: the loop
	tasks   map[*Task]struct{}
	timers  timerHeap
	stopped bool

	mu   sync.Mutex // guards mail, over and the eventfd's writes
	mail []message
	over bool // the loop ended: news goes nowhere
	done chan struct{}
}

// message is news for the loop from another goroutine.
type message struct {
	start  func(*Task) // Go: a new task
	resume *Task       // Block's work ended
	closed *Conn       // Close: wake its waiters
	stop   bool
}

// Task is a coroutine of a loop.
type Task struct {
	l       *Loop
	next    func() (struct{}, bool)
	yield   func(struct{}) bool
	blocked bool      // in Block, until its work ends
	at      time.Time // its wait's deadline, while in timers
	index   int       // its place in timers; -1: none
	expired bool      // its wait's deadline passed
}

// New makes a loop; Start runs it.
func New() (*Loop, error) {
	epfd, wake, err := rawsock.EpollWithWake(syscall.EPOLLIN | rawsock.EpollET)
	if err != nil {
		return nil, err
	}
	l := &Loop{wake: wake, tasks: map[*Task]struct{}{}, done: make(chan struct{})}
	// Non-blocking, the epoll set is a file the poller waits on: readable
	// while it holds ready events.
	if err := syscall.SetNonblock(epfd, true); err != nil {
		_ = syscall.Close(epfd)
		_ = syscall.Close(l.wake)
		return nil, err
	}
	l.epfd = os.NewFile(uintptr(epfd), "epoll")
	if l.raw, err = l.epfd.SyscallConn(); err != nil {
		_ = l.epfd.Close()
		_ = syscall.Close(l.wake)
		return nil, err
	}
	return l, nil
}

// Start runs the loop in a goroutine of its own until Stop.
func (l *Loop) Start() { go l.run() }

// Stop ends the loop: every task's wait returns ErrStopped, and Stop
// returns once they all returned (a task in Block once its work ended).
// A second Stop returns at once.
func (l *Loop) Stop() {
	l.post(message{stop: true})
	<-l.done
}

// Go runs fn as a task of the loop. It may be called from any goroutine;
// after Stop, fn does not run.
func (l *Loop) Go(fn func(*Task)) { l.post(message{start: fn}) }

// post hands m to the loop, unless it ended.
func (l *Loop) post(m message) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.over {
		return
	}
	l.mail = append(l.mail, m)
	_ = rawsock.Wake(l.wake)
}

func (l *Loop) run() {
	defer close(l.done)
	events := make([]syscall.EpollEvent, 256)
	var n int
	poll := func(fd uintptr) bool {
		r, _, errno := syscall.RawSyscall6(syscall.SYS_EPOLL_WAIT, fd, uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), 0, 0, 0)
		n = int(r)
		if errno != 0 {
			n = 0
		}
		return n > 0
	}
	var armed time.Time // the epoll file's read deadline: the earliest timer's
	for !l.stopped || len(l.tasks) > 0 {
		if next := l.timers.earliest(); !next.Equal(armed) {
			armed = next
			_ = l.epfd.SetReadDeadline(next)
		}
		err := l.raw.Read(poll)
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			break // the epoll file closed: not reached while it runs
		}
		for _, ev := range events[:n] {
			if ev.Fd < 0 {
				l.readMail()
				continue
			}
			if c := l.conns[ev.Fd]; c != nil {
				c.ready(ev.Events)
			}
		}
		n = 0
		if len(l.timers) > 0 {
			l.expire(time.Now())
		}
	}
	l.mu.Lock()
	l.over = true
	l.mu.Unlock()
	_ = l.epfd.Close()
	_ = syscall.Close(l.wake)
}

// readMail takes the other goroutines' news.
func (l *Loop) readMail() {
	var drain [8]byte
	_, _ = syscall.Read(l.wake, drain[:])
	l.mu.Lock()
	mail := l.mail
	l.mail = nil
	l.mu.Unlock()
	for _, m := range mail {
		switch {
		case m.start != nil && !l.stopped:
			l.start(m.start)
		case m.resume != nil:
			m.resume.blocked = false
			l.resume(m.resume)
		case m.closed != nil:
			m.closed.wakeAll()
			m.closed.forget()
		case m.stop:
			l.stopped = true
			for t := range l.tasks {
				if !t.blocked {
					l.resume(t)
				}
			}
		}
	}
}

func (l *Loop) start(fn func(*Task)) {
	t := &Task{l: l, index: -1}
	t.next, _ = iter.Pull(func(yield func(struct{}) bool) {
		t.yield = yield
		fn(t)
	})
	l.tasks[t] = struct{}{}
	l.resume(t)
}

// resume runs t until it waits again or returns.
func (l *Loop) resume(t *Task) {
	prev := l.current
	l.current = t
	_, more := t.next()
	l.current = prev
	if !more {
		delete(l.tasks, t)
	}
}

// park yields the running task t until the loop resumes it (an event, a
// timer, Block's end, a close, Stop). deadline zero: no timer.
func (t *Task) park(deadline time.Time) error {
	l := t.l
	if l.stopped {
		return ErrStopped
	}
	t.expired = false
	if !deadline.IsZero() {
		t.at = deadline
		heap.Push(&l.timers, t)
	}
	t.yield(struct{}{})
	if t.index >= 0 {
		heap.Remove(&l.timers, t.index)
	}
	switch {
	case l.stopped && !t.blocked:
		return ErrStopped
	case t.expired:
		return os.ErrDeadlineExceeded
	}
	return nil
}

// expire resumes the tasks whose wait's deadline passed by now.
func (l *Loop) expire(now time.Time) {
	for len(l.timers) > 0 && !l.timers[0].at.After(now) {
		t := heap.Pop(&l.timers).(*Task)
		t.expired = true
		l.resume(t)
	}
}

// Block runs fn in a goroutine of its own while the task waits, so that
// the loop's other tasks run meanwhile: for the calls that wait on
// anything but the task's connections (a dial, a channel). fn must end:
// Stop waits for it.
func (t *Task) Block(fn func()) {
	t.blocked = true
	go func() {
		fn()
		t.l.post(message{resume: t})
	}()
	for t.blocked {
		t.yield(struct{}{})
	}
}

// Conn is a connection read and written by the tasks of one loop.
type Conn struct {
	net.Conn
	l         *Loop
	raw       syscall.RawConn
	slot      int32
	in, out   bool  // readiness epoll reported and no read or write used up since
	reader    *Task // the task waiting to read; nil: none
	writer    *Task // the task waiting to write
	closed    atomic.Bool
	rdl, wdl  time.Time // deadlines
	closeOnce sync.Once
}

// Conn adds c, a TCP or Unix socket, to the loop's set: its reads and
// writes from the loop's tasks wait through the loop. It must be called
// from a task of l.
func (l *Loop) Conn(c net.Conn) (*Conn, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil, errors.New("coloop: not a socket")
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil, err
	}
	cc := &Conn{Conn: c, l: l, raw: raw, in: true, out: true}
	if n := len(l.free); n > 0 {
		cc.slot = l.free[n-1]
		l.free = l.free[:n-1]
	} else {
		cc.slot = int32(len(l.conns))
		l.conns = append(l.conns, nil)
	}
	var cerr error
	err = raw.Control(func(fd uintptr) {
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLOUT | syscall.EPOLLRDHUP | rawsock.EpollET, Fd: cc.slot}
		cerr = syscall.EpollCtl(int(l.epfd.Fd()), syscall.EPOLL_CTL_ADD, int(fd), &ev)
	})
	if err == nil {
		err = cerr
	}
	if err != nil {
		l.free = append(l.free, cc.slot)
		return nil, err
	}
	l.conns[cc.slot] = cc
	return cc, nil
}

// ready takes an event of the connection's socket.
func (c *Conn) ready(events uint32) {
	if events&(syscall.EPOLLIN|syscall.EPOLLRDHUP|syscall.EPOLLHUP|syscall.EPOLLERR) != 0 {
		c.in = true
		if t := c.reader; t != nil {
			c.reader = nil
			c.l.resume(t)
		}
	}
	if events&(syscall.EPOLLOUT|syscall.EPOLLHUP|syscall.EPOLLERR) != 0 {
		c.out = true
		if t := c.writer; t != nil {
			c.writer = nil
			c.l.resume(t)
		}
	}
}

// wakeAll resumes the tasks waiting on the connection (it closed).
func (c *Conn) wakeAll() {
	for _, t := range []*Task{c.reader, c.writer} {
		if t != nil {
			c.l.resume(t)
		}
	}
	c.reader, c.writer = nil, nil
}

// Read reads what has come, waiting through the loop while nothing has.
// A read that returns less than p holds took all there was (nginx's rule
// for edge-triggered sockets): the next one waits for the socket's next
// event before it reads, saving a read that would find nothing.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		if err := c.wait(&c.reader, &c.in, c.rdl); err != nil {
			return 0, c.opError("read", err)
		}
		var n int
		var errno syscall.Errno
		if err := c.control(func(fd uintptr) { n, errno = rawsock.Read(fd, p) }); err != nil {
			return 0, err
		}
		switch {
		case errno == syscall.EAGAIN:
			c.in = false
		case errno != 0:
			return 0, c.opError("read", errno)
		case n == 0:
			return 0, io.EOF
		default:
			if n < len(p) {
				c.in = false
			}
			return n, nil
		}
	}
}

// Write writes p whole, waiting through the loop for room. A write that
// takes less than it was given found the socket's buffer full: the next
// waits for room before it writes.
func (c *Conn) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		if err := c.wait(&c.writer, &c.out, c.wdl); err != nil {
			return done, c.opError("write", err)
		}
		var n int
		var errno syscall.Errno
		if err := c.control(func(fd uintptr) { n, errno = rawsock.Write(fd, p[done:]) }); err != nil {
			return done, err
		}
		switch {
		case errno == syscall.EAGAIN:
			c.out = false
		case errno != 0:
			return done, c.opError("write", errno)
		default:
			if done += n; done < len(p) {
				c.out = false
			}
		}
	}
	return done, nil
}

// control calls f with the socket's descriptor, held open meanwhile.
func (c *Conn) control(f func(fd uintptr)) error {
	if c.closed.Load() {
		return net.ErrClosed
	}
	return c.raw.Control(f)
}

// wait parks the running task as the connection's waiter until ready says
// the socket may be (*flag), its deadline passes or it closes.
func (c *Conn) wait(waiter **Task, flag *bool, deadline time.Time) error {
	t := c.l.current
	if t == nil {
		panic("coloop: a Conn read or written outside its loop's tasks")
	}
	for !*flag {
		if c.closed.Load() {
			return net.ErrClosed
		}
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			return os.ErrDeadlineExceeded
		}
		*waiter = t
		err := t.park(deadline)
		if *waiter == t {
			*waiter = nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (c *Conn) opError(op string, err error) error {
	if errors.Is(err, net.ErrClosed) || err == ErrStopped {
		return err
	}
	return &net.OpError{Op: op, Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// Close closes the connection; a task waiting on it wakes with
// net.ErrClosed. Any goroutine may call it.
func (c *Conn) Close() error {
	err := net.ErrClosed
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		err = c.Conn.Close() // the kernel drops a closed socket from the set
		c.l.post(message{closed: c})
	})
	return err
}

// forget frees the slot of a closed connection (the loop's mail).
func (c *Conn) forget() {
	if c.l.conns[c.slot] == c {
		c.l.conns[c.slot] = nil
		c.l.free = append(c.l.free, c.slot)
	}
}

// SetDeadline sets both deadlines; they bound the waits through the loop.
// The deadlines are set from the loop's tasks, as the reads and writes are
// made.
func (c *Conn) SetDeadline(t time.Time) error {
	c.rdl, c.wdl = t, t
	return nil
}

// SetReadDeadline bounds the reads' waits.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.rdl = t
	return nil
}

// SetWriteDeadline bounds the writes' waits.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.wdl = t
	return nil
}

// timerHeap holds the waiting tasks that have a deadline, earliest first.
type timerHeap []*Task

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *timerHeap) Push(x any) {
	t := x.(*Task)
	t.index = len(*h)
	*h = append(*h, t)
}
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	t.index = -1
	*h = old[:len(old)-1]
	return t
}

// earliest is the first timer's time (zero: none).
func (h timerHeap) earliest() time.Time {
	if len(h) == 0 {
		return time.Time{}
	}
	return h[0].at
}
