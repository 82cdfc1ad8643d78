//go:build !nonvml

package router

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"

	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/telemetry/nvml"
	"github.com/fastroute/fastroute/telemetry/nvml/nvmltest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A start that fails leaves the GPU library as it found it, and one that
// succeeds shuts it down at Close (and at a reload that turns nvml off): a
// program that embeds the router and retries its start must not keep NVML
// initialised.
func TestAFailedStartLeavesTheGPULibraryClosed(t *testing.T) {
	var util uint32 = 10
	lib := nvmltest.FakeLib(nvmltest.FakeGPU(0, &util))
	was := newGPU
	newGPU = func() *nvml.Collector { return nvml.New(lib) }
	t.Cleanup(func() { newGPU = was })

	cfg := config.Default()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Telemetry.NVML, cfg.Telemetry.CPU = true, false
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	refused := errors.New("address already in use")
	for _, key := range []string{"listen", "admin_listen"} {
		_, err := StartWith(cfg, log, func(k, address string) (net.Listener, error) {
			if k == key {
				return nil, refused
			}
			return net.Listen("tcp", address)
		})
		require.ErrorIs(t, err, refused, key)
		require.Len(t, lib.ShutdownCalls(), len(lib.InitCalls()), "a start failing on %s left NVML initialised", key)
	}

	r, err := Start(cfg, log)
	require.NoError(t, err)
	require.NotNil(t, r.weights.Load().gpu, "the mock GPU did not start")
	// A reload that turns nvml off shuts the library down; one that turns
	// it on starts it again.
	next := r.CurrentConfig()
	next.Telemetry.NVML = false
	_, _, err = r.Reload(next)
	require.NoError(t, err)
	require.Len(t, lib.ShutdownCalls(), 1, "turned off: NVML shut down")
	assert.Nil(t, r.Weights())
	next.Telemetry.NVML = true
	_, _, err = r.Reload(next)
	require.NoError(t, err)
	require.Len(t, lib.InitCalls(), 2)
	require.NotNil(t, r.weights.Load().gpu, "started again")
	require.NoError(t, r.Close())
	require.Len(t, lib.InitCalls(), 2)
	require.Len(t, lib.ShutdownCalls(), 2, "Close left NVML initialised")
}
