// Package loopback finds loopback addresses for the processes the router
// starts beside itself: etcd for the tests and demos, front ends for the
// benchmarks.
package loopback

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
)

// portsBelowEphemeral is how many ports below the kernel's ephemeral range
// FreeAddr picks from.
const portsBelowEphemeral = 8192

// FreeAddr returns a loopback address ("127.0.0.1:port") whose port is
// free right now, picked at random below the kernel's range of ephemeral
// ports (net.ipv4.ip_local_port_range). A port of that range, as a
// listener on port 0 gets, can become the local port of any outgoing
// connection (tests and load runs make them by the thousand) between this
// check and the listen of the process told to use it, which then fails to
// start. A process told to listen there may still find it taken by another
// that was given the same port meanwhile, as rarely as two random picks of
// 8,192 ports meet.
func FreeAddr() (string, error) {
	low := ephemeralLow()
	for range 64 {
		port := low - 1 - rand.IntN(portsBelowEphemeral)
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			addr := ln.Addr().String()
			return addr, ln.Close()
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0") // every pick taken: the kernel's
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// ephemeralLow returns the first port of the kernel's ephemeral range, or
// Linux's default first port where the range cannot be read or leaves too
// few ports below it.
func ephemeralLow() int {
	const linuxDefault = 32768
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return linuxDefault
	}
	var low, high int
	if _, err := fmt.Sscan(string(b), &low, &high); err != nil || low <= 1024+portsBelowEphemeral {
		return linuxDefault
	}
	return low
}
