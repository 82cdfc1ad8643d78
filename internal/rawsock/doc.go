// Package rawsock reads and writes non-blocking sockets with raw system
// calls: the router's connections (package frontend), package coloop's,
// and the event loop of bench-e2e's epoll floor proxy (package
// bench/floor). On Linux it also makes the epoll set with a wake-up
// eventfd that those event loops and the hang-up watcher share
// (EpollWithWake, Wake).
//
// A read or a write of a non-blocking socket returns at once, with bytes
// or EAGAIN, and the caller waits through the poller (syscall.RawConn) or
// an epoll set of its own. So the calls are raw, without the bookkeeping
// the Go scheduler keeps around a call that may block (entersyscall and
// exitsyscall). A goroutine in a plain system call leaves its processor in
// a state sysmon watches: on two busy CPUs, a write to loopback (which
// delivers to the peer in the writer's call) lasts long enough to be seen
// there, and sysmon then wakes every 20 µs and hands processors over to
// other threads. As golang/go#19563 discusses, a raw call is safe for a
// call that cannot block. On Linux they are recvfrom and sendto
// (rawsock_linux.go); elsewhere read and write (rawsock.go). Under the race
// detector they are syscall's own calls (rawsock_race.go).
package rawsock
