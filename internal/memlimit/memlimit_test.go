package memlimit

import (
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"github.com/fastroute/fastroute/internal/filetree"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	v2Mount     = "30 22 0:27 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
	procMount   = "22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:5 - proc proc rw\n"
	hybridMount = "30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n" +
		"31 30 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n" +
		"34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n" +
		"40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
	hybridGroups = "9:name=systemd:/\n4:memory:/process_api/9f23\n1:cpu:/\n0::/\n"
)

func TestAContainersOwnCgroupV2Limit(t *testing.T) {
	root := filetree.Write(t, map[string]string{
		"proc/self/mountinfo":       procMount + v2Mount,
		"proc/self/cgroup":          "0::/\n",
		"sys/fs/cgroup/memory.max":  "536870912\n",
		"sys/fs/cgroup/cpu.max":     "max 100000\n",
		"sys/fs/cgroup/other/stray": "",
	})
	lim, ok, err := Read(root)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, int64(512<<20), lim.Bytes)
	assert.Equal(t, filepath.Join(root, "sys/fs/cgroup/memory.max"), lim.File)
}

// readLimit reads the limit of the cgroup files describe, which sets one.
func readLimit(t *testing.T, files map[string]string) Limit {
	t.Helper()
	lim, ok, err := Read(filetree.Write(t, files))
	require.NoError(t, err)
	require.True(t, ok)
	return lim
}

// On the host's namespace the limit may be set on a parent (a slice)
// rather than on the service's own cgroup: the tightest counts.
func TestTheTightestOfTheCgroupAndItsAncestors(t *testing.T) {
	files := map[string]string{
		"proc/self/mountinfo":                                  v2Mount,
		"proc/self/cgroup":                                     "0::/system.slice/router.service\n",
		"sys/fs/cgroup/system.slice/memory.max":                "1073741824\n",
		"sys/fs/cgroup/system.slice/router.service/memory.max": "max\n",
	}
	lim := readLimit(t, files)
	assert.Equal(t, int64(1<<30), lim.Bytes, "the slice's")
	assert.True(t, strings.HasSuffix(lim.File, "system.slice/memory.max"), lim.File)

	files["sys/fs/cgroup/system.slice/router.service/memory.max"] = "268435456\n"
	lim = readLimit(t, files)
	assert.Equal(t, int64(256<<20), lim.Bytes, "the service's own, tighter")

	files["sys/fs/cgroup/system.slice/memory.max"] = "max\n"
	files["sys/fs/cgroup/system.slice/router.service/memory.max"] = "max\n"
	_, ok, err := Read(filetree.Write(t, files))
	require.NoError(t, err)
	assert.False(t, ok, "none set")
}

// cgroup v2's memory.high (systemd's MemoryHigh=, Kubernetes' memory QoS)
// is where the kernel starts throttling the cgroup's allocations: the
// tighter of it and memory.max counts, on the cgroup or an ancestor.
func TestMemoryHighIsALimitToo(t *testing.T) {
	files := map[string]string{
		"proc/self/mountinfo":                                   v2Mount,
		"proc/self/cgroup":                                      "0::/system.slice/router.service\n",
		"sys/fs/cgroup/system.slice/memory.max":                 "1073741824\n",
		"sys/fs/cgroup/system.slice/memory.high":                "max\n",
		"sys/fs/cgroup/system.slice/router.service/memory.max":  "max\n",
		"sys/fs/cgroup/system.slice/router.service/memory.high": "805306368\n",
	}
	lim := readLimit(t, files)
	assert.Equal(t, int64(768<<20), lim.Bytes, "the service's memory.high, under the slice's memory.max")
	assert.True(t, strings.HasSuffix(lim.File, "router.service/memory.high"), lim.File)

	files["sys/fs/cgroup/system.slice/memory.high"] = "536870912\n"
	lim = readLimit(t, files)
	assert.Equal(t, int64(512<<20), lim.Bytes, "the slice's memory.high, tighter still")

	files["sys/fs/cgroup/system.slice/router.service/memory.high"] = "lots\n"
	_, _, err := Read(filetree.Write(t, files))
	assert.ErrorContains(t, err, "router.service/memory.high: \"lots\" is not a limit in bytes")
}

// A container without a cgroup namespace of its own sees the host's
// paths in /proc/self/cgroup and a mount of its own cgroup only; a cgroup
// the mount does not show (the process moved) reads the mount's.
func TestAMountOfAGroupBelowTheRoot(t *testing.T) {
	const mount = "30 22 0:27 /docker/abc /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw\n"
	for group, files := range map[string]map[string]string{
		"0::/docker/abc/worker\n": {"sys/fs/cgroup/worker/memory.max": "max\n"},
		"0::/elsewhere\n":         {},
	} {
		files["proc/self/mountinfo"], files["proc/self/cgroup"] = mount, group
		files["sys/fs/cgroup/memory.max"] = "2147483648\n"
		lim, ok, err := Read(filetree.Write(t, files))
		require.NoError(t, err, group)
		require.True(t, ok, group)
		assert.Equal(t, int64(2<<30), lim.Bytes, group)
	}
}

// cgroup v1 (and the hybrid layout, whose v2 hierarchy has no memory
// controller): memory.limit_in_bytes of the memory hierarchy, whose
// largest values mean none.
func TestCgroupV1Limits(t *testing.T) {
	files := map[string]string{
		"proc/self/mountinfo":                                            hybridMount,
		"proc/self/cgroup":                                               hybridGroups,
		"sys/fs/cgroup/unified/cgroup.procs":                             "1\n",
		"sys/fs/cgroup/memory/memory.limit_in_bytes":                     "9223372036854771712\n",
		"sys/fs/cgroup/memory/process_api/9f23/memory.limit_in_bytes":    "9223372036854771712\n",
		"sys/fs/cgroup/memory/process_api/memory.limit_in_bytes":         "9223372036854771712\n",
		"sys/fs/cgroup/memory/process_api/9f23/memory.usage_in_bytes":    "1000\n",
		"sys/fs/cgroup/memory/process_api/9f23/memory.soft_limit_in_byt": "0\n",
	}
	_, ok, err := Read(filetree.Write(t, files))
	require.NoError(t, err)
	assert.False(t, ok, "unlimited")

	files["sys/fs/cgroup/memory/process_api/9f23/memory.limit_in_bytes"] = "805306368\n"
	lim, ok, err := Read(filetree.Write(t, files))
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, int64(768<<20), lim.Bytes)
	assert.True(t, strings.HasSuffix(lim.File, "memory/process_api/9f23/memory.limit_in_bytes"), lim.File)
}

func TestNoCgroupAndBadFiles(t *testing.T) {
	_, ok, err := Read(filetree.Write(t, map[string]string{"proc/self/mountinfo": procMount, "proc/self/cgroup": "0::/\n"}))
	require.NoError(t, err)
	assert.False(t, ok, "no cgroup hierarchy mounted")

	_, _, err = Read(filetree.Write(t, map[string]string{
		"proc/self/mountinfo":      v2Mount,
		"proc/self/cgroup":         "0::/\n",
		"sys/fs/cgroup/memory.max": "lots\n",
	}))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "sys/fs/cgroup/memory.max")
	assert.Contains(t, err.Error(), `"lots" is not a limit in bytes`)

	_, _, err = Read(t.TempDir())
	assert.ErrorIs(t, err, os.ErrNotExist, "no /proc")
}

// A mount point with a space in it is escaped in mountinfo.
func TestEscapedMountPoint(t *testing.T) {
	lim, ok, err := Read(filetree.Write(t, map[string]string{
		"proc/self/mountinfo":   `30 22 0:27 / /cg\040root rw - cgroup2 cgroup2 rw` + "\n",
		"proc/self/cgroup":      "0::/\n",
		"cg root/memory.max":    "4096\n",
		"cg root/memory.events": "",
	}))
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, int64(4096), lim.Bytes)
}

// This machine's own files read without error, and a limit found is the
// number its file holds.
func TestThisProcessCgroup(t *testing.T) {
	lim, ok, err := Read("/")
	require.NoError(t, err)
	if !ok {
		t.Log("no cgroup memory limit on this machine")
		return
	}
	data, err := os.ReadFile(lim.File)
	require.NoError(t, err)
	assert.Equal(t, strconv.FormatInt(lim.Bytes, 10), strings.TrimSpace(string(data)))
}

func TestTheSoftLimitFollowsTheCgroupsUnlessGOMEMLIMITIsSet(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	files := map[string]string{
		"proc/self/mountinfo":      v2Mount,
		"proc/self/cgroup":         "0::/\n",
		"sys/fs/cgroup/memory.max": "1073741824\n",
	}
	root := filetree.Write(t, files)
	l := &Limiter{Root: root, Getenv: func(string) string { return "" }}

	soft, lim, changed, err := l.Apply()
	require.NoError(t, err)
	assert.True(t, changed)
	assert.Equal(t, int64(1<<30), lim.Bytes)
	assert.Equal(t, int64(float64(lim.Bytes)*Ratio), soft)
	assert.InDelta(t, 0.9*(1<<30), float64(soft), 1)
	assert.Equal(t, soft, debug.SetMemoryLimit(-1), "the runtime's soft limit")
	_, _, changed, err = l.Apply()
	require.NoError(t, err)
	assert.False(t, changed, "the same limit read again")

	// Resized while it runs: the soft limit follows; lifted: none again.
	memMax := filepath.Join(root, "sys/fs/cgroup/memory.max")
	resized := int64(512 << 20)
	require.NoError(t, os.WriteFile(memMax, []byte("536870912\n"), 0o644))
	soft, _, changed, err = l.Apply()
	require.NoError(t, err)
	assert.True(t, changed)
	assert.Equal(t, int64(float64(resized)*Ratio), soft)
	assert.Equal(t, soft, debug.SetMemoryLimit(-1))
	require.NoError(t, os.WriteFile(memMax, []byte("bad\n"), 0o644))
	soft, _, changed, err = l.Apply()
	require.Error(t, err)
	assert.False(t, changed, "a limit that cannot be read changes nothing")
	assert.Equal(t, int64(float64(resized)*Ratio), soft)
	require.NoError(t, os.WriteFile(memMax, []byte("max\n"), 0o644))
	soft, _, changed, err = l.Apply()
	require.NoError(t, err)
	assert.True(t, changed)
	assert.Zero(t, soft)
	assert.Equal(t, int64(math.MaxInt64), debug.SetMemoryLimit(-1), "lifted")

	// The operator's GOMEMLIMIT stands, "off" included.
	require.NoError(t, os.WriteFile(memMax, []byte("1073741824\n"), 0o644))
	env := &Limiter{Root: root, Getenv: func(k string) string { return map[string]string{"GOMEMLIMIT": "off"}[k] }}
	soft, _, changed, err = env.Apply()
	require.NoError(t, err)
	assert.False(t, changed)
	assert.Zero(t, soft)
	assert.Equal(t, int64(math.MaxInt64), debug.SetMemoryLimit(-1))

	// No limit at first: none set.
	none := &Limiter{Root: filetree.Write(t, map[string]string{"proc/self/mountinfo": v2Mount, "proc/self/cgroup": "0::/\n"}), Getenv: func(string) string { return "" }}
	soft, _, changed, err = none.Apply()
	require.NoError(t, err)
	assert.False(t, changed)
	assert.Zero(t, soft)
	assert.Equal(t, int64(math.MaxInt64), debug.SetMemoryLimit(-1))
}

// A cgroup made for the test with a limit of its own: a process started
// in it reads that limit from the kernel's own files. Skipped where the
// test cannot make one (no memory controller mounted writable, not
// root, a cgroup v2 parent that cannot take a process).
func TestARealCgroupsLimit(t *testing.T) {
	if os.Getenv("FASTROUTE_MEMLIMIT_HELPER") != "" {
		t.Skip("the helper's own run")
	}
	found, err := placements("/")
	require.NoError(t, err)
	var dir, file string
	for _, p := range found {
		// A cgroup with the hierarchy's limit file has the memory
		// controller, and so has a cgroup made below it.
		if _, err := os.Stat(filepath.Join(p.mount, p.group, p.files[0])); err == nil {
			dir, file = filepath.Join(p.mount, p.group, "fastroute-test-"+strconv.Itoa(os.Getpid())), p.files[0]
			break
		}
	}
	if dir == "" {
		t.Skip("no memory cgroup hierarchy mounted")
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot make a cgroup: %v", err)
	}
	t.Cleanup(func() { _ = os.Remove(dir) })
	if err := os.WriteFile(filepath.Join(dir, file), []byte("268435456"), 0o644); err != nil {
		t.Skipf("cannot set the cgroup's limit: %v", err)
	}
	self, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command("sh", "-c", `echo $$ > "$1/cgroup.procs" || exit 3; exec "$0" -test.run '^TestHelperReadsItsCgroup$' -test.v`, self, dir)
	cmd.Env = append(os.Environ(), "FASTROUTE_MEMLIMIT_HELPER=1")
	out, err := cmd.CombinedOutput()
	if exit, ok := errors.AsType[*exec.ExitError](err); ok && exit.ExitCode() == 3 {
		t.Skipf("cannot move a process into the cgroup: %s", out)
	}
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "limit 268435456 from "+filepath.Join(dir, file)+"\n")
}

// The helper of TestARealCgroupsLimit, run in the cgroup it made.
func TestHelperReadsItsCgroup(t *testing.T) {
	if os.Getenv("FASTROUTE_MEMLIMIT_HELPER") == "" {
		t.Skip("run by TestARealCgroupsLimit")
	}
	lim, ok, err := Read("/")
	require.NoError(t, err)
	require.True(t, ok)
	fmt.Printf("limit %d from %s\n", lim.Bytes, lim.File)
}
