// Package loopback finds loopback addresses for the processes the router
// starts beside itself: etcd for the tests and demos, front ends for the
// benchmarks.
package loopback

import "net"

// FreeAddr returns a loopback address ("127.0.0.1:port") whose port is
// free right now: the kernel picks it for a listener closed at once. A
// process told to listen there may still find it taken by another that
// asked meanwhile.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}
