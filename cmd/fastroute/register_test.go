package main

import (
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/discovery"
	"github.com/fastroute/fastroute/discovery/etcdtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRegisterKeepsTheKeyUntilSIGTERM(t *testing.T) {
	e := etcdtest.Start(t)
	rec := &etcdtest.Recorder{}
	w, err := discovery.Watch(discovery.Options{Endpoints: []string{e.Endpoint}, Prefix: "/reg", DialTimeout: time.Second}, rec)
	require.NoError(t, err)
	defer w.Close()

	sig := make(chan os.Signal, 1)
	done := make(chan error, 1)
	go func() {
		done <- registerUntil([]string{"--etcd", e.Endpoint, "--prefix", "/reg", "--ttl", "2s", "--id", "9",
			"--url", "http://10.0.0.9:8000", "--device", "gpu", "--role", "decode", "--max-inflight", "32", "--health-path", "/api/version"}, sig)
	}()
	require.Eventually(t, func() bool { put, _ := rec.State(); return len(put) == 1 }, 5*time.Second, 10*time.Millisecond)
	put, _ := rec.State()
	assert.Equal(t, dataplane.WorkerSpec{ID: 9, URL: "http://10.0.0.9:8000", Device: dataplane.DeviceGPU, DPSize: 1, Capacity: 1,
		MetricsPath: "/metrics", HealthPath: "/api/version", MaxInflight: 32, Role: dataplane.RoleDecode}, put[9])
	time.Sleep(3 * time.Second) // beyond the TTL: the lease is kept alive
	_, drained := rec.State()
	assert.Empty(t, drained)

	sig <- syscall.SIGTERM
	require.NoError(t, <-done)
	require.Eventually(t, func() bool { _, d := rec.State(); return len(d) == 1 && d[0] == 9 }, 2*time.Second, 10*time.Millisecond,
		"SIGTERM removes the key at once")
	assert.Error(t, registerUntil([]string{"--id", "1", "--url", "http://h:1"}, sig), "--etcd is required")
}

func TestDemoCluster(t *testing.T) {
	etcdtest.Start(t) // skips without etcd; the demo starts its own
	require.NoError(t, runDemoCluster([]string{"--ttl", "1s"}))
}
