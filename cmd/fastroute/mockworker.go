package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/fastroute/fastroute/bench/mockworker"
)

func runMockWorker(args []string) error {
	fs := flag.NewFlagSet("mockworker", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:9001", "listen address")
	var o mockworker.Options
	fs.Uint64Var(&o.ID, "id", 1, "worker id (echoed in answers)")
	fs.IntVar(&o.Tokens, "tokens", 8, "chunks per answer")
	fs.DurationVar(&o.TokenInterval, "token-interval", 0, "pause before each chunk")
	fs.StringVar(&o.Model, "model", "mock-model", "model name")
	loras := fs.String("loras", "", "comma-separated LoRA adapters to advertise")
	fs.Float64Var(&o.FailRate, "fail-rate", 0, "share of requests answered 500")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *loras != "" {
		o.LoRAs = strings.Split(*loras, ",")
	}
	if o.FailRate < 0 || o.FailRate > 1 {
		return fmt.Errorf("--fail-rate %v is outside 0..1", o.FailRate)
	}
	w, err := mockworker.Start(*listen, o)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "mockworker %d listening on %s\n", o.ID, w.Addr())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	return w.Close()
}
