package rawsock

import (
	"encoding/binary"
	"syscall"
)

// EpollET is EPOLLET (edge-triggered) as an epoll event's uint32, which
// syscall has as a negative int.
const EpollET = 1 << 31

// EpollWithWake makes an epoll set (close-on-exec) holding an eventfd
// (non-blocking, close-on-exec) watched for events, with the event data
// -1: how the set's waiter learns that another goroutine has news for it
// (Wake). The event loops share it: the front end's hang-up watcher,
// package coloop's loop and the epoll floor proxy's.
func EpollWithWake(events uint32) (epfd, wake int, err error) {
	if epfd, err = syscall.EpollCreate1(syscall.EPOLL_CLOEXEC); err != nil {
		return -1, -1, err
	}
	fd, _, errno := syscall.Syscall(syscall.SYS_EVENTFD2, 0, syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
	if errno != 0 {
		_ = syscall.Close(epfd)
		return -1, -1, errno
	}
	ev := syscall.EpollEvent{Events: events, Fd: -1}
	if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, int(fd), &ev); err != nil {
		_ = syscall.Close(epfd)
		_ = syscall.Close(int(fd))
		return -1, -1, err
	}
	return epfd, int(fd), nil
}

// Wake adds one to the eventfd wake (EpollWithWake's), which makes its
// epoll set ready.
func Wake(wake int) error {
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	_, err := syscall.Write(wake, one[:])
	return err
}
