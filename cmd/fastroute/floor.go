package main

import (
	"errors"
	"flag"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/fastroute/fastroute/bench/floor"
)

// runFloor runs one of package floor's reference proxies (bench-e2e's
// floor-goroutines, floor-epoll and floor-coroutines) until SIGTERM or
// SIGINT.
func runFloor(args []string) error {
	fs := flag.NewFlagSet("floor", flag.ContinueOnError)
	model := fs.String("model", "goroutines", "how connections are served: goroutines (one per client connection, Go's poller), epoll (one event loop) or coroutines (the goroutines model's code as coroutines of one event loop)")
	listen := fs.String("listen", "127.0.0.1:9100", "listen address")
	fs.Usage = func() {
		fs.Output().Write([]byte("usage: fastroute floor [--model goroutines|epoll|coroutines] [--listen ADDR] WORKER_HOST:PORT...\n"))
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return errors.New("floor: name the workers (host:port)")
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	stop, err := floor.Start(*model, ln.(*net.TCPListener), fs.Args())
	if err != nil {
		_ = ln.Close()
		return err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	stop()
	return nil
}
