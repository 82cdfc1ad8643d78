package main

import (
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/fastroute/fastroute/bench"
)

func runBench(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var o bench.OverheadOptions
	fs.IntVar(&o.Connections, "connections", 64, "concurrent client connections")
	fs.DurationVar(&o.Duration, "duration", 5e9, "load duration per target")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	return bench.RunOverhead(o)
}

func runBenchE2E(args []string) error {
	fs := flag.NewFlagSet("bench-e2e", flag.ContinueOnError)
	var o bench.E2EOptions
	fs.IntVar(&o.Connections, "connections", 64, "concurrent client connections")
	fs.DurationVar(&o.Duration, "duration", 5e9, "load duration per front end and workload")
	fs.IntVar(&o.Workers, "workers", 3, "mock worker processes")
	fs.IntVar(&o.Rounds, "rounds", 1, "rounds of every front end per workload, interleaved; the table shows each one's median round and the median of each round's ratios to nginx")
	fs.StringVar(&o.OutDir, "out", "bench/out", "directory for results.md and results.svg")
	frontList := fs.String("fronts", "", "comma-separated front ends to run (default: all): "+strings.Join(bench.Fronts(), ", "))
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *frontList != "" {
		o.Fronts = strings.Split(*frontList, ",")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	o.Binary = self
	_, err = bench.RunE2E(o)
	return err
}

func runBenchRouting(args []string) error {
	fs := flag.NewFlagSet("bench-routing", flag.ContinueOnError)
	o := bench.RoutingOptions{Loads: []float64{0.5, 0.8, 0.95}}
	fs.DurationVar(&o.Warmup, "warmup", 1250*time.Millisecond, "arrivals before the measured window, per router and load")
	fs.DurationVar(&o.Duration, "duration", 4*time.Second, "measured window of arrivals per router and load")
	fs.DurationVar(&o.Timeout, "timeout", 5*time.Second, "a request not answered by then counts as failed")
	fs.Uint64Var(&o.Seed, "seed", 1, "workload seed")
	fs.Float64Var(&o.PDLoad, "pd-load", 0.8, "load of the prefill/decode comparison, as a share of its fleet's capacity (0: skip it)")
	fs.Float64Var(&o.ConvLoad, "conversation-load", 0.8, "load of the conversation comparison (prefix-caching engines), as a share of its fleet's capacity without the cache (0: skip it)")
	fs.Float64Var(&o.JoinLoad, "join-load", 0.9, "load of the scale-up comparison (an engine joins the main comparison's fleet at the warm-up's end), as a share of the fleet's capacity before the join (0: skip it)")
	fs.Float64Var(&o.SlowJoinLoad, "slow-join-load", 0.9, "load of the scale-up comparison with a CPU-like engine joining, as a share of the fleet's capacity before the join (0: skip it)")
	fs.Float64Var(&o.RestartLoad, "restart-load", 0.9, "load of the restart comparison (the router starts at the warm-up's end in front of the main comparison's engines, busy with the warm-up through another router), as a share of the fleet's capacity (0: skip it)")
	fs.DurationVar(&o.MetricsDelay, "metrics-delay", 0, "every simulated engine answers its metrics page this long after it is asked, as a busy engine's API server does")
	fs.BoolVar(&o.ConvMixed, "conversation-mixed", false, "run the conversation comparison on the main comparison's mixed fleet (gpu-a, gpu-b, cpu) instead of three gpu-a")
	fs.StringVar(&o.OutDir, "out", "bench/out", "directory for routing.md and routing.svg")
	loads := fs.String("loads", "0.5,0.8,0.95", "offered loads as shares of the fleet's capacity (empty: skip this comparison)")
	routers := fs.String("routers", "", "comma-separated router names to run (default: all)")
	noMetrics := fs.String("no-metrics", "", "comma-separated simulated engines (gpu-a, gpu-b, cpu; gpu-1... of the other comparisons) whose metrics page answers 404, as SGLang's without --enable-metrics does")
	if err := fs.Parse(args); err != nil {
		return err
	}
	o.Loads = nil
	for _, l := range strings.Split(*loads, ",") {
		if *loads == "" { // the main comparison skipped
			break
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(l), 64)
		if err != nil || !(v > 0) {
			return fmt.Errorf("--loads: %q is not a positive share", l)
		}
		o.Loads = append(o.Loads, v)
	}
	if *routers != "" {
		o.Routers = strings.Split(*routers, ",")
	}
	if *noMetrics != "" {
		o.NoMetrics = strings.Split(*noMetrics, ",")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	o.Binary = self
	_, err = bench.RunRouting(o)
	return err
}

func runBenchStreams(args []string) error {
	fs := flag.NewFlagSet("bench-streams", flag.ContinueOnError)
	o := bench.StreamsOptions{}
	counts := fs.String("streams", "1000,5000,8000", "concurrent streams per run")
	fs.IntVar(&o.Chunks, "chunks", 64, "chunks per stream")
	fs.DurationVar(&o.Gap, "gap", 100*time.Millisecond, "the worker's pause before each chunk")
	fs.BoolVar(&o.Spread, "spread", false, "open the streams evenly over one gap, not all at once (chunks at a steady pace, not in bursts)")
	fs.StringVar(&o.OutDir, "out", "bench/out", "directory for streams.md")
	if err := fs.Parse(args); err != nil {
		return err
	}
	for _, c := range strings.Split(*counts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || n <= 0 {
			return fmt.Errorf("--streams: %q is not a positive count", c)
		}
		o.Counts = append(o.Counts, n)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	o.Binary = self
	_, err = bench.RunStreams(o)
	return err
}
