package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of /proc/<pid>/stat's CPU times (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// procTree lists pid and its descendants (nginx's workers, say) from /proc.
func procTree(pid int) []int {
	parents := map[int][]int{}
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		child, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if f := statFields(child); len(f) > 1 {
			if ppid, err := strconv.Atoi(f[1]); err == nil {
				parents[ppid] = append(parents[ppid], child)
			}
		}
	}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, parents[out[i]]...)
	}
	return out
}

// statFields returns the fields of /proc/<pid>/stat after the command name
// (state is field 0, ppid 1, utime 11, stime 12), or nil.
func statFields(pid int) []string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(b[i+1:]))
}

// cpuTime is a process tree's CPU time, its user-space and kernel parts.
type cpuTime struct{ user, system time.Duration }

// total is the user plus system time.
func (c cpuTime) total() time.Duration { return c.user + c.system }

// treeCPU is the CPU time of pid and its descendants; zero for pid 0 (no
// process: the direct runs).
func treeCPU(pid int) cpuTime {
	var c cpuTime
	if pid == 0 {
		return c
	}
	for _, p := range procTree(pid) {
		f := statFields(p)
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		c.user += time.Duration(u) * clockTick
		c.system += time.Duration(s) * clockTick
	}
	return c
}

// treePeakRSS is the sum of the peak resident sets (VmHWM) of pid and its
// descendants, in bytes.
func treePeakRSS(pid int) int64 { return treeStatus(pid, "VmHWM:") }

// treeStatus sums one kB field of /proc/<pid>/status (VmHWM:, VmRSS:) over
// pid and its descendants, in bytes.
func treeStatus(pid int, field string) int64 {
	var total int64
	for _, p := range procTree(pid) {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p), "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, field); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				total += kb << 10
			}
		}
	}
	return total
}
