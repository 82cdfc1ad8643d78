//go:build linux

package coloop_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fastroute/fastroute/internal/coloop"
)

func startLoop(t *testing.T) *coloop.Loop {
	t.Helper()
	l, err := coloop.New()
	if err != nil {
		t.Fatal(err)
	}
	l.Start()
	t.Cleanup(l.Stop)
	return l
}

func listen(t *testing.T) *net.TCPListener {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}

// serve accepts ln's connections into tasks of l running fn.
func serve(t *testing.T, l *coloop.Loop, ln net.Listener, fn func(*coloop.Task, *coloop.Conn)) {
	t.Helper()
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			l.Go(func(task *coloop.Task) {
				c, err := l.Conn(nc)
				if err != nil {
					t.Error(err)
					_ = nc.Close()
					return
				}
				defer c.Close()
				fn(task, c)
			})
		}
	}()
}

// echo writes back each read's bytes until the peer's end.
func echo(_ *coloop.Task, c *coloop.Conn) {
	buf := make([]byte, 512)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return
		}
		if _, err := c.Write(buf[:n]); err != nil {
			return
		}
	}
}

// TestTasksEchoConcurrently runs 32 clients against one loop, each sending
// its own bytes in pieces with pauses between: every task waits on its
// socket while the others run, and each client gets exactly its bytes back.
func TestTasksEchoConcurrently(t *testing.T) {
	l := startLoop(t)
	ln := listen(t)
	serve(t, l, ln, echo)
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			want := bytes.Repeat([]byte{byte('a' + i%26)}, 3000+i)
			go func() {
				for p := want; len(p) > 0; {
					k := min(len(p), 700)
					if _, err := c.Write(p[:k]); err != nil {
						t.Error(err)
						return
					}
					p = p[k:]
					time.Sleep(time.Millisecond)
				}
			}()
			got := make([]byte, len(want))
			if _, err := io.ReadFull(c, got); err != nil {
				t.Error(err)
				return
			}
			if !bytes.Equal(got, want) {
				t.Errorf("client %d got other bytes back", i)
			}
		}()
	}
	wg.Wait()
}

// TestAWriteWaitsForRoomWhileOthersRun writes 8 MiB to a client that reads
// only after a second client got an answer: the first task waits for room
// through the loop and the second is served meanwhile.
func TestAWriteWaitsForRoomWhileOthersRun(t *testing.T) {
	l := startLoop(t)
	ln := listen(t)
	big := bytes.Repeat([]byte("0123456789abcdef"), 8<<20/16)
	wrote := make(chan error, 1)
	serve(t, l, ln, func(task *coloop.Task, c *coloop.Conn) {
		var cmd [1]byte
		if _, err := io.ReadFull(c, cmd[:]); err != nil {
			return
		}
		if cmd[0] == 'B' {
			_ = c.Conn.(*net.TCPConn).SetWriteBuffer(64 << 10) // far less than big, whatever the system's autotuning
			_, err := c.Write(big)
			wrote <- err
			return
		}
		echo(task, c)
	})
	bigC, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer bigC.Close()
	_ = bigC.(*net.TCPConn).SetReadBuffer(64 << 10)
	if _, err := bigC.Write([]byte("B")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the big write fills the socket buffers and waits
	select {
	case err := <-wrote:
		t.Fatalf("8 MiB written before the client read any (%v): no wait for room", err)
	default:
	}
	small, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	if _, err := small.Write([]byte("Eping")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4)
	_ = small.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(small, got); err != nil || string(got) != "ping" {
		t.Fatalf("second client while the first write waits: %q, %v", got, err)
	}
	all, err := io.ReadAll(io.LimitReader(bigC, int64(len(big))))
	if err != nil || !bytes.Equal(all, big) {
		t.Fatalf("big write: %d of %d bytes, equal %v, %v", len(all), len(big), bytes.Equal(all, big), err)
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
}

// TestDeadlinesEndWaits: a read deadline ends a wait for a silent peer with
// os.ErrDeadlineExceeded, not before it, while another task keeps serving;
// a deadline already past fails at once, and a later one lets the read
// take bytes that come.
func TestDeadlinesEndWaits(t *testing.T) {
	l := startLoop(t)
	ln := listen(t)
	type result struct {
		err     error
		elapsed time.Duration
	}
	results := make(chan result, 3)
	serve(t, l, ln, func(task *coloop.Task, c *coloop.Conn) {
		var cmd [1]byte
		if _, err := io.ReadFull(c, cmd[:]); err != nil || cmd[0] != 'D' {
			echo(task, c)
			return
		}
		buf := make([]byte, 8)
		start := time.Now()
		_ = c.SetReadDeadline(start.Add(100 * time.Millisecond))
		_, err := c.Read(buf)
		results <- result{err, time.Since(start)}
		_, err = c.Read(buf) // the deadline has passed
		results <- result{err, 0}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := c.Read(buf)
		if err == nil && string(buf[:n]) != "late" {
			err = errors.New("read " + string(buf[:n]))
		}
		results <- result{err, 0}
	})
	silent, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	if _, err := silent.Write([]byte("D")); err != nil {
		t.Fatal(err)
	}
	other, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.Write([]byte("Exy")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 2)
	if _, err := io.ReadFull(other, got); err != nil || string(got) != "xy" {
		t.Fatalf("other client: %q, %v", got, err)
	}
	r := <-results
	if !errors.Is(r.err, os.ErrDeadlineExceeded) || r.elapsed < 100*time.Millisecond || r.elapsed > 3*time.Second {
		t.Fatalf("read of a silent peer: %v after %v; want a deadline error after 100ms", r.err, r.elapsed)
	}
	if r := <-results; !errors.Is(r.err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v", r.err)
	}
	if _, err := silent.Write([]byte("late")); err != nil {
		t.Fatal(err)
	}
	if r := <-results; r.err != nil {
		t.Fatalf("read under a new deadline: %v", r.err)
	}
}

// TestCloseWakesTheWaitingTask: another goroutine's Close ends a task's
// read wait with net.ErrClosed; the peer's close ends one with io.EOF.
func TestCloseWakesTheWaitingTask(t *testing.T) {
	l := startLoop(t)
	ln := listen(t)
	conns := make(chan *coloop.Conn, 2)
	errs := make(chan error, 2)
	serve(t, l, ln, func(_ *coloop.Task, c *coloop.Conn) {
		conns <- c
		_, err := c.Read(make([]byte, 8))
		errs <- err
	})
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ca := <-conns
	time.Sleep(20 * time.Millisecond) // the task waits
	if err := ca.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errs; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read of a connection closed meanwhile: %v; want net.ErrClosed", err)
	}
	if err := ca.Close(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
	b, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	<-conns
	time.Sleep(20 * time.Millisecond)
	_ = b.Close()
	if err := <-errs; err != io.EOF {
		t.Fatalf("read of a connection the peer closed: %v; want io.EOF", err)
	}
}

// TestBlockLetsTheOthersRun: a task in Block waits on a channel that only
// another task of the same loop closes; without Block that would hold up
// the loop for good.
func TestBlockLetsTheOthersRun(t *testing.T) {
	l := startLoop(t)
	release := make(chan struct{})
	done := make(chan string, 2)
	l.Go(func(task *coloop.Task) {
		task.Block(func() { <-release })
		done <- "blocked task"
	})
	l.Go(func(*coloop.Task) {
		close(release)
		done <- "releasing task"
	})
	timeout := time.After(5 * time.Second)
	for range 2 {
		select {
		case <-done:
		case <-timeout:
			t.Fatal("a task in Block held up the loop")
		}
	}
}

// TestStopEndsEveryTask: Stop wakes the tasks that wait (their reads
// return ErrStopped), waits for a task in Block to end its work, and
// returns once all returned; a task started after it does not run.
func TestStopEndsEveryTask(t *testing.T) {
	l, err := coloop.New()
	if err != nil {
		t.Fatal(err)
	}
	l.Start()
	ln := listen(t)
	errs := make(chan error, 4)
	serve(t, l, ln, func(_ *coloop.Task, c *coloop.Conn) {
		_, err := c.Read(make([]byte, 8))
		errs <- err
	})
	var clients []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	var worked bool
	l.Go(func(task *coloop.Task) {
		task.Block(func() { time.Sleep(100 * time.Millisecond); worked = true })
		errs <- nil
	})
	time.Sleep(50 * time.Millisecond) // the reads wait
	_ = ln.Close()
	stopped := make(chan struct{})
	go func() { l.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("Stop did not return")
	}
	if !worked {
		t.Fatal("Stop returned before Block's work ended")
	}
	for range 3 {
		if err := <-errs; !errors.Is(err, coloop.ErrStopped) {
			t.Fatalf("a waiting read at Stop: %v; want ErrStopped", err)
		}
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	ran := make(chan struct{})
	l.Go(func(*coloop.Task) { close(ran) })
	select {
	case <-ran:
		t.Fatal("a task started after Stop ran")
	case <-time.After(20 * time.Millisecond):
	}
	for _, c := range clients {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("client after Stop: %v; want its connection closed", err)
		}
	}
}
