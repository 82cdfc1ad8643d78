package bench

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestProcTreeCPUAndRSS(t *testing.T) {
	child := exec.Command("sh", "-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 5")
	require.NoError(t, child.Start())
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	self := os.Getpid()
	assert.True(t, slices.Contains(procTree(self), child.Process.Pid), "the child is in the tree")
	require.Eventually(t, func() bool { return treeCPU(child.Process.Pid).user >= 2*clockTick }, 10*time.Second, 20*time.Millisecond,
		"the child's busy loop shows as user CPU time")
	assert.Greater(t, treePeakRSS(self), int64(1<<20), "this test process holds more than 1 MiB")
	assert.Zero(t, treeCPU(0).total(), "no process, no CPU (direct runs)")
}

// A child that does not come up says why: the wait's error ends with what
// it wrote, here the router's refusal of a listen address already taken,
// the failure that otherwise reads as "connection refused" for ten
// seconds.
func TestAChildThatDoesNotComeUpSaysWhy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	p, err := spawn(buildBinary(t), "serve", "--listen", taken.Addr().String(), "--admin-listen", "127.0.0.1:0",
		"--worker", "id=1,url=http://127.0.0.1:9")
	require.NoError(t, err)
	require.Error(t, p.Wait(), "the router exits")
	err = notUp(errors.New("not ready in time"), p)
	assert.ErrorContains(t, err, "not ready in time")
	assert.ErrorContains(t, err, "fastroute wrote:")
	assert.ErrorContains(t, err, "address already in use")
	assert.Equal(t, errors.New("not ready in time"), notUp(errors.New("not ready in time"), nil), "no child: the error as it was")
}
