// Package nvml collects GPU telemetry through github.com/NVIDIA/go-nvml and
// publishes it as an immutable Snapshot behind an atomic pointer. Built with
// the nonvml tag it compiles without cgo and reports itself unavailable.
package nvml

import (
	"errors"
	"time"
)

// GPU is one device's reading.
type GPU struct {
	Index       int
	UUID        string
	Utilization float64 // SM busy share, 0..1
	MemoryUsed  uint64  // bytes
	MemoryTotal uint64  // bytes
}

// Snapshot is one refresh of every GPU.
type Snapshot struct {
	At   time.Time
	GPUs []GPU
}

// ErrUnavailable reports that no NVML library or GPU can be used.
var ErrUnavailable = errors.New("nvml unavailable")
