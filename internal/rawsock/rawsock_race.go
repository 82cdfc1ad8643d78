//go:build race

package rawsock

import "syscall"

// Under the race detector a socket's reads and writes are syscall's own
// calls, not raw ones (rawsock.go): syscall.Read and syscall.Write tell
// the detector what the kernel does with their buffers, which it writes
// into and reads from, and that a write happens before every read after
// it. Goroutines that hand data over through a socket, as a client and
// its router do, are then seen to be in order, and a buffer changed while
// the kernel reads it is seen to race. Raw calls would hide both.

// Read is read(2) on a non-blocking socket.
func Read(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Read(int(fd), p)
	return n, errnoOf(err)
}

// Write is write(2) on a non-blocking socket.
func Write(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Write(int(fd), p)
	return n, errnoOf(err)
}

func errnoOf(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	errno, ok := err.(syscall.Errno)
	if !ok {
		return syscall.EIO
	}
	return errno
}
