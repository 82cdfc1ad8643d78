// Package etcdtest runs a real etcd (Debian's etcd-server binary) on
// loopback for tests, or skips the test where it is not installed
// (.ci/run installs it), and records what discovery tells a target.
package etcdtest

import (
	"errors"
	"maps"
	"slices"
	"sync"
	"testing"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/discovery/etcdlocal"
	"github.com/stretchr/testify/require"
)

// Server is a running etcd of one member.
type Server struct {
	*etcdlocal.Process
	t testing.TB
}

// Start starts etcd for the test and stops it at its end; it skips the
// test when etcd is not installed.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartTLS(t, nil)
}

// StartTLS is Start with the clients served over TLS as tls says (nil:
// plain).
func StartTLS(t testing.TB, tls *etcdlocal.TLS) *Server {
	t.Helper()
	p, err := etcdlocal.StartTLS(t.TempDir(), tls)
	if errors.Is(err, etcdlocal.ErrNotInstalled) {
		t.Skip("etcd not installed (Debian package etcd-server; .ci/run installs it)")
	}
	require.NoError(t, err)
	t.Cleanup(p.Stop)
	return &Server{Process: p, t: t}
}

// Restart starts a stopped etcd again on the same ports and data.
func (s *Server) Restart() {
	s.t.Helper()
	require.NoError(s.t, s.Process.Restart())
}

// Recorder is a discovery target that keeps what it was told.
type Recorder struct {
	mu      sync.Mutex
	put     map[uint64]dataplane.WorkerSpec
	drained []uint64
	down    map[uint64]bool
	settled []Settling
}

// Settling is one wait of the watcher for workers it put to be ready
// (discovery.Settler).
type Settling struct {
	Drained int      // how many drains came before it
	IDs     []uint64 // the workers it waited for, sorted
}

// Settle records that the watcher waited for the workers ids to be ready
// (discovery.Settler), after the drains so far.
func (r *Recorder) Settle(ids []uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.settled = append(r.settled, Settling{Drained: len(r.drained), IDs: slices.Sorted(slices.Values(ids))})
}

// Settled returns the watcher's waits for the workers it put.
func (r *Recorder) Settled() []Settling {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.settled)
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

// SetDown records a worker put down or back.
func (r *Recorder) SetDown(id uint64, down bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down == nil {
		r.down = map[uint64]bool{}
	}
	r.down[id] = down
}

// Down returns the last down or back each worker was told, by id.
func (r *Recorder) Down() map[uint64]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.down)
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
