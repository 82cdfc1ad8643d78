package bench

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fastroute/fastroute/internal/loopback"
	"github.com/fastroute/fastroute/internal/syncbuf"
)

// E2EOptions configures RunE2E.
type E2EOptions struct {
	Binary      string // the fastroute binary (serve and mockworker run as their own processes)
	Workers     int
	Connections int
	Duration    time.Duration // load per front end and workload
	OutDir      string        // where results.md, results.json and results.svg go
	// Rounds of every front end per workload (0 or 1: one), the front ends
	// in a new order each round: the table shows each front end's median
	// round and the spread of its CPU per request. On a shared machine one
	// run's ratios move with the minute it ran in; rounds interleaved in
	// one run bear the same minutes.
	Rounds int
	// Fronts names the front ends to run (Fronts lists them); none: all.
	// A ratio to a reference left out (nginx-1w, nginx) is not shown.
	Fronts []string
}

// Workload is one request mix of the comparison.
type Workload struct {
	Name  string
	Path  string
	Body  []byte
	Mocks []string // mockworker flags
}

// Workloads are the request mixes: short non-streaming answers (the router's
// own cost dominates), the same answers to a 16 KB prompt, and SSE streams
// of 16 chunks 1 ms apart.
var Workloads = []Workload{
	{Name: "non-streaming", Path: "/v1/chat/completions", Body: OverheadBody,
		Mocks: []string{"--tokens", "4", "--token-interval", "0s"}},
	{Name: "long-prompt", Path: "/v1/chat/completions", Body: longPromptBody,
		Mocks: []string{"--tokens", "4", "--token-interval", "0s"}},
	{Name: "streaming", Path: "/v1/chat/completions",
		Body:  []byte(`{"model":"mock-model","stream":true,"messages":[{"role":"user","content":"hi"}]}`),
		Mocks: []string{"--tokens", "16", "--token-interval", "1ms"}},
}

// longPromptBody is a non-streaming chat request whose prompt is 16 KB
// (about 4,000 tokens): every front end reads and forwards the whole body.
var longPromptBody = fmt.Appendf(nil, `{"model":"mock-model","messages":[{"role":"user","content":%q}]}`,
	strings.Repeat("The quick brown fox jumps over the lazy dog. ", 16<<10/45))

// Row is one front end's figures on one workload.
type Row struct {
	Workload, Front string
	Result          Result
	// The least and most CPU per request over the rounds (E2EOptions.Rounds),
	// both zero after one round.
	CPULeast, CPUMost time.Duration
	// Each round's ratio of the front end's CPU per request to nginx-1w's
	// and of its p99 to nginx's in the same round, their median over the
	// rounds (CPURatio: with the least and most), 0 where not measured
	// (workloadRows). A round's front ends run within the same half minute,
	// so these ratios move less with this shared machine's slower minutes
	// than the ratio of two median rounds, which may come from different
	// rounds.
	CPURatio, CPURatioLeast, CPURatioMost, P99Ratio float64
	// UserRatio is the median over the rounds of the ratio of the front
	// end's user-space CPU per request to nginx-1w's: where a CPU ratio
	// above 1 comes from (the kernel's part is the same system calls on
	// the same loopback for every proxy).
	UserRatio float64
}

// startFunc starts a front end before the workers and returns its address
// and process (stopped with terminate).
type startFunc func(bin, dir string, workers []string) (addr string, p *exec.Cmd, err error)

// front is one front end of the comparison.
type front struct {
	name  string
	start startFunc
}

var fronts = []front{
	{"direct", nil},
	{"fastroute", startFastroute},
	{"nginx", nginxFront("least_conn;", "auto")},
	{"nginx-1w", nginxFront("least_conn;", "1")},
	{"haproxy", startHAProxy},
	{"floor-goroutines", floorFront("goroutines")},
	{"floor-epoll", floorFront("epoll")},
	{"floor-coroutines", floorFront("coroutines")},
}

// Fronts are the names of bench-e2e's front ends, in the order it runs
// them.
func Fronts() []string {
	names := make([]string, len(fronts))
	for i, f := range fronts {
		names[i] = f.name
	}
	return names
}

// chosenFronts are the front ends names names (all of them for none), in
// fronts' order.
func chosenFronts(names []string) ([]front, error) {
	if len(names) == 0 {
		return fronts, nil
	}
	for _, n := range names {
		if !slices.ContainsFunc(fronts, func(f front) bool { return f.name == n }) {
			return nil, fmt.Errorf("no front end %q (%s)", n, strings.Join(Fronts(), ", "))
		}
	}
	return slices.DeleteFunc(slices.Clone(fronts), func(f front) bool { return !slices.Contains(names, f.name) }), nil
}

// RunE2E runs every workload against every front end, one after the other
// on this machine, with the same load generator, and writes the table and
// the latency plot to OutDir.
func RunE2E(o E2EOptions) ([]Row, error) {
	fronts, err := chosenFronts(o.Fronts)
	if err != nil {
		return nil, err
	}
	for _, f := range fronts {
		tool, _, _ := strings.Cut(f.name, "-")
		if tool != "nginx" && tool != "haproxy" {
			continue
		}
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%s not found (make bench-e2e installs it from Debian packages)", tool)
		}
	}
	if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "fastroute-e2e")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var rows []Row
	for _, wl := range Workloads {
		workers, stopWorkers, err := startMocks(o.Binary, o.Workers, wl.Mocks)
		if err != nil {
			return nil, err
		}
		rounds := make([][]Result, len(fronts))
		for round := range max(o.Rounds, 1) {
			for k := range fronts {
				i := (k + round) % len(fronts) // each round starts one front end later
				r, err := runFront(fronts[i], dir, workers, wl, o)
				if err != nil {
					stopWorkers()
					return nil, fmt.Errorf("%s, %s: %w", wl.Name, fronts[i].name, err)
				}
				fmt.Printf("  %-14s %s\n", wl.Name, r)
				rounds[i] = append(rounds[i], r)
			}
		}
		stopWorkers()
		rows = append(rows, workloadRows(wl.Name, fronts, rounds)...)
	}
	table := Table(rows, o)
	if err := os.WriteFile(filepath.Join(o.OutDir, "results.md"), []byte(table), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(o.OutDir, "results.svg"), []byte(Plot(rows)), 0o644); err != nil {
		return nil, err
	}
	fmt.Print("\n" + table)
	return rows, nil
}

// workloadRows are a workload's rows, one per front end, from rounds
// (rounds[i]: fronts[i]'s, in the order they ran): its median round
// (medianRow) and its ratios to the references of each round (Row), none
// to a reference that did not run.
func workloadRows(workload string, fronts []front, rounds [][]Result) []Row {
	cpuRef := slices.IndexFunc(fronts, func(f front) bool { return f.name == "nginx-1w" })
	p99Ref := slices.IndexFunc(fronts, func(f front) bool { return f.name == "nginx" })
	cpu := func(r Result) float64 { return float64(r.CPUPerRequest) }
	user := func(r Result) float64 { return float64(r.UserCPUPerRequest) }
	p99 := func(r Result) float64 { return float64(r.P99) }
	rows := make([]Row, 0, len(fronts))
	for i, f := range fronts {
		row := medianRow(workload, f.name, rounds[i])
		if cpuRef >= 0 {
			row.CPURatio, row.CPURatioLeast, row.CPURatioMost = perRound(rounds[i], rounds[cpuRef], cpu)
			row.UserRatio, _, _ = perRound(rounds[i], rounds[cpuRef], user)
		}
		if p99Ref >= 0 {
			row.P99Ratio, _, _ = perRound(rounds[i], rounds[p99Ref], p99)
		}
		rows = append(rows, row)
	}
	return rows
}

// perRound returns the median (of an even count, the upper of the middle
// two), least and most over the rounds k of value(rs[k]) / value(ref[k]),
// leaving out rounds where either is 0; all 0 when none is left.
func perRound(rs, ref []Result, value func(Result) float64) (median, least, most float64) {
	var q []float64
	for k := range min(len(rs), len(ref)) {
		if a, b := value(rs[k]), value(ref[k]); a > 0 && b > 0 {
			q = append(q, a/b)
		}
	}
	if len(q) == 0 {
		return 0, 0, 0
	}
	slices.Sort(q)
	return q[len(q)/2], q[0], q[len(q)-1]
}

// medianRow is the row of a front end's median round of rs: by CPU per
// request, or by req/s for a front end whose CPU is not measured (direct),
// with the spread of its CPU over the rounds.
func medianRow(workload, front string, rs []Result) Row {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b Result) int {
		if c := cmp.Compare(a.CPUPerRequest, b.CPUPerRequest); c != 0 {
			return c
		}
		return cmp.Compare(a.RPS(), b.RPS())
	})
	row := Row{Workload: workload, Front: front, Result: rs[len(rs)/2]}
	if len(rs) > 1 {
		row.CPULeast, row.CPUMost = rs[0].CPUPerRequest, rs[len(rs)-1].CPUPerRequest
	}
	return row
}

func runFront(f front, dir string, workers []string, wl Workload, o E2EOptions) (Result, error) {
	targets := workers
	pid := 0
	var p *exec.Cmd
	if f.start != nil {
		addr, started, err := f.start(o.Binary, dir, workers)
		if err != nil {
			return Result{}, err
		}
		p = started
		defer terminate(p)
		targets, pid = []string{addr}, p.Process.Pid
	}
	if err := waitAnswer(targets[0], wl.Path, wl.Body); err != nil {
		return Result{}, notUp(err, p)
	}
	LoadSpread("warmup", targets, wl.Path, wl.Body, o.Connections, o.Duration/5)
	cpu0 := treeCPU(pid)
	r := LoadSpread(f.name, targets, wl.Path, wl.Body, o.Connections, o.Duration)
	if pid != 0 && r.Requests > 0 {
		cpu := treeCPU(pid)
		r.CPUPerRequest = (cpu.total() - cpu0.total()) / time.Duration(r.Requests)
		r.UserCPUPerRequest = (cpu.user - cpu0.user) / time.Duration(r.Requests)
		r.PeakRSS = treePeakRSS(pid)
	}
	if r.Errors > 0 {
		return r, fmt.Errorf("%d requests failed", r.Errors)
	}
	return r, nil
}

// startMocks starts n mockworker processes (ids 1..n) and waits until they answer.
func startMocks(bin string, n int, flags []string) ([]string, func(), error) {
	var addrs []string
	var stops []func()
	stop := func() {
		for _, s := range stops {
			s()
		}
	}
	for i := 1; i <= n; i++ {
		addr, s, err := startMock(bin, i, flags)
		if err != nil {
			stop()
			return nil, nil, err
		}
		addrs, stops = append(addrs, addr), append(stops, s)
	}
	return addrs, stop, nil
}

// startMock starts one mockworker process and waits until it answers.
func startMock(bin string, id int, flags []string) (string, func(), error) {
	addr, p, err := spawnListening(bin, func(addr string) ([]string, error) {
		return append([]string{"mockworker", "--listen", addr, "--id", strconv.Itoa(id)}, flags...), nil
	})
	if err != nil {
		return "", nil, err
	}
	if err := waitHealth(addr); err != nil {
		terminate(p)
		return "", nil, notUp(err, p)
	}
	return addr, func() { terminate(p) }, nil
}

func startFastroute(bin, _ string, workers []string) (string, *exec.Cmd, error) {
	// least-loaded against nginx's least_conn and HAProxy's leastconn;
	// client connections as long-lived as nginx's (keepalive_requests).
	return startServe(bin, workers, "--mode", "least-loaded", "--busy-threshold", "0", "--telemetry-nvml=false", "--telemetry-cpu=false",
		"--max-requests-per-connection", "1000000")
}

// startServe starts `fastroute serve` with the extra flags in front of
// workers ("host:port", maybe followed by more --worker keys:
// "host:port,role=decode"), ids from 1.
func startServe(bin string, workers []string, flags ...string) (string, *exec.Cmd, error) {
	admin, err := loopback.FreeAddr()
	if err != nil {
		return "", nil, err
	}
	return startServeAdmin(bin, admin, workers, flags...)
}

// startServeAdmin is startServe with its admin listener on admin.
func startServeAdmin(bin, admin string, workers []string, flags ...string) (string, *exec.Cmd, error) {
	return spawnListening(bin, func(addr string) ([]string, error) {
		args := append([]string{"serve", "--listen", addr, "--admin-listen", admin}, flags...)
		for i, w := range workers {
			args = append(args, "--worker", fmt.Sprintf("id=%d,url=http://%s", i+1, w))
		}
		return args, nil
	})
}

// floorFront returns the start function of `fastroute floor` (the
// reference proxy of package floor) serving in model.
func floorFront(model string) startFunc {
	return func(bin, _ string, workers []string) (string, *exec.Cmd, error) {
		return spawnListening(bin, func(addr string) ([]string, error) {
			return append([]string{"floor", "--model", model, "--listen", addr}, workers...), nil
		})
	}
}

// nginxFront returns the start function of nginx with the upstream
// balancing directive balance ("" is nginx's weighted round-robin) and
// worker_processes processes ("auto": one per CPU).
func nginxFront(balance, processes string) startFunc {
	return func(_, dir string, workers []string) (string, *exec.Cmd, error) {
		return startNginxConf(dir, workers, balance, processes)
	}
}

func startNginxConf(dir string, workers []string, balance, processes string) (string, *exec.Cmd, error) {
	var servers strings.Builder
	for _, w := range workers {
		fmt.Fprintf(&servers, "    server %s;\n", w)
	}
	conf := func(addr string) string {
		return fmt.Sprintf(`daemon off;
worker_processes %[5]s;
pid %[1]s/nginx.pid;
error_log %[1]s/nginx-error.log warn;
worker_rlimit_nofile 20000;
events { worker_connections 20000; }
http {
  access_log off;
  client_body_buffer_size 1m;  # prompts stay in memory (the default, 16k, spills them to disk)
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  upstream workers {
    %[4]s
%[2]s    keepalive 256;
  }
  server {
    listen %[3]s;
    keepalive_requests 1000000;
    location / {
      proxy_pass http://workers;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
`, dir, servers.String(), addr, balance, processes)
	}
	return startProxy(dir, "nginx.conf", conf, "nginx", func(path string) []string {
		return []string{"-p", dir, "-c", path, "-e", filepath.Join(dir, "nginx-error.log")}
	})
}

func startHAProxy(_, dir string, workers []string) (string, *exec.Cmd, error) {
	var servers strings.Builder
	for i, w := range workers {
		fmt.Fprintf(&servers, "  server w%d %s\n", i+1, w)
	}
	conf := func(addr string) string {
		return fmt.Sprintf(`global
  nbthread 2
  maxconn 4096
defaults
  mode http
  timeout connect 2s
  timeout client 60s
  timeout server 60s
  option http-keep-alive
  http-reuse always
frontend fe
  bind %s
  default_backend workers
backend workers
  balance leastconn
%s`, addr, servers.String())
	}
	return startProxy(dir, "haproxy.cfg", conf, "haproxy", func(path string) []string { return []string{"-db", "-f", path} })
}

// startProxy picks a free address, writes conf(addr) to dir/file and starts
// bin with args(path of that file).
func startProxy(dir, file string, conf func(addr string) string, bin string, args func(path string) []string) (string, *exec.Cmd, error) {
	return spawnListening(bin, func(addr string) ([]string, error) {
		path := filepath.Join(dir, file)
		if err := os.WriteFile(path, []byte(conf(addr)), 0o644); err != nil {
			return nil, err
		}
		return args(path), nil
	})
}

// spawnListening picks a free address and starts bin with the arguments
// argsFor makes for it (spawn), returning the address and the process.
func spawnListening(bin string, argsFor func(addr string) ([]string, error)) (string, *exec.Cmd, error) {
	addr, err := loopback.FreeAddr()
	if err != nil {
		return "", nil, err
	}
	args, err := argsFor(addr)
	if err != nil {
		return "", nil, err
	}
	p, err := spawn(bin, args...)
	if err != nil {
		return "", nil, err
	}
	return addr, p, nil
}

// spawn starts a child process, keeping the end of what it writes for
// the error of a wait for it to answer (notUp).
func spawn(bin string, args ...string) (*exec.Cmd, error) {
	p := exec.Command(bin, args...)
	out := &syncbuf.Buffer{Last: outputTailMax}
	p.Stdout, p.Stderr = out, out
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	return p, nil
}

// outputTailMax is how much of a child's output spawn keeps.
const outputTailMax = 4 << 10

// notUp adds to err, the failure of a wait for the child p to answer, the
// end of what p wrote: why a front end or worker did not come up (a port
// taken, a flag refused). p may be nil (no child: the workers direct).
func notUp(err error, p *exec.Cmd) error {
	if p == nil {
		return err
	}
	out, ok := p.Stderr.(*syncbuf.Buffer)
	if !ok || out.String() == "" {
		return fmt.Errorf("%w (%s wrote nothing)", err, filepath.Base(p.Path))
	}
	return fmt.Errorf("%w; %s wrote:\n%s", err, filepath.Base(p.Path), strings.TrimSpace(out.String()))
}

func terminate(p *exec.Cmd) {
	_ = p.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		_ = p.Process.Kill()
		<-done
	}
}

func waitHealth(addr string) error {
	return retryFor(5*time.Second, func() error {
		resp, err := http.Get("http://" + addr + "/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("health: %s", resp.Status)
		}
		return nil
	})
}

// waitAnswer waits until the front answers one real request.
func waitAnswer(addr, path string, body []byte) error {
	return retryFor(10*time.Second, func() error {
		resp, err := http.Post("http://"+addr+path, "application/json", strings.NewReader(string(body)))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s answered %s", addr, resp.Status)
		}
		return nil
	})
}

func retryFor(d time.Duration, fn func() error) error { return retryEvery(d, 50*time.Millisecond, fn) }

// retryEvery calls fn every pause until it succeeds, for d at most.
func retryEvery(d, pause time.Duration, fn func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := fn()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.Join(errors.New("not ready in time"), err)
		}
		time.Sleep(pause)
	}
}
