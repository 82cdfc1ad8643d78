package weights

import (
	"strconv"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/metrics"
	"github.com/fastroute/fastroute/telemetry/nvml"
)

// GPUReader is the GPU collector (telemetry/nvml.Collector, or a test double).
type GPUReader interface {
	Refresh(now time.Time) error
	Latest() *nvml.Snapshot
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

// GPU weighs GPU workers from NVML readings: capacity × free SM share ×
// free memory share of the device the worker names (by UUID, else index).
type GPU struct {
	r    GPUReader
	down string // why there is no reader (the library did not start)
}

// NewGPU returns the GPU source over r.
func NewGPU(r GPUReader) *GPU { return &GPU{r: r} }

// GPUDown is the GPU source while the GPU library cannot start: every GPU
// worker keeps its static capacity, and says why.
func GPUDown(reason string) *GPU { return &GPU{down: reason} }

// Name implements Source.
func (g *GPU) Name() string { return "gpu" }

// Measures implements Source: GPU workers.
func (g *GPU) Measures(s *dataplane.WorkerSpec) bool { return s.Device == dataplane.DeviceGPU }

// Refresh implements Source.
func (g *GPU) Refresh(now time.Time, _ []*dataplane.Worker) error {
	if g.r == nil {
		return nil
	}
	return g.r.Refresh(now)
}

// Weigh implements Source.
func (g *GPU) Weigh(s *dataplane.WorkerSpec, staleBefore time.Time) (float64, time.Time, string) {
	if g.r == nil {
		return 0, time.Time{}, g.down
	}
	snap := g.r.Latest()
	switch {
	case snap == nil:
		return 0, time.Time{}, "no gpu reading"
	case snap.At.Before(staleBefore):
		return 0, time.Time{}, "gpu reading is stale"
	}
	for _, d := range snap.GPUs {
		if (s.GPUUUID != "" && d.UUID == s.GPUUUID) || (s.GPUUUID == "" && d.Index == s.GPUIndex) {
			return GPUWeight(s.Capacity, d), snap.At, ""
		}
	}
	if s.GPUUUID != "" {
		return 0, time.Time{}, "gpu " + s.GPUUUID + " not found"
	}
	return 0, time.Time{}, "gpu index " + strconv.Itoa(s.GPUIndex) + " not found"
}

// Collect implements Source: each device's SM use and memory in use.
func (g *GPU) Collect(w *metrics.Writer) {
	var snap *nvml.Snapshot
	if g.r != nil {
		snap = g.r.Latest()
	}
	w.Header("fastroute_gpu_utilization_ratio", "gauge", "SM busy share of the GPU at the last reading.")
	if snap != nil {
		for _, d := range snap.GPUs {
			w.Sample("fastroute_gpu_utilization_ratio", d.Utilization, "gpu", strconv.Itoa(d.Index))
		}
	}
	w.Header("fastroute_gpu_memory_used_bytes", "gauge", "GPU memory in use at the last reading.")
	if snap != nil {
		for _, d := range snap.GPUs {
			w.Sample("fastroute_gpu_memory_used_bytes", float64(d.MemoryUsed), "gpu", strconv.Itoa(d.Index))
		}
	}
}
