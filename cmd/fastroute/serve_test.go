package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cloudflare/tableflip"
	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/aliases"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/dataplane/mirrors"
	"github.com/fastroute/fastroute/dataplane/router"
	"github.com/fastroute/fastroute/dataplane/tracing"
	"github.com/fastroute/fastroute/internal/logformat"
	"github.com/fastroute/fastroute/internal/syncbuf"
	"github.com/fastroute/fastroute/internal/testpki"
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
	go func() { returned <- handleSignals(r, sig, log, func(code int) { exited <- code }, noUpgrade{}) }()
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

// With shutdown_delay, SIGTERM first withdraws the router: GET /health
// answers 503 while requests, on new connections too, are still served;
// the drain closes the listener once the delay passed. A second signal
// during the delay exits at once.
func TestShutdownDelayWithdrawsTheRouterFirst(t *testing.T) {
	m, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: 1})
	require.NoError(t, err)
	defer m.Close()
	cfg := config.Default()
	cfg.Listen, cfg.AdminListen, cfg.ShutdownDelay = "127.0.0.1:0", "127.0.0.1:0", 500*time.Millisecond
	cfg.Workers = []dataplane.WorkerSpec{{ID: 1, URL: m.URL()}}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	status := func(r *router.Router, method, path string) (int, string, error) {
		c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}} // a new connection each
		req, _ := http.NewRequest(method, "http://"+r.Addr()+path, strings.NewReader(`{"messages":[]}`))
		resp, err := c.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}

	r, err := router.Start(cfg, log)
	require.NoError(t, err)
	require.Eventually(t, func() bool { code, _, _ := status(r, "GET", "/health"); return code == 200 }, 5*time.Second, 10*time.Millisecond)
	sig := make(chan os.Signal, 2)
	returned := make(chan error, 1)
	start := time.Now()
	go func() { returned <- handleSignals(r, sig, log, func(int) { t.Error("no exit expected") }, noUpgrade{}) }()
	sig <- syscall.SIGTERM
	require.Eventually(t, func() bool { code, _, _ := status(r, "GET", "/health"); return code == 503 }, time.Second, 5*time.Millisecond)
	_, body, _ := status(r, "GET", "/health")
	assert.Contains(t, body, `"status":"shutting down"`)
	code, _, err := status(r, "POST", "/v1/chat/completions")
	require.NoError(t, err)
	assert.Equal(t, 200, code, "requests are still served")
	assert.Less(t, time.Since(start), 400*time.Millisecond, "within the delay")
	select {
	case err := <-returned:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the router did not drain after the delay")
	}
	assert.GreaterOrEqual(t, time.Since(start), 500*time.Millisecond)
	_, _, err = status(r, "GET", "/health")
	assert.Error(t, err, "drained: the listener is closed")

	r, err = router.Start(cfg, log)
	require.NoError(t, err)
	defer r.Close()
	exited := make(chan int, 1)
	go func() { returned <- handleSignals(r, sig, log, func(code int) { exited <- code }, noUpgrade{}) }()
	sig <- syscall.SIGTERM
	sig <- syscall.SIGINT
	select {
	case code := <-exited:
		assert.Equal(t, 1, code)
	case <-time.After(300 * time.Millisecond):
		t.Fatal("a second signal during the delay did not exit at once")
	}
}

// check reads the config as serve would, files and certificates included,
// and says what would run (with --print, the config, secrets redacted);
// each file it cannot read is an error naming its key.
func TestCheckReadsTheConfigAsServeWould(t *testing.T) {
	dir := t.TempDir()
	file := func(name, text string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(text), 0o600))
		return path
	}
	token := file("token", "s3cret-admin\n")
	keys := file("keys", "alice sk-alice-0123456789abcdef\n")
	conf := file("ok.yaml", fmt.Sprintf("admin_token_file: %s\napi_keys_file: %s\nworkers:\n  - {id: 1, url: 'http://10.0.0.1:8000'}\n", token, keys))
	var out strings.Builder
	require.NoError(t, runCheck([]string{"--config", conf, "--print", "--mode", "round-robin"}, &out))
	assert.Contains(t, out.String(), "config ok: listen 127.0.0.1:8000, admin_listen 127.0.0.1:9090, mode round-robin, 1 workers\n")
	assert.Contains(t, out.String(), "admin_token: <redacted>")
	assert.NotContains(t, out.String(), "s3cret-admin")
	assert.NotContains(t, out.String(), "sk-alice")
	out.Reset()
	require.NoError(t, runCheck([]string{"--config", conf}, &out))
	assert.NotContains(t, out.String(), "admin_token", "the config only with --print")
	state := file("state.json", `{"workers":[{"id":1,"url":"http://10.0.0.1:8000"},{"id":2,"url":"http://10.0.0.2:8000"}]}`)
	out.Reset()
	require.NoError(t, runCheck([]string{"--config", conf, "--state-file", state}, &out))
	assert.Contains(t, out.String(), ", 1 workers and 1 from state_file\n", "worker 1 is the config's")
	drains := file("drains.json", `{"workers":[],"dns_drained":["10.0.0.7:8000","10.0.0.8:8000"]}`)
	out.Reset()
	require.NoError(t, runCheck([]string{"--config", conf, "--state-file", drains}, &out))
	assert.Contains(t, out.String(), ", 1 workers; state_file's 2 drained DNS addresses dropped (discovery.dns is off)\n")
	out.Reset()
	require.NoError(t, runCheck([]string{"--config", conf, "--state-file", drains, "--dns-name", "vllm.internal:8000"}, &out))
	assert.Contains(t, out.String(), ", 1 workers; 2 drained DNS addresses held from state_file\n")
	downs := file("downs.json", `{"workers":[],"down":[1,7]}`)
	out.Reset()
	require.NoError(t, runCheck([]string{"--config", conf, "--state-file", downs}, &out))
	assert.Contains(t, out.String(), ", 1 workers; 2 workers kept down from state_file\n")

	// Each certificate the router would show, and when it expires.
	ca := testpki.Root(t, "ca")
	front, _ := ca.ClientUntil("front", 2, time.Now().Add(90*24*time.Hour+time.Hour)).Files()
	frontKey := strings.Replace(front, "cert.pem", "key.pem", 1)
	adminCert, adminKey := ca.ClientUntil("admin", 3, time.Now().Add(5*time.Hour)).Files()
	old := ca.ClientUntil("worker client", 4, time.Now().Add(-24*time.Hour))
	workerCert, workerKey := old.Files()
	out.Reset()
	require.NoError(t, runCheck([]string{"--config", conf, "--tls-cert-file", front, "--tls-key-file", frontKey,
		"--admin-tls-cert-file", adminCert, "--admin-tls-key-file", adminKey,
		"--worker-tls-cert-file", workerCert, "--worker-tls-key-file", workerKey}, &out))
	assert.Contains(t, out.String(), "certificate tls: CN=front, valid until ")
	assert.Contains(t, out.String(), " (90 days left)\n")
	assert.Contains(t, out.String(), "certificate admin_tls: CN=admin, valid until ")
	assert.Contains(t, out.String(), " (5h left)\n")
	assert.Contains(t, out.String(), "certificate worker_tls: CN=worker client, valid until "+old.Cert.NotAfter.UTC().Format(time.RFC3339)+" (EXPIRED)\n")
	assert.NotContains(t, out.String(), "revocation list")

	// And each issuer's revocation list, and when it is due.
	now := time.Now()
	next := now.Add(3 * 24 * time.Hour).Add(time.Hour)
	crls := testpki.WriteFile(t, "crls.pem", testpki.CRLPEM(ca.CRL(now.Add(-time.Hour), next, 9)))
	out.Reset()
	require.NoError(t, runCheck([]string{"--config", conf, "--tls-cert-file", front, "--tls-key-file", frontKey,
		"--tls-client-ca-file", testpki.WriteFile(t, "ca.pem", testpki.CertPEM(ca.Cert)), "--tls-client-crl-file", crls}, &out))
	assert.Contains(t, out.String(), "revocation list of CN=ca (tls.client_crl_file): next update "+next.UTC().Truncate(time.Second).Format(time.RFC3339)+" (3 days left)\n")

	notPEM := file("not.pem", "hello\n")
	for name, tc := range map[string]struct{ yaml, err string }{
		"api keys file":    {"api_keys_file: " + filepath.Join(dir, "none"), "api_keys_file"},
		"front end pair":   {"tls: {cert_file: " + notPEM + ", key_file: " + notPEM + "}", "key tls"},
		"workers' CA file": {"worker_tls: {ca_file: " + notPEM + "}", "key worker_tls.ca_file"},
		"etcd's CA file":   {"discovery: {etcd: {endpoints: ['127.0.0.1:2379'], ca_file: " + filepath.Join(dir, "none") + "}}", "discovery.etcd.ca_file"},
		"a bad key":        {"router: {mode: fastest}", "key router.mode"},
		"state file":       {"state_file: " + file("bad-state.json", "{not json"), "key state_file"},
	} {
		err := runCheck([]string{"--config", file(strings.ReplaceAll(name, " ", "-")+".yaml", tc.yaml)}, &out)
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), tc.err, name)
		assert.NotContains(t, err.Error(), "hello", "%s: a file's content is never quoted", name)
	}
	assert.Error(t, runCheck([]string{"--no-such-flag"}, &out))
}

// noUpgrade is an upgrader whose upgrades fail.
type noUpgrade struct{}

func (noUpgrade) Upgrade() error { return errors.New("no upgrade here") }
func (noUpgrade) Stop()          {}

// fakeUpgrade answers each Upgrade with the next of its results, once
// release lets it (a new process that takes its time to be ready).
type fakeUpgrade struct {
	results chan error
	stopped chan struct{}
	calls   atomic.Int32
}

func (u *fakeUpgrade) Upgrade() error {
	u.calls.Add(1)
	select {
	case err := <-u.results:
		return err
	case <-u.stopped:
		return errors.New("terminating")
	}
}

func (u *fakeUpgrade) Stop() { close(u.stopped) }

// SIGUSR2 upgrades: the admin API refuses changes and SIGHUP is ignored
// while the new process starts, a failed upgrade leaves the router serving and taking changes, a
// second SIGUSR2 while one is under way is ignored, and a ready new process has
// the router drain and handleSignals return. SIGTERM during an upgrade
// stops it (its process not yet ready is killed) and drains.
func TestSIGUSR2Upgrades(t *testing.T) {
	cfg := config.Default()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	var logged syncbuf.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	for i, end := range []string{"upgraded", "SIGTERM"} {
		r, err := router.Start(cfg, log)
		require.NoError(t, err)
		sig := make(chan os.Signal, 2)
		upg := &fakeUpgrade{results: make(chan error), stopped: make(chan struct{})}
		returned := make(chan error, 1)
		go func() { returned <- handleSignals(r, sig, log, func(int) { t.Error("no exit expected") }, upg) }()

		addWorker := func(id int) int {
			resp, err := http.Post("http://"+r.AdminAddr()+"/workers", "application/json",
				strings.NewReader(fmt.Sprintf(`{"id":%d,"url":"http://127.0.0.1:1"}`, id)))
			require.NoError(t, err)
			resp.Body.Close()
			return resp.StatusCode
		}
		sig <- syscall.SIGUSR2
		sig <- syscall.SIGUSR2 // ignored: one upgrade at a time (Upgrade would block the test otherwise)
		require.Eventually(t, func() bool { return upg.calls.Load() == 1 }, 5*time.Second, 5*time.Millisecond)
		assert.Equal(t, http.StatusServiceUnavailable, addWorker(7), "%s: the new process would not have the worker", end)
		sig <- syscall.SIGHUP
		require.Eventually(t, func() bool { return strings.Count(logged.String(), "SIGHUP ignored: an upgrade is under way") == i+1 },
			5*time.Second, 5*time.Millisecond, "%s: nor would it have a reload's config", end)
		upg.results <- errors.New("child exited: exit status 3")
		time.Sleep(50 * time.Millisecond) // the failure is handled
		assert.Equal(t, http.StatusCreated, addWorker(7), "%s: the upgrade failed: this process takes changes again", end)
		sig <- syscall.SIGUSR2
		time.Sleep(50 * time.Millisecond)
		select {
		case <-returned:
			t.Fatal("a failed upgrade must leave the router serving")
		default:
		}
		resp, err := http.Get("http://" + r.Addr() + "/health")
		require.NoError(t, err)
		resp.Body.Close()

		if end == "upgraded" {
			upg.results <- nil
		} else {
			sig <- syscall.SIGTERM
			select {
			case <-upg.stopped:
			case <-time.After(5 * time.Second):
				t.Fatal("SIGTERM did not stop the upgrade under way")
			}
		}
		select {
		case err := <-returned:
			assert.NoError(t, err, end)
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the router did not drain", end)
		}
		_, err = http.Get("http://" + r.Addr() + "/health")
		assert.Error(t, err, "%s: drained, the listener is closed", end)
		assert.EqualValues(t, 2, upg.calls.Load(), "%s: the SIGUSR2 sent during the first upgrade started none", end)
	}
}

func TestVersionNamesTheBuild(t *testing.T) {
	assert.Regexp(t, `^fastroute \S+, commit \S+.*, go1\.`, version())
}

func TestSIGHUPReloadsTheConfigFile(t *testing.T) {
	var mocks []*mockworker.Worker
	for id := uint64(1); id <= 2; id++ {
		m, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: id})
		require.NoError(t, err)
		defer m.Close()
		mocks = append(mocks, m)
	}
	path := filepath.Join(t.TempDir(), "fastroute.yaml")
	write := func(text string) { require.NoError(t, os.WriteFile(path, []byte(text), 0o600)) }
	write(fmt.Sprintf("workers:\n  - {id: 1, url: %q}\n", mocks[0].URL()))
	args := []string{"--config", path, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--mode", "round-robin"}
	cfg, err := loadServeConfig(args)
	require.NoError(t, err)
	var logged syncbuf.Buffer
	logs := logformat.New(&logged, cfg.Log.Format)
	log := logs.Logger()
	r, err := router.Start(cfg, log)
	require.NoError(t, err)
	r.SetConfigSource(func() (config.Config, error) { return loadServeConfig(args) })
	r.FormatLogsWith(logs.Set)

	sig := make(chan os.Signal, 2)
	returned := make(chan error, 1)
	go func() { returned <- handleSignals(r, sig, log, func(int) { t.Error("no exit expected") }, noUpgrade{}) }()

	write(fmt.Sprintf("workers:\n  - {id: 1, url: %q}\n  - {id: 2, url: %q}\n", mocks[0].URL(), mocks[1].URL()))
	sig <- syscall.SIGHUP
	require.Eventually(t, func() bool { return r.Registry.Snapshot().Len() == 2 }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, "round-robin", string(r.CurrentConfig().Router.Mode), "flags still override the file on reload")
	assert.Contains(t, logged.String(), `level=INFO msg="config reloaded"`)

	// A new log.format applies: the reload's own line is in it.
	write(fmt.Sprintf("log: {format: json}\nworkers:\n  - {id: 1, url: %q}\n  - {id: 2, url: %q}\n", mocks[0].URL(), mocks[1].URL()))
	sig <- syscall.SIGHUP
	require.Eventually(t, func() bool { return strings.Contains(logged.String(), `"msg":"config reloaded"`) }, 5*time.Second, 10*time.Millisecond)
	assert.Contains(t, logged.String(), `"applied":["log.format=json"]`)
	assert.Equal(t, "json", r.CurrentConfig().Log.Format)

	write("router: {mode: fastest}\n")
	sig <- syscall.SIGHUP
	time.Sleep(200 * time.Millisecond)
	assert.Equal(t, 2, r.Registry.Snapshot().Len(), "a bad file is refused and the running config stays")
	resp, err := http.Post("http://"+r.Addr()+"/v1/chat/completions", "application/json", strings.NewReader(`{"messages":[]}`))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)

	sig <- syscall.SIGTERM
	select {
	case err := <-returned:
		assert.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("SIGTERM did not drain an idle router")
	}
}

// The demo (make demo) runs to its end: every request answered, every
// reservation released, a conversation kept on one worker.
func TestDemo(t *testing.T) {
	require.NoError(t, runDemo(nil))
}

func TestPrefixSharingFlags(t *testing.T) {
	cfg, err := loadServeConfig([]string{"--prefix-affinity", "--prefix-affinity-peer", "http://10.0.0.2:8001",
		"--prefix-affinity-peer", "https://10.0.0.3:8001", "--prefix-affinity-share-interval", "20ms"})
	require.NoError(t, err)
	pa := cfg.Router.PrefixAffinity
	assert.True(t, pa.Enabled)
	assert.Equal(t, []string{"http://10.0.0.2:8001", "https://10.0.0.3:8001"}, pa.Peers)
	assert.Equal(t, 20*time.Millisecond, pa.ShareInterval)
	_, err = loadServeConfig([]string{"--prefix-affinity-peer", "10.0.0.2:8001"})
	require.ErrorContains(t, err, "router.prefix_affinity.peers")
	_, err = loadServeConfig([]string{"--prefix-affinity-advertise", "http://10.0.0.1:8001"})
	require.ErrorContains(t, err, "needs discovery.etcd.endpoints")
}

func TestRetryBudgetFlags(t *testing.T) {
	cfg, err := loadServeConfig(nil)
	require.NoError(t, err)
	assert.Equal(t, config.RetryBudget{MinRetries: 3}, cfg.Router.RetryBudget, "off by default")
	cfg, err = loadServeConfig([]string{"--retry-budget-percent", "20", "--retry-budget-min-retries", "5"})
	require.NoError(t, err)
	assert.Equal(t, config.RetryBudget{Percent: 20, MinRetries: 5}, cfg.Router.RetryBudget)
	_, err = loadServeConfig([]string{"--retry-budget-percent", "-1"})
	assert.ErrorContains(t, err, "router.retry_budget.percent")
}

// A worker's context length, health path and backup flag and the engine
// stall bound have their flags; a bad one is refused naming its key.
func TestContextAndStallFlags(t *testing.T) {
	cfg, err := loadServeConfig([]string{"--worker", "id=1,url=http://127.0.0.1:9001,max_model_len=4096,health_path=/api/version,backup=true",
		"--telemetry-engine-stall-after", "2m"})
	require.NoError(t, err)
	require.Len(t, cfg.Workers, 1)
	assert.Equal(t, 4096, cfg.Workers[0].MaxModelLen)
	assert.Equal(t, "/api/version", cfg.Workers[0].HealthPath)
	assert.True(t, cfg.Workers[0].Backup)
	_, err = loadServeConfig([]string{"--worker", "id=1,url=http://127.0.0.1:9001,backup=maybe"})
	assert.ErrorContains(t, err, "backup")
	assert.Equal(t, 2*time.Minute, cfg.Telemetry.Engine.StallAfter)
	cfg, err = loadServeConfig(nil)
	require.NoError(t, err)
	assert.Zero(t, cfg.Telemetry.Engine.StallAfter, "off by default")
	_, err = loadServeConfig([]string{"--worker", "id=1,url=http://127.0.0.1:9001,max_model_len=-1"})
	assert.ErrorContains(t, err, "max_model_len: -1 is negative")
	_, err = loadServeConfig([]string{"--telemetry-engine-stall-after", "-1s"})
	assert.ErrorContains(t, err, "telemetry.engine.stall_after")
}

// The size limits take units as the config's keys do; a bad size is
// refused naming the flag.
func TestSizeFlags(t *testing.T) {
	cfg, err := loadServeConfig([]string{"--max-body-bytes", "2MiB", "--answer-buffer-bytes", "64KiB", "--max-header-bytes", "10MB"})
	require.NoError(t, err)
	assert.Equal(t, config.Size(2<<20), cfg.Limits.MaxBodyBytes)
	assert.Equal(t, config.Size(64<<10), cfg.Limits.AnswerBufferBytes)
	assert.Equal(t, config.Size(10_000_000), cfg.Limits.MaxHeaderBytes)
	_, err = loadServeConfig([]string{"--max-body-bytes", "lots"})
	assert.ErrorContains(t, err, `invalid value "lots" for flag -max-body-bytes`)
}

// The prefill queue bound of disaggregation has its flag; off by default.
func TestMaxPrefillQueueFlag(t *testing.T) {
	cfg, err := loadServeConfig([]string{"--disagg-protocol", "vllm-nixl", "--disagg-max-prefill-queue", "2"})
	require.NoError(t, err)
	assert.Equal(t, 2, cfg.Router.Disaggregation.MaxPrefillQueue)
	cfg, err = loadServeConfig(nil)
	require.NoError(t, err)
	assert.Zero(t, cfg.Router.Disaggregation.MaxPrefillQueue, "off by default")
	_, err = loadServeConfig([]string{"--disagg-max-prefill-queue", "-1"})
	assert.ErrorContains(t, err, "router.disaggregation.max_prefill_queue: -1 is negative")
}

// A health probe's bound has its flag; 0, the probe period, by default.
func TestHealthTimeoutFlag(t *testing.T) {
	cfg, err := loadServeConfig([]string{"--health-timeout", "3s"})
	require.NoError(t, err)
	assert.Equal(t, 3*time.Second, cfg.Health.Timeout)
	cfg, err = loadServeConfig(nil)
	require.NoError(t, err)
	assert.Zero(t, cfg.Health.Timeout)
}

func TestTracingFlags(t *testing.T) {
	cfg, err := loadServeConfig(nil)
	require.NoError(t, err)
	assert.Equal(t, tracing.Config{SampleRatio: 1, ServiceName: "fastroute"}, cfg.Tracing, "off by default")
	cfg, err = loadServeConfig([]string{"--otlp-traces-endpoint", "http://collector:4318", "--trace-sample-ratio", "0.05"})
	require.NoError(t, err)
	assert.Equal(t, tracing.Config{OTLPEndpoint: "http://collector:4318", SampleRatio: 0.05, ServiceName: "fastroute"}, cfg.Tracing)
	_, err = loadServeConfig([]string{"--otlp-traces-endpoint", "collector:4317"})
	assert.ErrorContains(t, err, "tracing.otlp_endpoint")
	_, err = loadServeConfig([]string{"--trace-sample-ratio", "-1"})
	assert.ErrorContains(t, err, "tracing.sample_ratio")
}

func TestModelMirrorFlags(t *testing.T) {
	cfg, err := loadServeConfig([]string{"--model-mirror", "llama=llama-next:5", "--model-mirror", "qwen:7b=qwen:7b-fp8:0.5,max_inflight=8"})
	require.NoError(t, err)
	assert.Equal(t, []mirrors.Mirror{
		{Model: "llama", To: "llama-next", Percent: 5},
		{Model: "qwen:7b", To: "qwen:7b-fp8", Percent: 0.5, MaxInflight: 8},
	}, cfg.ModelMirrors, "the percent is after the shadow's last colon")
	for flag, want := range map[string]string{
		"llama":                 "is not MODEL=SHADOW:PERCENT",
		"=b:5":                  "is not MODEL=SHADOW:PERCENT",
		"a=b":                   "is not MODEL=SHADOW:PERCENT",
		"a=b:five":              `percent "five" is not a number`,
		"a=b:5,max=3":           "is not MODEL=SHADOW:PERCENT",
		"a=b:5,max_inflight=x":  `max_inflight "x" is not an integer`,
		"a=b:0":                 "key model_mirrors[0].percent: 0 is not above 0 and at most 100",
		"a=a:5":                 `key model_mirrors[0].to: "a" is the model mirrored`,
		"a=b:5,max_inflight=-1": "key model_mirrors[0].max_inflight: -1 is negative",
	} {
		_, err := loadServeConfig([]string{"--model-mirror", flag})
		assert.ErrorContains(t, err, want, flag)
	}
}

func TestModelAliasFlags(t *testing.T) {
	cfg, err := loadServeConfig([]string{"--model-alias", "food-review=food-review-v1:90,food-review-v2:10",
		"--model-alias", "gpt-4o=llama3:8b", "--model-alias", "local=qwen:7b:3,qwen:14b:1"})
	require.NoError(t, err)
	assert.Equal(t, []aliases.Alias{
		{Name: "food-review", Targets: []aliases.Target{{Model: "food-review-v1", Weight: 90}, {Model: "food-review-v2", Weight: 10}}},
		{Name: "gpt-4o", Targets: []aliases.Target{{Model: "llama3:8b"}}},
		{Name: "local", Targets: []aliases.Target{{Model: "qwen:7b", Weight: 3}, {Model: "qwen:14b", Weight: 1}}},
	}, cfg.ModelAliases, "digits after a model's last colon are its weight; other colons are its name's")
	cfg, err = loadServeConfig([]string{"--model-fallback", "chat=llama-70b,llama3:8b"})
	require.NoError(t, err)
	assert.Equal(t, []aliases.Alias{{Name: "chat", Fallback: true, Targets: []aliases.Target{{Model: "llama-70b"}, {Model: "llama3:8b"}}}},
		cfg.ModelAliases)
	_, err = loadServeConfig([]string{"--model-fallback", "chat=a:2,b"})
	assert.ErrorContains(t, err, "take no weight")
	for flag, want := range map[string]string{
		"food-review":              "is not NAME=MODEL",
		"=a":                       "is not NAME=MODEL",
		"x=a:99999999999999999999": "weight 99999999999999999999",
		"x=a:1,b:0":                "",
		"x=a:0,b:0":                `key model_aliases[0].targets: every weight of alias "x" is 0`,
	} {
		_, err := loadServeConfig([]string{"--model-alias", flag})
		if want == "" {
			assert.NoError(t, err, flag)
			continue
		}
		assert.ErrorContains(t, err, want, flag)
	}
}

// add_x_forwarded_for is off by default, and on from the config file or
// the flag.
func TestAddXForwardedForFlag(t *testing.T) {
	cfg, err := loadServeConfig(nil)
	require.NoError(t, err)
	assert.False(t, cfg.AddXForwardedFor, "off by default")
	cfg, err = loadServeConfig([]string{"--add-x-forwarded-for"})
	require.NoError(t, err)
	assert.True(t, cfg.AddXForwardedFor)
	conf := filepath.Join(t.TempDir(), "fastroute.yaml")
	require.NoError(t, os.WriteFile(conf, []byte("add_x_forwarded_for: true\n"), 0o600))
	cfg, err = loadServeConfig([]string{"--config", conf})
	require.NoError(t, err)
	assert.True(t, cfg.AddXForwardedFor)
}

// testUpgrader is the test process's one tableflip.Upgrader: tableflip
// allows one a process, even after its Stop, and a test run again
// (go test -count) reuses it.
var testUpgrader = sync.OnceValues(func() (*tableflip.Upgrader, error) { return tableflip.New(tableflip.Options{}) })

// The router's listeners: one that cannot be made fails with the system
// call's error alone (the router adds the key and the address: "listen
// 127.0.0.1:8000: bind: address already in use", where tableflip's and
// net's wrappings repeated the address twice more); a socket systemd
// passed serves its key once.
func TestListenViaSaysAFailureOnce(t *testing.T) {
	upg, err := testUpgrader()
	require.NoError(t, err)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	passed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	listen := listenVia(upg, map[string]net.Listener{"admin_listen": passed})

	_, err = listen("listen", taken.Addr().String())
	assert.EqualError(t, err, "bind: address already in use")
	got, err := listen("admin_listen", "127.0.0.1:0")
	require.NoError(t, err)
	assert.Equal(t, passed.Addr(), got.Addr(), "systemd's socket serves its key")
	again, err := listen("admin_listen", "127.0.0.1:0")
	require.NoError(t, err, "a new listener once the passed socket is taken")
	assert.NotEqual(t, passed.Addr(), again.Addr())
	require.NoError(t, got.Close())
	require.NoError(t, again.Close())
}

// --tls-client-auth sets how the client CAs apply; without them it is
// refused naming its key.
func TestTLSClientAuthFlag(t *testing.T) {
	cfg, err := loadServeConfig([]string{"--tls-cert-file", "c.pem", "--tls-key-file", "k.pem", "--tls-client-ca-file", "ca.pem", "--tls-client-auth", "optional"})
	require.NoError(t, err)
	assert.Equal(t, "optional", cfg.TLS.ClientAuth)
	_, err = loadServeConfig([]string{"--tls-client-auth", "optional"})
	assert.ErrorContains(t, err, "tls.client_auth")
}

// The admin_tls flags set the admin listener's certificate and the peers'
// CAs; a certificate without its key is refused naming the key.
func TestAdminTLSFlags(t *testing.T) {
	cfg, err := loadServeConfig([]string{"--admin-tls-cert-file", "a.pem", "--admin-tls-key-file", "a.key", "--admin-tls-peer-ca-file", "ca.pem"})
	require.NoError(t, err)
	assert.Equal(t, config.AdminTLS{CertFile: "a.pem", KeyFile: "a.key", PeerCAFile: "ca.pem"}, cfg.AdminTLS)
	_, err = loadServeConfig([]string{"--admin-tls-cert-file", "a.pem"})
	assert.ErrorContains(t, err, "key admin_tls: set cert_file and key_file together")
}

// --tls-client-crl-file names the client CAs' revocation lists; without
// the CAs it is refused naming its key.
func TestTLSClientCRLFileFlag(t *testing.T) {
	cfg, err := loadServeConfig([]string{"--tls-cert-file", "c.pem", "--tls-key-file", "k.pem", "--tls-client-ca-file", "ca.pem", "--tls-client-crl-file", "crl.pem"})
	require.NoError(t, err)
	assert.Equal(t, "crl.pem", cfg.TLS.ClientCRLFile)
	_, err = loadServeConfig([]string{"--tls-cert-file", "c.pem", "--tls-key-file", "k.pem", "--tls-client-crl-file", "crl.pem"})
	assert.ErrorContains(t, err, "key tls.client_crl_file: set, but tls.client_ca_file is not")
}
