package weights

import (
	"runtime"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/metrics"
	"github.com/fastroute/fastroute/telemetry/cpu"
)

// CPUReader is the host CPU collector (telemetry/cpu.Collector, or a test
// double).
type CPUReader interface {
	Refresh(now time.Time) error
	Latest() *cpu.Sample
}

// CPUWeight is capacity × idle share (of the cgroup quota where one is set),
// floored at MinShare × capacity.
func CPUWeight(capacity, idle float64) float64 {
	return capacity * max(clamp01(idle), MinShare)
}

// CPU weighs CPU workers by the idle share of their own cgroup's quota:
// the router host's idle share says nothing of one worker (and the same of
// all of them), so it is only exported as a metric.
type CPU struct {
	host    CPUReader
	cgroups map[uint64]*cgroupReading // Refresh's and Weigh's alone (the loop's goroutine)
}

// cgroupReading is the last reading of one CPU worker's cgroup.
type cgroupReading struct {
	usage *cpu.CgroupUsage
	idle  float64
	ok    bool
	err   error
	at    time.Time
}

// NewCPU returns the CPU source; host reads the router host's CPU.
func NewCPU(host CPUReader) *CPU { return &CPU{host: host, cgroups: map[uint64]*cgroupReading{}} }

// Name implements Source.
func (c *CPU) Name() string { return "cpu" }

// Measures implements Source: CPU workers.
func (c *CPU) Measures(s *dataplane.WorkerSpec) bool { return s.Device == dataplane.DeviceCPU }

// Refresh implements Source: the host, then the cgroup of every CPU worker
// that names one (a fresh map drops the workers that left).
func (c *CPU) Refresh(now time.Time, workers []*dataplane.Worker) error {
	err := c.host.Refresh(now)
	next := make(map[uint64]*cgroupReading, len(c.cgroups))
	for _, w := range workers {
		s := w.Spec()
		if !c.Measures(s) || s.CgroupPath == "" {
			continue
		}
		r := c.cgroups[s.ID]
		if r == nil || r.usage.Dir() != s.CgroupPath {
			r = &cgroupReading{usage: cpu.NewCgroupUsage(s.CgroupPath, runtime.NumCPU())}
		}
		r.idle, r.ok, r.err = r.usage.Refresh(now)
		r.at = now
		next[s.ID] = r
	}
	c.cgroups = next
	return err
}

// Weigh implements Source.
func (c *CPU) Weigh(s *dataplane.WorkerSpec, _ time.Time) (float64, time.Time, string) {
	r := c.cgroups[s.ID]
	switch {
	case s.CgroupPath == "":
		return 0, time.Time{}, "no cgroup_path: nothing measures this worker's CPU"
	case r == nil:
		return 0, time.Time{}, "no cgroup reading"
	case r.err != nil:
		return 0, time.Time{}, r.err.Error()
	case !r.ok:
		return 0, time.Time{}, "no cgroup reading yet"
	}
	return CPUWeight(s.Capacity, r.idle), r.at, ""
}

// Collect implements Source: the host's idle share.
func (c *CPU) Collect(w *metrics.Writer) {
	w.Header("fastroute_cpu_idle_ratio", "gauge", "Idle share of the CPU quota (host CPUs without one) at the last reading.")
	if host := c.host.Latest(); host != nil {
		w.Sample("fastroute_cpu_idle_ratio", host.Idle)
	}
}
