package cpu

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fastroute/fastroute/internal/filetree"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFixtureTree(t *testing.T) {
	root := filetree.Write(t, map[string]string{
		"proc/stat":              "cpu  100 0 50 800 50 0 0 0 7 0\ncpu0 1 2 3 4\n",
		"sys/fs/cgroup/cpu.max":  "50000 100000\n",
		"sys/fs/cgroup/cpu.stat": "usage_usec 1000\nnr_periods 40\nnr_throttled 10\nthrottled_usec 2500\n",
	})
	st, err := ReadStat(root)
	require.NoError(t, err)
	assert.Equal(t, Times{Total: 1000, Idle: 850}, st, "guest is not counted twice")
	q, err := ReadQuota(root)
	require.NoError(t, err)
	assert.Equal(t, Quota{CPUs: 0.5}, q)
	th, err := ReadThrottling(root)
	require.NoError(t, err)
	assert.Equal(t, Throttling{Usage: time.Millisecond, Periods: 40, Throttled: 10, ThrottledTime: 2500 * time.Microsecond}, th)
}

func TestMissingCgroupIsUnlimited(t *testing.T) {
	root := filetree.Write(t, map[string]string{"proc/stat": "cpu 1 1 1 1 1\n"})
	q, err := ReadQuota(root)
	require.NoError(t, err)
	assert.True(t, q.Unlimited)
	th, err := ReadThrottling(root)
	require.NoError(t, err)
	assert.Zero(t, th)
	root = filetree.Write(t, map[string]string{"sys/fs/cgroup/cpu.max": "max 100000\n"})
	q, err = ReadQuota(root)
	require.NoError(t, err)
	assert.True(t, q.Unlimited)
}

func TestMalformedFilesGiveClearErrors(t *testing.T) {
	for name, c := range map[string]struct{ file, body, want string }{
		"stat":    {"proc/stat", "intr 1 2 3\n", "not the aggregate cpu line"},
		"statnum": {"proc/stat", "cpu 1 x 3 4 5\n", "field 2"},
		"max":     {"sys/fs/cgroup/cpu.max", "50000\n", "is not \"quota period\""},
		"period":  {"sys/fs/cgroup/cpu.max", "5 0\n", "period"},
		"cpustat": {"sys/fs/cgroup/cpu.stat", "nr_periods many\n", "nr_periods"},
	} {
		root := filetree.Write(t, map[string]string{c.file: c.body})
		var err error
		switch c.file {
		case "proc/stat":
			_, err = ReadStat(root)
		case "sys/fs/cgroup/cpu.max":
			_, err = ReadQuota(root)
		default:
			_, err = ReadThrottling(root)
		}
		assert.ErrorContains(t, err, c.want, name)
	}
}

func TestCollectorIdleShareFromDeltas(t *testing.T) {
	files := map[string]string{
		"proc/stat": "cpu 100 0 100 700 100 0 0 0 0 0\n",
	}
	root := filetree.Write(t, files)
	c := NewCollector(root)
	require.NoError(t, c.Refresh(time.Now()))
	assert.Nil(t, c.Latest(), "one reading gives no delta")
	// +300 busy jiffies, +100 idle: 25% idle over the interval.
	require.NoError(t, os.WriteFile(filepath.Join(root, "proc/stat"), []byte("cpu 300 0 200 750 150 0 0 0 0 0\n"), 0o644))
	require.NoError(t, c.Refresh(time.Now()))
	s := c.Latest()
	require.NotNil(t, s)
	assert.InDelta(t, 0.25, s.IdleRatio, 1e-9)
	assert.True(t, s.Quota.Unlimited)
	assert.Equal(t, s.IdleRatio, s.Idle, "without a quota the host idle share counts")
}

// With a quota of 2 CPUs, a cgroup that used 0.5 s of CPU in 1 s is 75% idle
// whatever the host does.
func TestCollectorIdleShareOfQuota(t *testing.T) {
	root := filetree.Write(t, map[string]string{
		"proc/stat":              "cpu 100 0 100 700 100 0 0 0 0 0\n",
		"sys/fs/cgroup/cpu.max":  "200000 100000\n",
		"sys/fs/cgroup/cpu.stat": "usage_usec 1000000\n",
	})
	stat := func(body string) {
		require.NoError(t, os.WriteFile(filepath.Join(root, "proc/stat"), []byte(body), 0o644))
	}
	c := NewCollector(root)
	t0 := time.Unix(1000, 0)
	require.NoError(t, c.Refresh(t0))
	stat("cpu 300 0 200 750 150 0 0 0 0 0\n")
	require.NoError(t, c.Refresh(t0.Add(time.Second)))
	require.Equal(t, c.Latest().IdleRatio, c.Latest().Idle, "no usage delta yet")
	stat("cpu 400 0 300 760 160 0 0 0 0 0\n")
	require.NoError(t, os.WriteFile(filepath.Join(root, "sys/fs/cgroup/cpu.stat"), []byte("usage_usec 1500000\n"), 0o644))
	require.NoError(t, c.Refresh(t0.Add(2*time.Second)))
	assert.InDelta(t, 0.75, c.Latest().Idle, 1e-9)
	assert.InDelta(t, 20.0/220, c.Latest().IdleRatio, 1e-9, "host idle differs")
}

// TestRealProc reads this machine's /proc: the parsers must accept the real format.
func TestRealProc(t *testing.T) {
	if _, err := os.Stat("/proc/stat"); err != nil {
		t.Skip("no /proc on this system")
	}
	c := NewCollector("/")
	require.NoError(t, c.Refresh(time.Now()))
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, c.Refresh(time.Now()))
	if s := c.Latest(); s != nil { // nil only if no jiffy passed
		assert.GreaterOrEqual(t, s.IdleRatio, 0.0)
		assert.LessOrEqual(t, s.IdleRatio, 1.0)
	}
}

func TestCgroupUsageIsTheIdleShareOfItsQuota(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644))
	}
	write("cpu.max", "50000 100000\n") // half a CPU
	write("cpu.stat", "usage_usec 1000000\nnr_periods 3\n")
	c := NewCgroupUsage(dir, 8)
	now := time.Unix(10, 0)
	_, ok, err := c.Refresh(now)
	require.NoError(t, err)
	assert.False(t, ok, "a share needs two readings")
	write("cpu.stat", "usage_usec 1400000\nnr_periods 9\n")
	idle, ok, err := c.Refresh(now.Add(time.Second))
	require.NoError(t, err)
	require.True(t, ok)
	assert.InDelta(t, 0.2, idle, 1e-9, "0.4 s used of 0.5 CPU-seconds")

	write("cpu.max", "max 100000\n") // unlimited: all 8 host CPUs
	write("cpu.stat", "usage_usec 3400000\n")
	idle, ok, _ = c.Refresh(now.Add(2 * time.Second))
	require.True(t, ok)
	assert.InDelta(t, 0.75, idle, 1e-9, "2 s used of 8 CPU-seconds")

	_, _, err = NewCgroupUsage(filepath.Join(dir, "missing"), 8).Refresh(now)
	assert.ErrorContains(t, err, "cgroup "+filepath.Join(dir, "missing"))
}
