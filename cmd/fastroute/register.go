package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/discovery"
)

// etcdFlags are the flags that put a worker on etcd.
type etcdFlags struct {
	endpoints, prefix string
	dialTimeout, ttl  time.Duration
}

// bindEtcdFlags registers --etcd and the other flags, named with pre
// before them (--<pre>prefix, --<pre>ttl...).
func bindEtcdFlags(fs *flag.FlagSet, pre string) *etcdFlags {
	e := &etcdFlags{}
	fs.StringVar(&e.endpoints, "etcd", "", "comma-separated etcd endpoints (host:port) to register on")
	fs.StringVar(&e.prefix, pre+"prefix", "/fastroute", "etcd key prefix (the worker is <prefix>/workers/<id>)")
	fs.DurationVar(&e.dialTimeout, pre+"dial-timeout", 2*time.Second, "etcd connect timeout")
	fs.DurationVar(&e.ttl, pre+"ttl", 10*time.Second, "lease TTL: routers drop the worker this long after its registrar dies")
	return e
}

func (e *etcdFlags) register(spec dataplane.WorkerSpec) (*discovery.Registration, error) {
	return discovery.Register(discovery.Options{Endpoints: strings.Split(e.endpoints, ","), Prefix: e.prefix, DialTimeout: e.dialTimeout}, spec, e.ttl)
}

// runRegister keeps a worker's key alive on etcd as a sidecar, and removes
// it on SIGTERM or SIGINT.
func runRegister(args []string) error {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	return registerUntil(args, sig)
}

// registerUntil registers the worker the flags describe until a signal.
func registerUntil(args []string, sig <-chan os.Signal) error {
	fs := flag.NewFlagSet("register", flag.ContinueOnError)
	e := bindEtcdFlags(fs, "")
	var spec dataplane.WorkerSpec
	fs.Uint64Var(&spec.ID, "id", 0, "worker id (required)")
	fs.StringVar(&spec.URL, "url", "", "worker address, http://host:port, https://host:port or unix:/path (required)")
	fs.Func("device", "gpu or cpu (default cpu)", func(v string) error { spec.Device = dataplane.Device(v); return nil })
	fs.IntVar(&spec.GPUIndex, "gpu-index", 0, "GPU index (NVML) of a gpu worker")
	fs.IntVar(&spec.DPSize, "dp-size", 1, "data-parallel ranks")
	fs.Float64Var(&spec.Capacity, "capacity", 1, "static capacity")
	loras := fs.String("loras", "", "comma-separated LoRA adapters it holds")
	models := fs.String("models", "", "comma-separated base models it serves (beside those its /v1/models lists)")
	fs.StringVar(&spec.MetricsPath, "metrics-path", "/metrics", "engine metrics path")
	fs.StringVar(&spec.HealthPath, "health-path", "", "path of its health probes (default: the routers' health.path)")
	fs.IntVar(&spec.MaxInflight, "max-inflight", 0, "its in-flight cap and batch size (0: learned)")
	fs.Func("role", "prefill, decode or both (default both)", func(v string) error { spec.Role = dataplane.Role(v); return nil })
	fs.IntVar(&spec.BootstrapPort, "bootstrap-port", 0, "SGLang bootstrap port of a prefill worker")
	fs.BoolVar(&spec.Backup, "backup", false, "a backup: it takes a request only when no other worker can")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if e.endpoints == "" {
		return errors.New("--etcd: endpoints required")
	}
	if *loras != "" {
		spec.LoRAs = strings.Split(*loras, ",")
	}
	if *models != "" {
		spec.Models = strings.Split(*models, ",")
	}
	reg, err := e.register(spec)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "worker %d registered as %s (lease %v)\n", spec.ID, reg.Key(), e.ttl)
	<-sig
	return reg.Close()
}
