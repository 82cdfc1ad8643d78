package frontend

import (
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FuzzReadsReturnTheBytesSent: whatever pieces a peer sends before it
// closes (or resets) the connection, and whatever reads take them (read
// ahead through a wait, taken, or read straight into the caller's buffer),
// a client connection and an upstream one return the bytes sent, in order
// and once each, then the close as io.EOF (a reset as an error): never a
// count without new bytes behind it. (A read that met the close once
// returned the count of the read before it.)
func FuzzReadsReturnTheBytesSent(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\n\r\n{\"a\":1}"), []byte{0, 200, 200}, []byte{30}, false, false)
	f.Add([]byte("POST / HTTP/1.1\r\nContent-Length: 100\r\n\r\nRIFF"), []byte{0, 10, 255}, []byte{5, 5}, true, false)
	f.Add(make([]byte, 9000), []byte{0, 255, 0, 255}, []byte{200, 1}, false, true)
	f.Fuzz(func(t *testing.T, data, reads, pieces []byte, client, reset bool) {
		var peer net.Conn
		var read func(p []byte) (int, error)
		var await func()
		if client {
			var cc *clientConn
			peer, cc = clientPair(t)
			read, await = cc.Read, func() {}
		} else {
			var tc *trackedConn
			peer, tc = upstreamPair(t)
			read, await = tc.Read, tc.awaitReadable
		}
		sent := make(chan error, 1)
		go func() {
			rest := data
			for i := 0; len(rest) > 0; i++ {
				n := len(rest)
				if len(pieces) > 0 {
					n = min(n, int(pieces[i%len(pieces)])*64+1)
				}
				if _, err := peer.Write(rest[:n]); err != nil {
					sent <- err
					return
				}
				rest = rest[n:]
			}
			if reset {
				_ = peer.(*net.TCPConn).SetLinger(0)
			}
			sent <- peer.Close()
		}()
		var got []byte
		buf := make([]byte, 64<<10)
		for i := 0; ; i++ {
			size := 4 << 10
			if len(reads) > 0 {
				size = int(reads[i%len(reads)]) * 64
			}
			if size == 0 { // a wait for bytes (a client's read of one byte)
				await()
				size = 1
			}
			n, err := read(buf[:size])
			require.LessOrEqual(t, n, size)
			got = append(got, buf[:n]...)
			require.Equal(t, string(data[:min(len(got), len(data))]), string(got), "the bytes sent, in order, once each")
			if err != nil {
				if !reset {
					require.ErrorIs(t, err, io.EOF)
					require.Len(t, got, len(data))
				}
				break
			}
			require.Positive(t, n, "a read without an error returns bytes")
		}
		require.NoError(t, <-sent)
	})
}

// FuzzWritesDeliverTheBytesWritten: whatever pieces a client connection and
// an upstream one write, through socket buffers kept small so that writes
// meet a full buffer and wait for room, some of them held (hold: they
// leave before the next write, or when flushed), and however the peer's
// reads are sized, the peer gets the bytes written, in order and once
// each, and each write reports them all.
func FuzzWritesDeliverTheBytesWritten(f *testing.F) {
	f.Add([]byte("data: a\n\n"), []byte{1, 200}, []byte{3}, []byte{0}, false)
	f.Add(make([]byte, 64<<10), []byte{255, 0, 17}, []byte{1, 255}, []byte{1, 0, 1}, true)
	f.Add(make([]byte, 9000), []byte{3, 1, 8}, []byte{2}, []byte{1}, false)
	f.Fuzz(func(t *testing.T, data, writes, reads, holds []byte, client bool) {
		var peer net.Conn
		var write func(p []byte) (int, error)
		var io *sockIO
		if client {
			var cc *clientConn
			peer, cc = clientPair(t)
			write, io = cc.Write, &cc.sockIO
			require.NoError(t, cc.Conn.(*net.TCPConn).SetWriteBuffer(4<<10))
		} else {
			var tc *trackedConn
			peer, tc = upstreamPair(t)
			write, io = tc.Write, &tc.sockIO
			require.NoError(t, tc.Conn.(*net.TCPConn).SetWriteBuffer(4<<10))
		}
		require.NoError(t, peer.(*net.TCPConn).SetReadBuffer(4<<10))
		got := make(chan []byte, 1)
		go func() {
			var b []byte
			buf := make([]byte, 64<<10)
			for i := 0; len(b) < len(data); i++ {
				size := 4 << 10
				if len(reads) > 0 {
					size = int(reads[i%len(reads)])*64 + 1
				}
				n, err := peer.Read(buf[:size])
				b = append(b, buf[:n]...)
				if err != nil {
					break
				}
			}
			got <- b
		}()
		rest := data
		for i := 0; len(rest) > 0; i++ {
			n := len(rest)
			if len(writes) > 0 {
				n = min(n, int(writes[i%len(writes)])*256+1)
			}
			if len(holds) > 0 && holds[i%len(holds)]%2 == 1 {
				io.hold()
			}
			wrote, err := write(rest[:n])
			require.NoError(t, err)
			require.Equal(t, n, wrote, "a write reports all it was given")
			rest = rest[n:]
		}
		require.NoError(t, io.flushHeld())
		require.Equal(t, string(data), string(<-got), "the bytes written, in order, once each")
	})
}

// A held write (the last of a request to a worker) leaves with the wait for
// its answer: not before, and that wait reads the answer ahead. A write
// after a held one goes after it; a long prompt is held whole, a write
// over heldMax not at all; a held request to a worker that closed its
// connection ends the wait with the failure; and held bytes that meet a
// full socket buffer go out whole, in order, once the peer reads.
func TestAHeldWriteLeavesWithTheWaitForTheAnswer(t *testing.T) {
	readsNothing := func(peer net.Conn) {
		t.Helper()
		require.NoError(t, peer.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
		n, err := peer.Read(make([]byte, 1))
		require.Zero(t, n, "held: nothing left")
		require.ErrorIs(t, err, os.ErrDeadlineExceeded)
		require.NoError(t, peer.SetReadDeadline(time.Time{}))
	}
	answer := func(peer net.Conn, want, reply string) <-chan string {
		got := make(chan string, 1)
		go func() {
			b := make([]byte, len(want))
			_, _ = io.ReadFull(peer, b)
			got <- string(b)
			_, _ = io.WriteString(peer, reply)
		}()
		return got
	}

	peer, tc := upstreamPair(t)
	tc.hold()
	n, err := tc.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	require.NoError(t, err)
	require.Equal(t, 18, n)
	readsNothing(peer)
	got := answer(peer, "GET / HTTP/1.1\r\n\r\n", "HTTP/1.1 200 OK\r\n\r\n")
	tc.awaitReadable()
	require.True(t, tc.pending(), "the answer was read ahead")
	b := make([]byte, 64)
	n, err = tc.Read(b)
	require.NoError(t, err)
	assert.Equal(t, "HTTP/1.1 200 OK\r\n\r\n", string(b[:n]))
	assert.Equal(t, "GET / HTTP/1.1\r\n\r\n", <-got)

	// A write after a held one follows it.
	tc.hold()
	_, err = tc.Write([]byte("first "))
	require.NoError(t, err)
	_, err = tc.Write([]byte("second"))
	require.NoError(t, err)
	b = make([]byte, 12)
	_, err = io.ReadFull(peer, b)
	require.NoError(t, err)
	assert.Equal(t, "first second", string(b))

	// Larger than a lent buffer (a long prompt): held whole all the same.
	prompt := strings.Repeat("p", 20<<10)
	tc.hold()
	_, err = tc.Write([]byte(prompt))
	require.NoError(t, err)
	readsNothing(peer)
	got = answer(peer, prompt, "HTTP/1.1 200 OK\r\n\r\n")
	tc.awaitReadable()
	assert.Equal(t, prompt, <-got)
	b = make([]byte, 64)
	n, err = tc.Read(b)
	require.NoError(t, err)
	assert.Equal(t, "HTTP/1.1 200 OK\r\n\r\n", string(b[:n]))

	// Larger than heldMax: sent at once.
	big := strings.Repeat("x", heldMax+1)
	tc.hold()
	_, err = tc.Write([]byte(big))
	require.NoError(t, err)
	b = make([]byte, len(big))
	_, err = io.ReadFull(peer, b)
	require.NoError(t, err)
	tc.holding = false // the hold asked before is for a later write no more

	// A worker that closed: the wait ends with the failure.
	tc.hold()
	_, err = tc.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	require.NoError(t, err)
	require.NoError(t, peer.Close())
	done := make(chan error, 1)
	go func() {
		tc.awaitReadable()
		_, err := tc.Read(make([]byte, 64))
		done <- err
	}()
	select {
	case err := <-done:
		require.Error(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the wait on a closed connection did not end")
	}

	// A full socket buffer: the held bytes wait for room, after the bytes
	// before them.
	peer, tc = upstreamPair(t)
	require.NoError(t, tc.Conn.(*net.TCPConn).SetWriteBuffer(4<<10))
	require.NoError(t, peer.(*net.TCPConn).SetReadBuffer(4<<10))
	require.NoError(t, tc.Conn.SetWriteDeadline(time.Now().Add(100*time.Millisecond)))
	filled, err := tc.Write(make([]byte, 1<<20))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, "the buffers are full")
	require.NoError(t, tc.Conn.SetWriteDeadline(time.Time{}))
	held := strings.Repeat("h", 4<<10)
	tc.hold()
	_, err = tc.Write([]byte(held))
	require.NoError(t, err)
	got = answer(peer, strings.Repeat("\x00", filled)+held, "HTTP/1.1 204 No Content\r\n\r\n")
	tc.awaitReadable()
	assert.Equal(t, strings.Repeat("\x00", filled)+held, <-got)
	n, err = tc.Read(b)
	require.NoError(t, err)
	assert.Equal(t, "HTTP/1.1 204 No Content\r\n\r\n", string(b[:n]))
}

// A client connection closed from another goroutine while its owner is
// about to wait (fasthttp's shutdown closes connections it thinks idle)
// sends its held answer once, whichever of the two takes it: the client
// gets it whole, then the close.
func TestAHeldAnswerLeavesOnceWhoeverClosesTheConnection(t *testing.T) {
	for range 20 {
		peer, cc := clientPair(t)
		cc.hold()
		_, err := cc.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"))
		require.NoError(t, err)
		waited := make(chan struct{})
		go func() {
			defer close(waited)
			cc.await() // the owner's wait for the next request: it fails at the close
		}()
		require.NoError(t, cc.Close())
		<-waited
		require.NoError(t, peer.SetReadDeadline(time.Now().Add(5*time.Second)))
		got, err := io.ReadAll(peer)
		require.NoError(t, err)
		assert.Equal(t, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", string(got))
	}
}
