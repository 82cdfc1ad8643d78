package rawsock

import (
	"net"
	"syscall"
	"testing"
)

// A non-blocking loopback socket: Write's bytes reach the peer, whose
// Read takes them and then finds nothing (EAGAIN) rather than waiting;
// after the peer's close, Read finds the end (0 bytes, no error) and
// Write fails (EPIPE) without a SIGPIPE.
func TestReadAndWriteANonBlockingSocket(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	fdOf := func(c net.Conn) uintptr {
		raw, err := c.(*net.TCPConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var fd uintptr
		_ = raw.Control(func(f uintptr) { fd = f })
		return fd
	}
	cfd, sfd := fdOf(client), fdOf(server)
	if n, errno := Write(cfd, []byte("hello")); n != 5 || errno != 0 {
		t.Fatalf("write: %d, %v", n, errno)
	}
	buf := make([]byte, 16)
	var n int
	var errno syscall.Errno
	for n, errno = Read(sfd, buf); errno == syscall.EAGAIN; n, errno = Read(sfd, buf) {
		// loopback delivers within the write; a busy machine may still be a moment late
	}
	if string(buf[:n]) != "hello" || errno != 0 {
		t.Fatalf("read %q, %v", buf[:n], errno)
	}
	if n, errno := Read(sfd, buf); errno != syscall.EAGAIN {
		t.Fatalf("a read of nothing: %d, %v, not EAGAIN", n, errno)
	}
	if err := client.Close(); err != nil {
		t.Fatal(err)
	}
	for n, errno = Read(sfd, buf); errno == syscall.EAGAIN; n, errno = Read(sfd, buf) {
	}
	if n != 0 || errno != 0 {
		t.Fatalf("the peer's close: %d, %v", n, errno)
	}
	var werr syscall.Errno
	for range 100 { // the first write after the close may still be taken; the reset comes back for the next
		if _, werr = Write(sfd, []byte("x")); werr != 0 {
			break
		}
	}
	if werr != syscall.EPIPE && werr != syscall.ECONNRESET {
		t.Fatalf("a write to a closed peer: %v", werr)
	}
	server.Close()
}
