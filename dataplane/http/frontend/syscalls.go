//go:build !linux && !race

package frontend

import (
	"syscall"
	"unsafe"
)

// The router's sockets are non-blocking: a read or a write returns at once,
// with bytes or EAGAIN, and waits go through the poller (syscall.RawConn).
// So their reads and writes are made as raw system calls (sysRead,
// sysWrite), without the bookkeeping the Go scheduler keeps around a call
// that may block (entersyscall and exitsyscall). A goroutine in a plain
// system call leaves its processor in a state sysmon watches: on two busy
// CPUs, a write to loopback (which delivers to the peer in the writer's
// call) lasts long enough to be seen there, and sysmon then wakes every
// 20 µs and hands processors over to other threads. As golang/go#19563
// discusses, a raw call is safe for a call that cannot block. (On Linux
// they are recvfrom and sendto: syscalls_linux.go. Under the race
// detector they are syscall's own calls: syscalls_race.go.)

// sysRead is read(2) on a non-blocking socket.
func sysRead(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, errno := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	return int(n), errno
}

// sysWrite is write(2) on a non-blocking socket.
func sysWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, errno := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	return int(n), errno
}
