//go:build !nonvml

package weights

import (
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/internal/filetree"
	"github.com/fastroute/fastroute/telemetry/cpu"
	"github.com/fastroute/fastroute/telemetry/nvml"
	"github.com/fastroute/fastroute/telemetry/nvml/nvmltest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBusierGPUGetsProportionallyFewerRequests drives the real collector over
// go-nvml mocks: GPU 0 at 20% SM use, GPU 1 at 60%. Both use 20 of 80 GiB, so
// the weights are 0.8·0.75 and 0.4·0.75 and 10k picks split 2:1; swapping the
// load swaps the split at the next tick.
func TestBusierGPUGetsProportionallyFewerRequests(t *testing.T) {
	u0, u1 := uint32(20), uint32(60)
	c := nvml.New(nvmltest.FakeLib(nvmltest.FakeGPU(0, &u0), nvmltest.FakeGPU(1, &u1)))
	require.NoError(t, c.Start())
	defer c.Close()
	reg := registry(t,
		dataplane.WorkerSpec{ID: 1, Device: dataplane.DeviceGPU, GPUIndex: 0},
		dataplane.WorkerSpec{ID: 2, Device: dataplane.DeviceGPU, GPUIndex: 1})
	l := New(Options{Registry: reg, Sources: []Source{NewGPU(c)}, Interval: interval, Logger: quiet})
	l.Tick(time.Now())
	w1, _ := reg.Get(1)
	assert.InDelta(t, 0.8*0.75, w1.Weight(), 1e-9)
	share := split(t, reg, 10000)
	// 5 standard deviations of 10,000 draws at 2 to 1 (0.0047): 0.02 was
	// 4.2 and would fail about one run in 45,000.
	assert.InDelta(t, 2.0/3, share[1], 0.024, "%v", share)
	assert.InDelta(t, 1.0/3, share[2], 0.024, "%v", share)

	u0, u1 = 90, 10
	l.Tick(time.Now())
	share = split(t, reg, 10000)
	assert.InDelta(t, 0.1, share[1], 0.02, "%v", share) // 0.1 : 0.9
}

// BenchmarkTick8GPUsAndCPU holds the "one refresh of 8 GPUs + CPU ≤ 1 ms"
// target: NVML mocks, the CPU collector over a fixture tree, 16 workers.
func BenchmarkTick8GPUsAndCPU(b *testing.B) {
	u := uint32(50)
	var devs []*mock.Device
	var specs []dataplane.WorkerSpec
	for i := 0; i < 8; i++ {
		devs = append(devs, nvmltest.FakeGPU(i, &u))
		specs = append(specs, dataplane.WorkerSpec{ID: uint64(i + 1), Device: dataplane.DeviceGPU, GPUIndex: i})
		specs = append(specs, dataplane.WorkerSpec{ID: uint64(i + 9), Device: dataplane.DeviceCPU, Capacity: 0.25})
	}
	gpu := nvml.New(nvmltest.FakeLib(devs...))
	require.NoError(b, gpu.Start())
	root := filetree.Write(b, map[string]string{
		"proc/stat":              "cpu 100 0 100 700 100 0 0 0 0 0\n",
		"sys/fs/cgroup/cpu.max":  "max 100000\n",
		"sys/fs/cgroup/cpu.stat": "usage_usec 10\n",
	})
	l := New(Options{Registry: registry(b, specs...), Sources: []Source{NewGPU(gpu), NewCPU(cpu.NewCollector(root))}, Interval: interval, Logger: quiet})
	b.ReportAllocs()
	for b.Loop() {
		l.Tick(time.Now())
	}
}
