//go:build !nonvml

package nvml

import (
	"errors"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/fastroute/fastroute/telemetry/nvml/nvmltest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRefreshFollowsMockedUtilization(t *testing.T) {
	u0, u1 := uint32(10), uint32(90)
	c := New(nvmltest.FakeLib(nvmltest.FakeGPU(0, &u0), nvmltest.FakeGPU(1, &u1)))
	require.NoError(t, c.Start())
	defer c.Close()
	assert.Nil(t, c.Latest())
	require.NoError(t, c.Refresh(time.Unix(100, 0)))
	s := c.Latest()
	require.Len(t, s.GPUs, 2)
	assert.Equal(t, GPU{Index: 0, UUID: "GPU-a", Utilization: 0.10, MemoryUsed: 20 << 30, MemoryTotal: 80 << 30}, s.GPUs[0])
	assert.InDelta(t, 0.9, s.GPUs[1].Utilization, 1e-9)

	u0 = 75
	require.NoError(t, c.Refresh(time.Unix(101, 0)))
	assert.InDelta(t, 0.75, c.Latest().GPUs[0].Utilization, 1e-9)
	assert.Equal(t, time.Unix(101, 0), c.Latest().At)
}

func TestInitFailuresAreUnavailableNotPanics(t *testing.T) {
	lib := nvmltest.FakeLib()
	lib.InitFunc = func() gonvml.Return { return gonvml.ERROR_LIBRARY_NOT_FOUND }
	err := New(lib).Start()
	assert.True(t, errors.Is(err, ErrUnavailable), err)
	assert.ErrorContains(t, err, "init")

	err = New(nvmltest.FakeLib()).Start()
	assert.ErrorContains(t, err, "no GPU found")
}

func TestRefreshErrorKeepsLastSnapshot(t *testing.T) {
	u := uint32(40)
	dev := nvmltest.FakeGPU(0, &u)
	c := New(nvmltest.FakeLib(dev))
	require.NoError(t, c.Start())
	require.NoError(t, c.Refresh(time.Unix(1, 0)))
	dev.GetUtilizationRatesFunc = func() (gonvml.Utilization, gonvml.Return) {
		return gonvml.Utilization{}, gonvml.ERROR_GPU_IS_LOST
	}
	assert.ErrorContains(t, c.Refresh(time.Unix(2, 0)), "gpu 0 utilization")
	assert.Equal(t, time.Unix(1, 0), c.Latest().At, "a failed refresh publishes nothing")
}

// BenchmarkRefresh8GPUs holds the "one refresh of 8 GPUs" cost target.
func BenchmarkRefresh8GPUs(b *testing.B) {
	var devs []*mock.Device
	u := uint32(50)
	for i := 0; i < 8; i++ {
		devs = append(devs, nvmltest.FakeGPU(i, &u))
	}
	c := New(nvmltest.FakeLib(devs...))
	require.NoError(b, c.Start())
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Refresh(time.Now()); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRealNVML runs against the system library; it skips where there is none.
func TestRealNVML(t *testing.T) {
	c := NewSystem()
	if err := c.Start(); err != nil {
		t.Skipf("no usable NVML here (%v); the real path is exercised on GPU machines", err)
	}
	defer c.Close()
	require.NoError(t, c.Refresh(time.Now()))
	s := c.Latest()
	require.NotEmpty(t, s.GPUs)
	for _, g := range s.GPUs {
		assert.Positive(t, g.MemoryTotal, "gpu %d", g.Index)
		assert.LessOrEqual(t, g.Utilization, 1.0)
		t.Logf("gpu %d %s: util %.0f%%, mem %d/%d MiB", g.Index, g.UUID,
			100*g.Utilization, g.MemoryUsed>>20, g.MemoryTotal>>20)
	}
}
