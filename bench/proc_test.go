package bench

import (
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
