// Command fastroute is a low-latency request router for LLM inference
// workers. Subcommands: serve, mockworker, demo, bench, bench-e2e.
package main

import (
	"fmt"
	"os"
)

const usage = `usage: fastroute <command> [flags]

commands:
  serve       run the router (--config FILE, flags override the file)
  mockworker  run an OpenAI-compatible fake worker
  demo        run 3 mock workers and the router, send real requests, print the split
  bench       measure routing overhead against direct calls to a mock worker
  bench-e2e   fastroute, nginx, HAProxy and direct side by side (mock worker processes)
  bench-routing  routing quality on simulated engines: every mode beside nginx
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
	case "mockworker":
		err = runMockWorker(args)
	case "demo":
		err = runDemo(args)
	case "bench":
		err = runBench(args)
	case "bench-e2e":
		err = runBenchE2E(args)
	case "bench-routing":
		err = runBenchRouting(args)
	case "-h", "--help", "help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "fastroute: unknown command %q\n\n%s", cmd, usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fastroute:", err)
		os.Exit(1)
	}
}
