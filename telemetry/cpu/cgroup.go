package cpu

import (
	"fmt"
	"time"
)

// CgroupUsage follows the CPU use of one cgroup v2 directory, such as a
// co-located CPU inference worker's (`cgroup_path`): the idle share of the
// CPU time it may use, its cpu.max quota or else every host CPU. It is used
// by one goroutine.
type CgroupUsage struct {
	dir      string
	hostCPUs float64
	prev     time.Duration // usage at the previous reading
	at       time.Time
	primed   bool
}

// NewCgroupUsage follows dir; hostCPUs is what an unlimited cgroup may use.
func NewCgroupUsage(dir string, hostCPUs int) *CgroupUsage {
	return &CgroupUsage{dir: dir, hostCPUs: float64(max(hostCPUs, 1))}
}

// Dir returns the followed directory.
func (c *CgroupUsage) Dir() string { return c.dir }

// Refresh reads the cgroup at now and returns its idle share since the
// previous reading; ok is false on the first reading (a share needs two).
func (c *CgroupUsage) Refresh(now time.Time) (idle float64, ok bool, err error) {
	st, err := ReadCgroupStat(c.dir)
	if err != nil {
		return 0, false, fmt.Errorf("cgroup %s: %w", c.dir, err)
	}
	q, err := ReadCgroupQuota(c.dir)
	if err != nil {
		return 0, false, fmt.Errorf("cgroup %s: %w", c.dir, err)
	}
	idle, ok = c.Observe(now, st.Usage, q)
	return idle, ok, nil
}

// Observe takes a reading already made (the cgroup's usage_usec and
// quota at now) and returns the idle share since the previous one.
func (c *CgroupUsage) Observe(now time.Time, usage time.Duration, q Quota) (idle float64, ok bool) {
	prev, at, primed := c.prev, c.at, c.primed
	c.prev, c.at, c.primed = usage, now, true
	dt := now.Sub(at).Seconds()
	if !primed || dt <= 0 || usage < prev {
		return 0, false
	}
	cpus := c.hostCPUs
	if !q.Unlimited && q.CPUs > 0 {
		cpus = q.CPUs
	}
	used := (usage - prev).Seconds() / (cpus * dt)
	return min(max(1-used, 0), 1), true
}
