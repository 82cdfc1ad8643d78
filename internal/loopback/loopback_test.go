package loopback

import (
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// FreeAddr gives a port a listener can take, below the kernel's ephemeral
// range (which this machine's /proc names), so that no outgoing
// connection takes it first.
func TestFreeAddrCanBeListenedOn(t *testing.T) {
	low := ephemeralLow()
	for range 20 {
		addr, err := FreeAddr()
		require.NoError(t, err)
		host, port, err := net.SplitHostPort(addr)
		require.NoError(t, err)
		require.Equal(t, "127.0.0.1", host)
		n, err := strconv.Atoi(port)
		require.NoError(t, err)
		require.Less(t, n, low, "below the ephemeral range")
		require.GreaterOrEqual(t, n, low-portsBelowEphemeral)
		ln, err := net.Listen("tcp", addr)
		require.NoError(t, err, "the port is free")
		require.NoError(t, ln.Close())
	}
}
