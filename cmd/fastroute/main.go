// Command fastroute is a low-latency request router for LLM inference
// workers. Subcommands: serve, mockworker, demo, bench, bench-e2e.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/fastroute/fastroute/dataplane/metrics"
)

const usage = `usage: fastroute <command> [flags]

commands:
  serve       run the router (--config FILE, flags override the file;
              SIGHUP reloads, SIGUSR2 upgrades, SIGTERM drains)
  check       read the config as serve would (files, certificates) and start nothing
              (--print: the config that would run, secrets redacted)
  register    keep a worker's key alive on etcd for discovering routers (--etcd, --id, --url)
  mockworker  run an OpenAI-compatible fake worker (--etcd: registered on etcd)
  demo        run 3 mock workers and the router, send real requests, print the split
  demo-cluster  a local etcd, two router replicas, three registered mock workers; one dies
  bench       measure routing overhead against direct calls to a mock worker
  bench-e2e   fastroute, nginx, HAProxy and direct side by side (mock worker processes)
  bench-routing  routing quality on simulated engines: every mode beside nginx
  bench-streams  thousands of concurrent SSE streams through fastroute and nginx
  floor       bench-e2e's reference proxy: the least a Go proxy does (--model goroutines|epoll|coroutines)
  version     print the module version and commit
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "serve":
		err = runServe(args)
	case "check":
		err = runCheck(args, os.Stdout)
	case "register":
		err = runRegister(args)
	case "mockworker":
		err = runMockWorker(args)
	case "demo":
		err = runDemo(args)
	case "demo-cluster":
		err = runDemoCluster(args)
	case "bench":
		err = runBench(args)
	case "bench-e2e":
		err = runBenchE2E(args)
	case "bench-routing":
		err = runBenchRouting(args)
	case "bench-streams":
		err = runBenchStreams(args)
	case "floor":
		err = runFloor(args)
	case "version", "--version", "-version":
		fmt.Println(version())
	case "-h", "--help", "help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "fastroute: unknown command %q\n\n%s", cmd, usage)
		os.Exit(2)
	}
	if errors.Is(err, flag.ErrHelp) {
		return // the flag set printed its usage: a request for help is no failure
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fastroute:", err)
		os.Exit(1)
	}
}

// version describes the build: module version, VCS commit and Go version.
func version() string {
	b, ok := metrics.ReadBuild()
	if !ok {
		return "fastroute (no build information)"
	}
	modified := ""
	if b.Modified {
		modified = " (modified)"
	}
	return fmt.Sprintf("fastroute %s, commit %s%s, %s", b.Version, b.Commit, modified, b.GoVersion)
}
