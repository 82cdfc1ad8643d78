//go:build !linux && !race

package rawsock

import (
	"syscall"
	"unsafe"
)

// Read is read(2) on a non-blocking socket.
func Read(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, errno := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	return int(n), errno
}

// Write is write(2) on a non-blocking socket.
func Write(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, errno := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	return int(n), errno
}
