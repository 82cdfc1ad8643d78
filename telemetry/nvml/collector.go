//go:build !nonvml

package nvml

import (
	"fmt"
	"sync/atomic"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Collector reads every GPU through an nvml.Interface (the system library,
// or go-nvml's mock in tests).
type Collector struct {
	lib     gonvml.Interface
	devices []gonvml.Device
	latest  atomic.Pointer[Snapshot]
}

// NewSystem returns a collector over the NVML library loaded at run time.
func NewSystem() *Collector { return New(gonvml.New()) }

// New returns a collector over lib.
func New(lib gonvml.Interface) *Collector { return &Collector{lib: lib} }

// Start initialises NVML and enumerates the devices. Without a library or a
// GPU it returns an error wrapping ErrUnavailable; it never panics.
func (c *Collector) Start() error {
	if ret := c.lib.Init(); ret != gonvml.SUCCESS {
		return fmt.Errorf("%w: init: %v", ErrUnavailable, ret)
	}
	n, ret := c.lib.DeviceGetCount()
	if ret != gonvml.SUCCESS {
		c.lib.Shutdown()
		return fmt.Errorf("%w: device count: %v", ErrUnavailable, ret)
	}
	if n == 0 {
		c.lib.Shutdown()
		return fmt.Errorf("%w: no GPU found", ErrUnavailable)
	}
	c.devices = c.devices[:0]
	for i := 0; i < n; i++ {
		d, ret := c.lib.DeviceGetHandleByIndex(i)
		if ret != gonvml.SUCCESS {
			c.lib.Shutdown()
			return fmt.Errorf("%w: device %d handle: %v", ErrUnavailable, i, ret)
		}
		c.devices = append(c.devices, d)
	}
	return nil
}

// Close shuts NVML down.
func (c *Collector) Close() {
	if len(c.devices) > 0 {
		c.lib.Shutdown()
		c.devices = nil
	}
}

// Latest returns the newest snapshot, or nil before the first Refresh.
func (c *Collector) Latest() *Snapshot { return c.latest.Load() }

// Refresh reads every device's utilization and memory once (what the
// weights use, nothing more) and publishes the snapshot. Refresh runs on one
// goroutine at a time.
func (c *Collector) Refresh(now time.Time) error {
	s := &Snapshot{At: now, GPUs: make([]GPU, len(c.devices))}
	for i, d := range c.devices {
		g := &s.GPUs[i]
		g.Index = i
		if idx, ret := d.GetIndex(); ret == gonvml.SUCCESS {
			g.Index = idx
		}
		if uuid, ret := d.GetUUID(); ret == gonvml.SUCCESS {
			g.UUID = uuid
		}
		u, ret := d.GetUtilizationRates()
		if ret != gonvml.SUCCESS {
			return fmt.Errorf("gpu %d utilization: %v", i, ret)
		}
		g.Utilization = float64(u.Gpu) / 100
		m, ret := d.GetMemoryInfo()
		if ret != gonvml.SUCCESS {
			return fmt.Errorf("gpu %d memory: %v", i, ret)
		}
		g.MemoryUsed, g.MemoryTotal = m.Used, m.Total
	}
	c.latest.Store(s)
	return nil
}
