// Package weights turns device telemetry into the worker weights of the
// device-aware-weighted mode. One goroutine refreshes the GPU and CPU
// collectors every interval, computes each worker's weight, stores it on the
// worker and republishes the registry snapshot once; the request path only
// reads the published weights.
package weights

import (
	"context"
	"log/slog"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/metrics"
	"github.com/fastroute/fastroute/telemetry/cpu"
	"github.com/fastroute/fastroute/telemetry/nvml"
)

// StaleAfter is how many poll periods a reading stays valid; an older one
// decays the weight to the worker's static capacity.
const StaleAfter = 3

// MinShare is the smallest share of its capacity a worker's weight falls to,
// so a saturated device still gets a trickle and the total never reaches 0.
const MinShare = 0.01

// GPUSource is the GPU collector (telemetry/nvml.Collector, or a test double).
type GPUSource interface {
	Refresh(now time.Time) error
	Latest() *nvml.Snapshot
}

// CPUSource is the CPU collector (telemetry/cpu.Collector, or a test double).
type CPUSource interface {
	Refresh(now time.Time) error
	Latest() *cpu.Sample
}

// Options configures a Loop.
type Options struct {
	Registry *dataplane.Registry
	GPU      GPUSource // nil: no GPU telemetry, GPU workers keep their capacity
	CPU      CPUSource // nil: no CPU telemetry, CPU workers keep their capacity
	// NoGPU says why GPU is nil (shown per worker); default "gpu telemetry is off".
	NoGPU    string
	Interval time.Duration
	Logger   *slog.Logger
}

// Source says where a worker's weight came from.
type Source struct {
	Static bool      // true: static capacity (no usable reading)
	Reason string    // why it is static ("" when from telemetry)
	At     time.Time // time of the reading used (zero when static)
}

// GPUWeight is capacity × free SM share × free memory share, floored at
// MinShare × capacity.
func GPUWeight(capacity float64, g nvml.GPU) float64 {
	freeMem := 1.0
	if g.MemoryTotal > 0 {
		freeMem = 1 - float64(g.MemoryUsed)/float64(g.MemoryTotal)
	}
	return capacity * max(clamp01(1-g.Utilization)*clamp01(freeMem), MinShare)
}

// CPUWeight is capacity × idle share (of the cgroup quota where one is set),
// floored at MinShare × capacity.
func CPUWeight(capacity, idle float64) float64 {
	return capacity * max(clamp01(idle), MinShare)
}

func clamp01(v float64) float64 { return min(max(v, 0), 1) }

// Loop owns the weight computation. Tick and Run are meant for one goroutine;
// Describe and the metrics collector may run concurrently with them.
type Loop struct {
	opts Options

	mu        sync.Mutex // guards sources; never taken on the request path
	sources   map[uint64]Source
	fallbacks metrics.Counter // transitions of a worker to its static capacity
	lastGPU   *nvml.Snapshot
	lastCPU   *cpu.Sample
	gpuErr    string // last GPU refresh error, logged once per change
	cpuErr    string
	cgroups   map[uint64]*cgroupReading // CPU workers' own cgroups; Tick's alone
}

// cgroupReading is the last reading of one CPU worker's cgroup.
type cgroupReading struct {
	usage *cpu.CgroupUsage
	idle  float64
	ok    bool
	err   error
	at    time.Time
}

// New returns a Loop; Run (or Tick) starts the refreshing.
func New(o Options) *Loop {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.NoGPU == "" {
		o.NoGPU = "gpu telemetry is off"
	}
	if o.Interval <= 0 {
		o.Interval = 250 * time.Millisecond
	}
	return &Loop{opts: o, sources: map[uint64]Source{}, cgroups: map[uint64]*cgroupReading{}}
}

// Run ticks every Interval until ctx ends.
func (l *Loop) Run(ctx context.Context) {
	t := time.NewTicker(l.opts.Interval)
	defer t.Stop()
	for {
		l.Tick(time.Now())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Tick refreshes the collectors, recomputes every worker's weight as of now
// and republishes the registry snapshot.
func (l *Loop) Tick(now time.Time) {
	var gpu *nvml.Snapshot
	var host *cpu.Sample
	if l.opts.GPU != nil {
		l.noteErr(&l.gpuErr, "gpu", l.opts.GPU.Refresh(now))
		gpu = l.opts.GPU.Latest()
	}
	if l.opts.CPU != nil {
		l.noteErr(&l.cpuErr, "cpu", l.opts.CPU.Refresh(now))
		host = l.opts.CPU.Latest()
	}
	staleBefore := now.Add(-StaleAfter * l.opts.Interval)
	workers := l.opts.Registry.All()
	l.readCgroups(workers, now)
	l.mu.Lock()
	l.lastGPU, l.lastCPU = gpu, host
	// A fresh map: workers that left the registry drop out of it.
	next := make(map[uint64]Source, len(workers))
	for _, w := range workers {
		weight, src := l.weigh(w.Spec(), gpu, staleBefore)
		w.SetWeight(weight)
		next[w.ID()] = src
		l.transition(w.ID(), src)
	}
	l.sources = next
	l.mu.Unlock()
	l.opts.Registry.Republish()
}

// readCgroups reads the cgroup of every CPU worker that names one; a
// fresh map drops the workers that left.
func (l *Loop) readCgroups(workers []*dataplane.Worker, now time.Time) {
	next := make(map[uint64]*cgroupReading, len(l.cgroups))
	for _, w := range workers {
		if l.opts.CPU == nil {
			break // cpu telemetry is off
		}
		s := w.Spec()
		if s.Device != dataplane.DeviceCPU || s.CgroupPath == "" {
			continue
		}
		r := l.cgroups[s.ID]
		if r == nil || r.usage.Dir() != s.CgroupPath {
			r = &cgroupReading{usage: cpu.NewCgroupUsage(s.CgroupPath, runtime.NumCPU())}
		}
		r.idle, r.ok, r.err = r.usage.Refresh(now)
		r.at = now
		next[s.ID] = r
	}
	l.cgroups = next
}

// weigh computes one worker's weight and says where it came from.
func (l *Loop) weigh(s *dataplane.WorkerSpec, gpu *nvml.Snapshot, staleBefore time.Time) (float64, Source) {
	if s.Device == dataplane.DeviceGPU {
		switch {
		case l.opts.GPU == nil:
			return s.Capacity, Source{Static: true, Reason: l.opts.NoGPU}
		case gpu == nil:
			return s.Capacity, Source{Static: true, Reason: "no gpu reading"}
		case gpu.At.Before(staleBefore):
			return s.Capacity, Source{Static: true, Reason: "gpu reading is stale"}
		}
		for _, g := range gpu.GPUs {
			if (s.GPUUUID != "" && g.UUID == s.GPUUUID) || (s.GPUUUID == "" && g.Index == s.GPUIndex) {
				return GPUWeight(s.Capacity, g), Source{At: gpu.At}
			}
		}
		if s.GPUUUID != "" {
			return s.Capacity, Source{Static: true, Reason: "gpu " + s.GPUUUID + " not found"}
		}
		return s.Capacity, Source{Static: true, Reason: "gpu index " + strconv.Itoa(s.GPUIndex) + " not found"}
	}
	// A CPU worker is measured by its own cgroup: the router host's idle
	// share says nothing of one worker (and the same for all of them).
	r := l.cgroups[s.ID]
	switch {
	case l.opts.CPU == nil:
		return s.Capacity, Source{Static: true, Reason: "cpu telemetry is off"}
	case s.CgroupPath == "":
		return s.Capacity, Source{Static: true, Reason: "no cgroup_path: nothing measures this worker's CPU"}
	case r == nil || r.err != nil:
		reason := "no cgroup reading"
		if r != nil {
			reason = r.err.Error()
		}
		return s.Capacity, Source{Static: true, Reason: reason}
	case !r.ok:
		return s.Capacity, Source{Static: true, Reason: "no cgroup reading yet"}
	}
	return CPUWeight(s.Capacity, r.idle), Source{At: r.at}
}

// transition counts and logs, once, each change of a worker's source to or
// between static reasons, comparing with the previous tick's sources.
func (l *Loop) transition(id uint64, src Source) {
	prev, known := l.sources[id]
	if known && prev.Static == src.Static && prev.Reason == src.Reason {
		return
	}
	if src.Static {
		l.fallbacks.Inc()
		l.opts.Logger.Warn("worker weight falls back to static capacity", "worker", id, "reason", src.Reason)
	} else if known {
		l.opts.Logger.Info("worker weight follows telemetry again", "worker", id)
	}
}

func (l *Loop) noteErr(last *string, what string, err error) {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if msg != *last && msg != "" {
		l.opts.Logger.Warn("telemetry refresh failed", "collector", what, "err", msg)
	}
	*last = msg
}

// Source returns where worker id's weight came from at the last Tick.
func (l *Loop) Source(id uint64) (Source, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.sources[id]
	return s, ok
}

// Describe adds the weight source and telemetry age to GET /workers.
func (l *Loop) Describe(w *dataplane.Worker, info map[string]any) {
	src, ok := l.Source(w.ID())
	if !ok {
		return
	}
	if src.Static {
		info["weight_source"] = "static"
		info["weight_static_reason"] = src.Reason
		return
	}
	info["weight_source"] = "telemetry"
	info["telemetry_age_seconds"] = time.Since(src.At).Seconds()
}

// Collector exports the device readings and the fallback counts.
func (l *Loop) Collector() metrics.Collector {
	return func(w *metrics.Writer) {
		l.mu.Lock()
		gpu, host := l.lastGPU, l.lastCPU
		static := 0
		for _, s := range l.sources {
			if s.Static {
				static++
			}
		}
		l.mu.Unlock()
		w.Header("fastroute_gpu_utilization_ratio", "gauge", "SM busy share of the GPU at the last reading.")
		if gpu != nil {
			for _, g := range gpu.GPUs {
				w.Sample("fastroute_gpu_utilization_ratio", g.Utilization, "gpu", strconv.Itoa(g.Index))
			}
		}
		w.Header("fastroute_gpu_memory_used_bytes", "gauge", "GPU memory in use at the last reading.")
		if gpu != nil {
			for _, g := range gpu.GPUs {
				w.Sample("fastroute_gpu_memory_used_bytes", float64(g.MemoryUsed), "gpu", strconv.Itoa(g.Index))
			}
		}
		w.Header("fastroute_cpu_idle_ratio", "gauge", "Idle share of the CPU quota (host CPUs without one) at the last reading.")
		if host != nil {
			w.Sample("fastroute_cpu_idle_ratio", host.Idle)
		}
		w.Header("fastroute_telemetry_static_workers", "gauge", "Workers whose weight is their static capacity for want of a fresh reading.")
		w.Sample("fastroute_telemetry_static_workers", float64(static))
		w.Header("fastroute_telemetry_fallbacks_total", "counter", "Times a worker's weight fell back to its static capacity.")
		w.Sample("fastroute_telemetry_fallbacks_total", float64(l.fallbacks.Value()))
	}
}
