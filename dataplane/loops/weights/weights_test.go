package weights

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/metrics"
	"github.com/fastroute/fastroute/pickers"
	"github.com/fastroute/fastroute/telemetry/cpu"
	"github.com/fastroute/fastroute/telemetry/nvml"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fixedGPU and fixedCPU are readers whose next reading the test sets.
type fixedGPU struct{ snap atomic.Pointer[nvml.Snapshot] }

func (f *fixedGPU) Refresh(time.Time) error { return nil }
func (f *fixedGPU) Latest() *nvml.Snapshot  { return f.snap.Load() }

type fixedCPU struct{ sample atomic.Pointer[cpu.Sample] }

func (f *fixedCPU) Refresh(time.Time) error { return nil }
func (f *fixedCPU) Latest() *cpu.Sample     { return f.sample.Load() }

const interval = 100 * time.Millisecond

var quiet = slog.New(slog.DiscardHandler)

func registry(t testing.TB, specs ...dataplane.WorkerSpec) *dataplane.Registry {
	reg := dataplane.NewRegistry()
	for _, s := range specs {
		if s.URL == "" {
			s.URL = "http://127.0.0.1:1"
		}
		_, err := reg.Add(s)
		require.NoError(t, err)
	}
	return reg
}

// split runs n selections through a real weighted selector, each released
// before the next, and returns each worker's share.
func split(t testing.TB, reg *dataplane.Registry, n int) map[uint64]float64 {
	sel, err := dataplane.NewSelector(reg, pickers.ModeWeighted, 0)
	require.NoError(t, err)
	counts := map[uint64]int{}
	var req dataplane.Request
	var res dataplane.Reservation
	for i := 0; i < n; i++ {
		req.Reset()
		require.NoError(t, sel.Select(&req, &res))
		counts[res.Worker().ID()]++
		res.Release()
	}
	share := map[uint64]float64{}
	for id, c := range counts {
		share[id] = float64(c) / float64(n)
	}
	for _, w := range reg.All() {
		require.Zero(t, w.Occupancy())
	}
	return share
}

func TestWeightFormulas(t *testing.T) {
	g := nvml.GPU{Utilization: 0.25, MemoryUsed: 20, MemoryTotal: 80}
	assert.InDelta(t, 2*0.75*0.75, GPUWeight(2, g), 1e-12)
	assert.InDelta(t, 0.75, GPUWeight(1, nvml.GPU{Utilization: 0.25}), 1e-12, "no memory total: memory does not count")
	assert.InDelta(t, MinShare, GPUWeight(1, nvml.GPU{Utilization: 1}), 1e-12, "a saturated GPU keeps a trickle")
	assert.InDelta(t, 0.1, CPUWeight(0.25, 0.4), 1e-12)
	assert.InDelta(t, 0.25, CPUWeight(0.25, 7), 1e-12, "idle is clamped to 1")
}

// cgroupDir writes a cgroup v2 directory with a 2-CPU quota and usage_usec.
func cgroupDir(t *testing.T, usage time.Duration) string {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cpu.max"), []byte("200000 100000\n"), 0o644))
	setUsage(t, dir, usage)
	return dir
}

func setUsage(t *testing.T, dir string, usage time.Duration) {
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cpu.stat"), fmt.Appendf(nil, "usage_usec %d\nnr_periods 0\n", usage.Microseconds()), 0o644))
}

func TestCPUAndGPUWorkersSplitByCapacity(t *testing.T) {
	cg := cgroupDir(t, 0)
	reg := registry(t,
		dataplane.WorkerSpec{ID: 1, Device: dataplane.DeviceGPU, GPUIndex: 0, Capacity: 1},
		dataplane.WorkerSpec{ID: 2, Device: dataplane.DeviceCPU, Capacity: 0.25, CgroupPath: cg})
	gpu, host := &fixedGPU{}, &fixedCPU{}
	now := time.Unix(5000, 0)
	gpu.snap.Store(&nvml.Snapshot{At: now, GPUs: []nvml.GPU{{Index: 0, MemoryTotal: 80 << 30}}})
	l := New(Options{Registry: reg, Sources: []Source{NewGPU(gpu), NewCPU(host)}, Interval: interval, Logger: quiet})
	l.Tick(now) // the first cgroup reading: no share yet
	now = now.Add(time.Second)
	gpu.snap.Store(&nvml.Snapshot{At: now, GPUs: []nvml.GPU{{Index: 0, MemoryTotal: 80 << 30}}})
	l.Tick(now) // no CPU used in the second: idle 1
	share := split(t, reg, 10000)
	assert.InDelta(t, 0.8, share[1], 0.02, "%v", share)
	assert.InDelta(t, 0.2, share[2], 0.02, "%v", share)

	// The worker gets busy: 1.6 of its 2 CPUs for a second, idle 0.2 →
	// weight 0.05 against 1 → 1/21 of the picks.
	setUsage(t, cg, 1600*time.Millisecond)
	now = now.Add(time.Second)
	gpu.snap.Store(&nvml.Snapshot{At: now, GPUs: []nvml.GPU{{Index: 0, MemoryTotal: 80 << 30}}})
	l.Tick(now)
	share = split(t, reg, 10000)
	assert.InDelta(t, 1.0/21, share[2], 0.01, "%v", share)
}

func TestCPUWorkersAreMeasuredByTheirOwnCgroup(t *testing.T) {
	busy, idle := cgroupDir(t, 0), cgroupDir(t, 0)
	reg := registry(t,
		dataplane.WorkerSpec{ID: 1, Device: dataplane.DeviceCPU, CgroupPath: busy},
		dataplane.WorkerSpec{ID: 2, Device: dataplane.DeviceCPU, CgroupPath: idle},
		dataplane.WorkerSpec{ID: 3, Device: dataplane.DeviceCPU, Capacity: 0.5},
		dataplane.WorkerSpec{ID: 4, Device: dataplane.DeviceCPU, CgroupPath: "/nonexistent/cgroup"})
	host := &fixedCPU{}
	now := time.Unix(100, 0)
	host.sample.Store(&cpu.Sample{At: now, Idle: 0.9}) // the router's host: not any worker's
	l := New(Options{Registry: reg, Sources: []Source{NewCPU(host)}, Interval: interval, Logger: quiet})
	l.Tick(now)
	setUsage(t, busy, 1500*time.Millisecond)
	l.Tick(now.Add(time.Second))
	weight := func(id uint64) float64 { w, _ := reg.Get(id); return w.Weight() }
	assert.InDelta(t, 0.25, weight(1), 1e-9, "1.5 of 2 CPUs used: idle 0.25")
	assert.InDelta(t, 1, weight(2), 1e-9)
	assert.InDelta(t, 0.5, weight(3), 1e-9, "no cgroup_path: its static capacity, not the host's idle share")
	src, _ := l.Origin(3)
	assert.Equal(t, "no cgroup_path: nothing measures this worker's CPU", src.Reason)
	src, _ = l.Origin(4)
	assert.True(t, src.Static)
	assert.Contains(t, src.Reason, "cgroup /nonexistent/cgroup")
}

func TestStaleTelemetryDecaysToCapacityAndIsCountedOnce(t *testing.T) {
	reg := registry(t,
		dataplane.WorkerSpec{ID: 1, Device: dataplane.DeviceGPU, GPUIndex: 0, Capacity: 2},
		dataplane.WorkerSpec{ID: 2, Device: dataplane.DeviceGPU, GPUIndex: 1, Capacity: 1})
	var logs bytes.Buffer
	gpu := &fixedGPU{}
	t0 := time.Unix(9000, 0)
	gpu.snap.Store(&nvml.Snapshot{At: t0, GPUs: []nvml.GPU{{Index: 0, Utilization: 0.9}, {Index: 1}}})
	l := New(Options{Registry: reg, Sources: []Source{NewGPU(gpu)}, Interval: interval,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	w1, _ := reg.Get(1)
	w2, _ := reg.Get(2)

	l.Tick(t0.Add(StaleAfter * interval)) // exactly 3 periods old: still fresh
	assert.InDelta(t, 0.2, w1.Weight(), 1e-9)
	assert.InDelta(t, 1.0, w2.Weight(), 1e-9)
	src, _ := l.Origin(1)
	assert.False(t, src.Static)

	for k := 0; k < 3; k++ { // older: static capacity, logged and counted once per worker
		l.Tick(t0.Add(StaleAfter*interval + time.Duration(k+1)*time.Millisecond))
	}
	assert.Equal(t, 2.0, w1.Weight())
	assert.Equal(t, 1.0, w2.Weight())
	src, _ = l.Origin(1)
	assert.Equal(t, Origin{Static: true, Reason: "gpu reading is stale"}, src)
	assert.EqualValues(t, 2, l.fallbacks.Value())
	assert.Equal(t, 2, strings.Count(logs.String(), "falls back to static capacity"), logs.String())
	assert.Equal(t, 2.0, reg.Snapshot().Weights().Weight(0), "the published snapshot carries the new weight")

	gpu.snap.Store(&nvml.Snapshot{At: t0.Add(time.Second), GPUs: []nvml.GPU{{Index: 0, Utilization: 0.9}, {Index: 1}}})
	l.Tick(t0.Add(time.Second))
	assert.InDelta(t, 0.2, w1.Weight(), 1e-9)
	assert.Contains(t, logs.String(), "follows telemetry again")
}

func TestWorkersMapByUUIDOrIndex(t *testing.T) {
	reg := registry(t,
		dataplane.WorkerSpec{ID: 1, Device: dataplane.DeviceGPU, GPUIndex: 0, GPUUUID: "GPU-b", Capacity: 1},
		dataplane.WorkerSpec{ID: 2, Device: dataplane.DeviceGPU, GPUIndex: 7, Capacity: 1},
		dataplane.WorkerSpec{ID: 3, Device: dataplane.DeviceGPU, GPUUUID: "GPU-zz", Capacity: 1},
		dataplane.WorkerSpec{ID: 4, Device: dataplane.DeviceCPU, Capacity: 0.5})
	gpu := &fixedGPU{}
	now := time.Unix(100, 0)
	gpu.snap.Store(&nvml.Snapshot{At: now, GPUs: []nvml.GPU{{Index: 0, UUID: "GPU-a"}, {Index: 1, UUID: "GPU-b", Utilization: 0.5}}})
	l := New(Options{Registry: reg, Sources: []Source{NewGPU(gpu)}, Interval: interval, Logger: quiet})
	l.Tick(now)
	w1, _ := reg.Get(1)
	assert.InDelta(t, 0.5, w1.Weight(), 1e-9, "the uuid wins over the index")
	for id, reason := range map[uint64]string{2: "gpu index 7 not found", 3: "gpu GPU-zz not found", 4: "cpu telemetry is off"} {
		src, ok := l.Origin(id)
		require.True(t, ok)
		assert.Equal(t, Origin{Static: true, Reason: reason}, src, "worker %d", id)
	}
}

func TestMetricsAndDescribe(t *testing.T) {
	reg := registry(t, dataplane.WorkerSpec{ID: 1, Device: dataplane.DeviceGPU, GPUIndex: 0},
		dataplane.WorkerSpec{ID: 2, Device: dataplane.DeviceCPU})
	gpu, host := &fixedGPU{}, &fixedCPU{}
	now := time.Now()
	gpu.snap.Store(&nvml.Snapshot{At: now, GPUs: []nvml.GPU{{Index: 0, Utilization: 0.5, MemoryUsed: 1 << 30, MemoryTotal: 4 << 30}}})
	l := New(Options{Registry: reg, Sources: []Source{NewGPU(gpu), NewCPU(host)}, Interval: interval, Logger: quiet})
	l.Tick(now)
	var set metrics.Set
	set.Register(l.Collector())
	var out bytes.Buffer
	_, err := set.WriteTo(&out)
	require.NoError(t, err)
	for _, line := range []string{
		`fastroute_gpu_utilization_ratio{gpu="0"} 0.5`,
		`fastroute_gpu_memory_used_bytes{gpu="0"} 1.073741824e+09`,
		"fastroute_telemetry_static_workers 1", // the CPU worker: no reading yet
		"fastroute_telemetry_fallbacks_total 1",
	} {
		assert.Contains(t, out.String(), line+"\n")
	}
	assert.NotContains(t, out.String(), "\nfastroute_cpu_idle_ratio ", "no cpu sample yet")

	w1, _ := reg.Get(1)
	info := map[string]any{}
	l.Describe(w1, info)
	assert.Equal(t, "telemetry", info["weight_source"])
	assert.GreaterOrEqual(t, info["telemetry_age_seconds"], 0.0)
	w2, _ := reg.Get(2)
	info = map[string]any{}
	l.Describe(w2, info)
	raw, _ := json.Marshal(info)
	assert.JSONEq(t, `{"weight_source":"static","weight_static_reason":"no cgroup_path: nothing measures this worker's CPU"}`, string(raw))
}

func TestRemovedWorkersAreForgotten(t *testing.T) {
	reg := registry(t, dataplane.WorkerSpec{ID: 1}, dataplane.WorkerSpec{ID: 2})
	l := New(Options{Registry: reg, Interval: interval, Logger: quiet})
	l.Tick(time.Now())
	require.NoError(t, reg.Drain(2))
	reg.SweepDrained()
	l.Tick(time.Now())
	_, ok := l.Origin(2)
	assert.False(t, ok)
}

// halfSource weighs the workers with an even id at half their capacity,
// and says why it cannot weigh worker 4.
type halfSource struct{ refreshed int }

func (h *halfSource) Name() string                          { return "half" }
func (h *halfSource) Measures(s *dataplane.WorkerSpec) bool { return s.ID%2 == 0 }
func (h *halfSource) Refresh(time.Time, []*dataplane.Worker) error {
	h.refreshed++
	return nil
}
func (h *halfSource) Collect(w *metrics.Writer) { w.Header("half", "gauge", "test") }
func (h *halfSource) Weigh(s *dataplane.WorkerSpec, _ time.Time) (float64, time.Time, string) {
	if s.ID == 4 {
		return 0, time.Time{}, "worker 4 is not measured"
	}
	return s.Capacity / 2, time.Unix(1, 0), ""
}

// Sources are asked in order; the first that measures a worker weighs it,
// and a worker none measures keeps its capacity. A GPU library that did not
// start says why on every GPU worker.
func TestSourcesWeighTheWorkersTheyMeasure(t *testing.T) {
	reg := registry(t,
		dataplane.WorkerSpec{ID: 1, Capacity: 2},
		dataplane.WorkerSpec{ID: 2, Capacity: 2},
		dataplane.WorkerSpec{ID: 4, Capacity: 2},
		dataplane.WorkerSpec{ID: 6, Device: dataplane.DeviceGPU, Capacity: 2},
		dataplane.WorkerSpec{ID: 7, Device: dataplane.DeviceGPU, Capacity: 2})
	half := &halfSource{}
	l := New(Options{Registry: reg, Sources: []Source{half, GPUDown("nvml: library not found")}, Interval: interval, Logger: quiet})
	l.Tick(time.Unix(1, 0))
	assert.Equal(t, 1, half.refreshed)
	want := map[uint64]Origin{
		1: {Static: true, Reason: "cpu telemetry is off"},
		2: {At: time.Unix(1, 0)},
		4: {Static: true, Reason: "worker 4 is not measured"},
		6: {At: time.Unix(1, 0)}, // half comes first
		7: {Static: true, Reason: "nvml: library not found"},
	}
	for id, o := range want {
		got, ok := l.Origin(id)
		require.True(t, ok)
		assert.Equal(t, o, got, "worker %d", id)
		w, _ := reg.Get(id)
		if o.Static {
			assert.Equal(t, 2.0, w.Weight(), "worker %d", id)
		} else {
			assert.Equal(t, 1.0, w.Weight(), "worker %d", id)
		}
	}
	var set metrics.Set
	set.Register(l.Collector())
	var out bytes.Buffer
	_, err := set.WriteTo(&out)
	require.NoError(t, err)
	assert.Contains(t, out.String(), "# TYPE half gauge\n")
	assert.Contains(t, out.String(), "# TYPE fastroute_gpu_utilization_ratio gauge\n")
}
