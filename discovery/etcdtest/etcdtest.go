// Package etcdtest runs a real etcd (Debian's etcd-server binary) on
// loopback for tests, or skips the test where it is not installed
// (.ci/run installs it).
package etcdtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/stretchr/testify/require"
)

// Server is a running etcd of one member.
type Server struct {
	// Endpoint is its client address, host:port.
	Endpoint string
	t        testing.TB
	dir      string
	peer     string
	cmd      *exec.Cmd
	stopped  chan struct{}
	starts   int
}

func freePort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

// Start starts etcd for the test and stops it at its end; it skips the
// test when etcd is not installed.
func Start(t testing.TB) *Server {
	t.Helper()
	if _, err := exec.LookPath("etcd"); err != nil {
		t.Skip("etcd not installed (Debian package etcd-server; .ci/run installs it)")
	}
	s := &Server{t: t, dir: t.TempDir(), Endpoint: freePort(t), peer: freePort(t)}
	s.Restart()
	t.Cleanup(s.Stop)
	return s
}

// Restart starts a stopped etcd again on the same ports and data.
func (s *Server) Restart() {
	s.t.Helper()
	s.starts++
	s.cmd = exec.Command("etcd", "--name", "t", "--data-dir", filepath.Join(s.dir, "data"),
		"--listen-client-urls", "http://"+s.Endpoint, "--advertise-client-urls", "http://"+s.Endpoint,
		"--listen-peer-urls", "http://"+s.peer, "--initial-advertise-peer-urls", "http://"+s.peer,
		"--initial-cluster", "t=http://"+s.peer)
	log, err := os.Create(filepath.Join(s.dir, fmt.Sprintf("etcd-%d.log", s.starts)))
	require.NoError(s.t, err)
	s.cmd.Stdout, s.cmd.Stderr = log, log
	require.NoError(s.t, s.cmd.Start())
	stopped := make(chan struct{})
	s.stopped = stopped
	cmd := s.cmd
	go func() { _ = cmd.Wait(); log.Close(); close(stopped) }()
	require.Eventually(s.t, func() bool {
		c, err := net.DialTimeout("tcp", s.Endpoint, 100*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "etcd did not start")
}

// Stop kills etcd (a crash, as far as its clients can tell).
func (s *Server) Stop() {
	select {
	case <-s.stopped:
	default:
		_ = s.cmd.Process.Kill()
		<-s.stopped
	}
}

// Recorder is a discovery target that keeps what it was told.
type Recorder struct {
	mu      sync.Mutex
	put     map[uint64]dataplane.WorkerSpec
	drained []uint64
}

// Put records an added or replaced worker.
func (r *Recorder) Put(s dataplane.WorkerSpec) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.put == nil {
		r.put = map[uint64]dataplane.WorkerSpec{}
	}
	r.put[s.ID] = s
	return nil
}

// Drain records a drained worker.
func (r *Recorder) Drain(id uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.drained = append(r.drained, id)
}

// State returns the workers put (last spec by id) and the drains in order.
func (r *Recorder) State() (map[uint64]dataplane.WorkerSpec, []uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	put := map[uint64]dataplane.WorkerSpec{}
	for k, v := range r.put {
		put[k] = v
	}
	return put, append([]uint64(nil), r.drained...)
}
