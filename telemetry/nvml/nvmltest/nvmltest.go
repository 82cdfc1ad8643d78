//go:build !nonvml

// Package nvmltest builds go-nvml mock devices and libraries for tests of
// the GPU collector and of what consumes its readings.
package nvmltest

import (
	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// FakeGPU is a mock device with index i and UUID GPU-a, GPU-b, ...; its
// utilization is read from *util at every call, so a test changes it between
// refreshes. Memory reads 20 of 80 GiB used.
func FakeGPU(i int, util *uint32) *mock.Device {
	return &mock.Device{
		GetIndexFunc: func() (int, gonvml.Return) { return i, gonvml.SUCCESS },
		GetUUIDFunc:  func() (string, gonvml.Return) { return "GPU-" + string(rune('a'+i)), gonvml.SUCCESS },
		GetUtilizationRatesFunc: func() (gonvml.Utilization, gonvml.Return) {
			return gonvml.Utilization{Gpu: *util, Memory: *util / 2}, gonvml.SUCCESS
		},
		GetMemoryInfoFunc: func() (gonvml.Memory, gonvml.Return) {
			return gonvml.Memory{Total: 80 << 30, Used: 20 << 30, Free: 60 << 30}, gonvml.SUCCESS
		},
	}
}

// FakeLib is a mock NVML library that initialises and lists devs.
func FakeLib(devs ...*mock.Device) *mock.Interface {
	return &mock.Interface{
		InitFunc:           func() gonvml.Return { return gonvml.SUCCESS },
		ShutdownFunc:       func() gonvml.Return { return gonvml.SUCCESS },
		DeviceGetCountFunc: func() (int, gonvml.Return) { return len(devs), gonvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(n int) (gonvml.Device, gonvml.Return) {
			return devs[n], gonvml.SUCCESS
		},
	}
}
