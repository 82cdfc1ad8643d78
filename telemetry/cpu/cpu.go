// Package cpu reads CPU telemetry from procfs and cgroup v2 without cgo:
// /proc/stat deltas (idle share) and the cgroup's cpu.max quota and cpu.stat
// usage and throttling — what the weights use, nothing more (the load
// average and memory were read every tick for no reader and are gone).
// Every reader takes a root path, so tests run against fixture trees and
// production reads "/".
package cpu

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Times are the aggregate jiffies of the "cpu" line of /proc/stat.
type Times struct {
	Total, Idle uint64 // idle includes iowait
}

// ReadStat parses the aggregate cpu line of root/proc/stat.
func ReadStat(root string) (Times, error) {
	data, err := os.ReadFile(filepath.Join(root, "proc/stat"))
	if err != nil {
		return Times{}, err
	}
	line, _, _ := bytes.Cut(data, []byte("\n"))
	fields := strings.Fields(string(line))
	if len(fields) < 5 || fields[0] != "cpu" {
		return Times{}, fmt.Errorf("proc/stat: first line %q is not the aggregate cpu line", line)
	}
	var t Times
	for i, f := range fields[1:] {
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return Times{}, fmt.Errorf("proc/stat: field %d: %v", i+1, err)
		}
		if i == 7 || i == 8 { // guest and guest_nice are already counted in user and nice
			continue
		}
		t.Total += v
		if i == 3 || i == 4 { // idle, iowait
			t.Idle += v
		}
	}
	return t, nil
}

// IdleShare returns the idle fraction between two readings (0..1).
func IdleShare(prev, cur Times) (float64, bool) {
	if cur.Total <= prev.Total || cur.Idle < prev.Idle {
		return 0, false
	}
	return float64(cur.Idle-prev.Idle) / float64(cur.Total-prev.Total), true
}

// Quota is a cgroup v2 cpu.max: Max CPUs' worth of time per period, or
// unlimited.
type Quota struct {
	Unlimited bool
	CPUs      float64 // quota / period
}

// ReadQuota parses root/sys/fs/cgroup/cpu.max ("max 100000" or "50000 100000").
// A missing file (no cgroup v2 controller) reads as unlimited.
func ReadQuota(root string) (Quota, error) {
	return ReadCgroupQuota(filepath.Join(root, "sys/fs/cgroup"))
}

// ReadCgroupQuota parses the cpu.max of the cgroup v2 directory dir; a
// missing file reads as unlimited.
func ReadCgroupQuota(dir string) (Quota, error) {
	data, err := os.ReadFile(filepath.Join(dir, "cpu.max"))
	if errors.Is(err, os.ErrNotExist) {
		return Quota{Unlimited: true}, nil
	}
	if err != nil {
		return Quota{}, err
	}
	fields := strings.Fields(string(data))
	if len(fields) != 2 {
		return Quota{}, fmt.Errorf("cpu.max: %q is not \"quota period\"", data)
	}
	period, err := strconv.ParseFloat(fields[1], 64)
	if err != nil || period <= 0 {
		return Quota{}, fmt.Errorf("cpu.max: period %q is not a positive number", fields[1])
	}
	if fields[0] == "max" {
		return Quota{Unlimited: true}, nil
	}
	q, err := strconv.ParseFloat(fields[0], 64)
	if err != nil || q <= 0 {
		return Quota{}, fmt.Errorf("cpu.max: quota %q is not a positive number", fields[0])
	}
	return Quota{CPUs: q / period}, nil
}

// Throttling is the cgroup v2 cpu.stat counters: CPU time used by the
// cgroup and how often its quota throttled it.
type Throttling struct {
	Usage              time.Duration
	Periods, Throttled uint64
	ThrottledTime      time.Duration
}

// ReadThrottling parses usage_usec, nr_periods, nr_throttled and throttled_usec from
// root/sys/fs/cgroup/cpu.stat; a missing file reads as zero.
func ReadThrottling(root string) (Throttling, error) {
	t, err := ReadCgroupStat(filepath.Join(root, "sys/fs/cgroup"))
	if errors.Is(err, os.ErrNotExist) {
		return Throttling{}, nil
	}
	return t, err
}

// ReadCgroupStat parses the cpu.stat of the cgroup v2 directory dir.
func ReadCgroupStat(dir string) (Throttling, error) {
	data, err := os.ReadFile(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		return Throttling{}, err
	}
	var t Throttling
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return Throttling{}, fmt.Errorf("cpu.stat: %s: %v", k, err)
		}
		switch k {
		case "usage_usec":
			t.Usage = time.Duration(n) * time.Microsecond
		case "nr_periods":
			t.Periods = n
		case "nr_throttled":
			t.Throttled = n
		case "throttled_usec":
			t.ThrottledTime = time.Duration(n) * time.Microsecond
		}
	}
	return t, nil
}

// Sample is one published CPU reading.
type Sample struct {
	At        time.Time
	IdleRatio float64 // idle share of the host CPUs since the previous sample
	// Idle is the idle share of the CPU this cgroup may use: of its cpu.max
	// quota where one is set (from cpu.stat usage), else IdleRatio.
	Idle       float64
	Quota      Quota
	Throttling Throttling
}

// Collector samples CPU state on demand and publishes the latest Sample
// through an atomic pointer, so readers never block.
type Collector struct {
	root   string
	cgroup *CgroupUsage // this process tree's cgroup: the idle share of a quota
	prev   Times
	primed bool // prev holds a reading
	latest atomic.Pointer[Sample]
}

// NewCollector returns a collector reading under root ("/" in production).
func NewCollector(root string) *Collector {
	return &Collector{root: root, cgroup: NewCgroupUsage(filepath.Join(root, "sys/fs/cgroup"), runtime.NumCPU())}
}

// Latest returns the newest sample, or nil before the second Refresh (an
// idle share needs two /proc/stat readings).
func (c *Collector) Latest() *Sample { return c.latest.Load() }

// Refresh takes one reading. It is called by one goroutine at a time.
func (c *Collector) Refresh(now time.Time) error {
	cur, err := ReadStat(c.root)
	if err != nil {
		return err
	}
	prev, primed := c.prev, c.primed
	c.prev, c.primed = cur, true
	idle, ok := IdleShare(prev, cur)
	if !primed || !ok {
		return nil
	}
	s := &Sample{At: now, IdleRatio: idle}
	if s.Quota, err = ReadQuota(c.root); err != nil {
		return err
	}
	if s.Throttling, err = ReadThrottling(c.root); err != nil {
		return err
	}
	s.Idle = s.IdleRatio
	if idle, ok := c.cgroup.Observe(now, s.Throttling.Usage, s.Quota); ok && !s.Quota.Unlimited && s.Quota.CPUs > 0 {
		s.Idle = idle
	}
	c.latest.Store(s)
	return nil
}
