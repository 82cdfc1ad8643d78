package loopback

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFreeAddrCanBeListenedOn(t *testing.T) {
	addr, err := FreeAddr()
	require.NoError(t, err)
	host, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1", host)
	require.NotEqual(t, "0", port)
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err, "the port is free")
	require.NoError(t, ln.Close())
}
