package main

import (
	"flag"

	"github.com/fastroute/fastroute/bench"
)

func runBench(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var o bench.OverheadOptions
	fs.IntVar(&o.Connections, "connections", 64, "concurrent client connections")
	fs.DurationVar(&o.Duration, "duration", 5e9, "load duration per target")
	if err := fs.Parse(args); err != nil {
		return err
	}
	return bench.RunOverhead(o)
}
