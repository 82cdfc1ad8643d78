package main

import (
	"flag"
	"os"
	"runtime/pprof"

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
	fs.StringVar(&o.OutDir, "out", "bench/out", "directory for results.md and results.svg")
	if err := fs.Parse(args); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	o.Binary = self
	_, err = bench.RunE2E(o)
	return err
}
