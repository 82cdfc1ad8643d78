package frontend

import (
	"io"
	"net"
	"testing"

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
// meet a full buffer and wait for room, and however the peer's reads are
// sized, the peer gets the bytes written, in order and once each, and each
// write reports them all.
func FuzzWritesDeliverTheBytesWritten(f *testing.F) {
	f.Add([]byte("data: a\n\n"), []byte{1, 200}, []byte{3}, false)
	f.Add(make([]byte, 64<<10), []byte{255, 0, 17}, []byte{1, 255}, true)
	f.Fuzz(func(t *testing.T, data, writes, reads []byte, client bool) {
		var peer net.Conn
		var write func(p []byte) (int, error)
		if client {
			var cc *clientConn
			peer, cc = clientPair(t)
			write = cc.Write
			require.NoError(t, cc.Conn.(*net.TCPConn).SetWriteBuffer(4<<10))
		} else {
			var tc *trackedConn
			peer, tc = upstreamPair(t)
			write = tc.Write
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
			wrote, err := write(rest[:n])
			require.NoError(t, err)
			require.Equal(t, n, wrote, "a write reports all it was given")
			rest = rest[n:]
		}
		require.Equal(t, string(data), string(<-got), "the bytes written, in order, once each")
	})
}
