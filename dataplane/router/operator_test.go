package router

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLargeHeadersPassAndOversizeOnesAre431WithoutEcho(t *testing.T) {
	f := startFleet(t, mocks(1, 1, 0), nil)
	big := strings.Repeat("a", 20<<10)
	resp := f.post("/v1/chat/completions", chatBody, "Authorization", "Bearer "+big, "x-trace", big)
	readAll(t, resp)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "20 KB of headers are within the 64 KiB default")

	secret := "Bearer sk-" + strings.Repeat("S", 70<<10)
	resp = f.post("/v1/chat/completions", chatBody, "Authorization", secret)
	body := readAll(t, resp)
	assert.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)
	assert.Contains(t, body, "limits.max_header_bytes (65536 bytes)")
	assert.NotContains(t, body, "sk-SSSS", "the credential is not echoed")

	// A malformed request whose parser error would quote it: a clear 400, nothing echoed.
	conn, err := net.Dial("tcp", f.r.Addr())
	require.NoError(t, err)
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-leak\r\nContent-Length: abc\r\n\r\n")
	resp2, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	body = readAll(t, resp2)
	assert.Equal(t, http.StatusBadRequest, resp2.StatusCode)
	assert.Contains(t, body, "malformed HTTP request")
	assert.NotContains(t, body, "sk-leak")
	f.assertIdle()
}

func TestMaxHeaderBytesIsConfigurable(t *testing.T) {
	f := startFleet(t, mocks(1, 1, 0), func(c *config.Config) { c.Limits.MaxHeaderBytes = 8 << 10 })
	resp := f.post("/v1/chat/completions", chatBody, "x-pad", strings.Repeat("p", 10<<10))
	assert.Contains(t, readAll(t, resp), "(8192 bytes)")
	assert.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)
}
