package main

import (
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/dataplane/router"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFirstSignalDrainsSecondExits(t *testing.T) {
	m, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: 1, Tokens: 500, TokenInterval: 10 * time.Millisecond})
	require.NoError(t, err)
	defer m.Close()
	cfg := config.Default()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Workers = []dataplane.WorkerSpec{{ID: 1, URL: m.URL()}}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	r, err := router.Start(cfg, log)
	require.NoError(t, err)
	defer r.Close()

	resp, err := http.Post("http://"+r.Addr()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"mock-model","stream":true,"messages":[]}`))
	require.NoError(t, err)
	defer resp.Body.Close()

	sig := make(chan os.Signal, 2)
	exited := make(chan int, 1)
	returned := make(chan error, 1)
	go func() { returned <- drainOnSignal(r, sig, log, func(code int) { exited <- code }) }()
	sig <- syscall.SIGTERM
	time.Sleep(100 * time.Millisecond)
	select {
	case <-returned:
		t.Fatal("the first signal must wait for the open stream (5 s) within shutdown_timeout (30 s)")
	default:
	}
	sig <- syscall.SIGINT
	select {
	case code := <-exited:
		assert.Equal(t, 1, code)
	case <-time.After(2 * time.Second):
		t.Fatal("the second signal did not exit at once")
	}
}

func TestVersionNamesTheBuild(t *testing.T) {
	assert.Regexp(t, `^fastroute \S+, commit \S+.*, go1\.`, version())
}
