package rawsock

import (
	"syscall"
	"testing"
)

// An epoll set made with its wake-up eventfd has nothing ready until Wake,
// then the eventfd's event, with the data -1; read, it is quiet again.
func TestEpollWithWake(t *testing.T) {
	epfd, wake, err := EpollWithWake(syscall.EPOLLIN)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(epfd)
	defer syscall.Close(wake)
	events := make([]syscall.EpollEvent, 4)
	if n, err := syscall.EpollWait(epfd, events, 0); err != nil || n != 0 {
		t.Fatalf("before Wake: %d events, %v", n, err)
	}
	if err := Wake(wake); err != nil {
		t.Fatal(err)
	}
	n, err := syscall.EpollWait(epfd, events, 1000)
	if err != nil || n != 1 || events[0].Fd != -1 || events[0].Events&syscall.EPOLLIN == 0 {
		t.Fatalf("after Wake: %d events %+v, %v; want the eventfd's", n, events[:n], err)
	}
	var count [8]byte
	if _, err := syscall.Read(wake, count[:]); err != nil || count[0] != 1 {
		t.Fatalf("the eventfd's count: %v, %v", count, err)
	}
	if n, err := syscall.EpollWait(epfd, events, 0); err != nil || n != 0 {
		t.Fatalf("after the read: %d events, %v", n, err)
	}
}
