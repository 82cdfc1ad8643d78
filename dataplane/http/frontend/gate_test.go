package frontend

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A process out of file descriptors (a flood of connections reached its
// open-files limit) cannot accept a connection; the kernel keeps it queued.
// The gate waits and accepts again, as nginx and net/http do, rather than
// stop serving for good: once descriptors are free, the connection that
// waited meanwhile is served.
func TestTheGateAcceptsAgainOnceFilesAreFree(t *testing.T) {
	addr := rawWorker(t, 0, func(int) []string {
		return []string{"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"}
	})
	_, s, url := serveOne(t, addr, Options{}, nil)
	front := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/v1/chat/completions")
	ask := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", front)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		_, err = io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
		require.NoError(t, err)
		return c
	}
	answered := func(c net.Conn) {
		t.Helper()
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "{}", string(body))
	}
	// A first request opens the worker's connection (kept for the next),
	// so that only the client's connection needs a descriptor below.
	answered(ask())

	// The limit a little above what is open once the descriptors that
	// earlier tests' connections held are closed, and every descriptor
	// under it taken but the one the client's socket takes; any that
	// frees meanwhile is taken too (topUp).
	var lim syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim))
	low := lim
	low.Cur = uint64(settledDescriptors(t) + 16)
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low))
	var taken []int
	topUp := func() {
		for {
			fd, err := syscall.Dup(0)
			if err != nil {
				require.ErrorIs(t, err, syscall.EMFILE)
				return
			}
			taken = append(taken, fd)
		}
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim))
			for _, fd := range taken {
				_ = syscall.Close(fd)
			}
		}
	}
	defer restore()
	topUp()
	require.NotEmpty(t, taken)
	_ = syscall.Close(taken[len(taken)-1])
	taken = taken[:len(taken)-1]
	c := ask()
	require.Eventually(t, func() bool {
		topUp()
		return s.metrics.acceptShortages.Value() > 0
	}, 2*time.Second, 5*time.Millisecond, "the accept ran into the limit")
	restore()
	answered(c) // the client's connection, queued meanwhile, is served
}

// settledDescriptors returns how many descriptors the process has open once
// the count stays the same for 50 ms (closes that other tests' ends of
// their connections started are done).
func settledDescriptors(t *testing.T) int {
	count := func() int {
		open, err := os.ReadDir("/proc/self/fd")
		require.NoError(t, err)
		return len(open) - 1 // less the listing's own
	}
	n := count()
	for range 40 {
		time.Sleep(50 * time.Millisecond)
		m := count()
		if m == n {
			break
		}
		n = m
	}
	return n
}
