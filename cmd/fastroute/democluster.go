package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/dataplane/router"
	"github.com/fastroute/fastroute/discovery"
	"github.com/fastroute/fastroute/discovery/etcdlocal"
)

// runDemoCluster runs a local etcd (the etcd binary), two router replicas
// that discover their workers on it, and three mock workers that register
// themselves; it sends requests through both replicas, then kills one
// worker's process state (its registration lapses) and times how long
// each replica takes to drop it.
func runDemoCluster(args []string) error {
	fs := flag.NewFlagSet("demo-cluster", flag.ContinueOnError)
	ttl := fs.Duration("ttl", 2*time.Second, "workers' lease TTL")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "fastroute-etcd")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	etcd, err := etcdlocal.Start(dir)
	if errors.Is(err, etcdlocal.ErrNotInstalled) {
		return fmt.Errorf("%w; `make demo-cluster` installs it", err)
	}
	if err != nil {
		return err
	}
	defer etcd.Stop()
	endpoint := etcd.Endpoint
	opts := discovery.Options{Endpoints: []string{endpoint}, Prefix: "/demo", DialTimeout: 2 * time.Second}

	var routers []*router.Router
	for i := 0; i < 2; i++ {
		cfg := config.Default()
		cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
		cfg.Health.Interval = 200 * time.Millisecond
		cfg.Discovery.Etcd = config.Etcd{Endpoints: opts.Endpoints, Prefix: opts.Prefix, DialTimeout: opts.DialTimeout}
		r, err := router.Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			return err
		}
		defer r.Close()
		routers = append(routers, r)
	}
	fmt.Printf("fastroute demo-cluster: etcd on %s, routers on %s and %s, prefix %s\n", endpoint, routers[0].Addr(), routers[1].Addr(), opts.Prefix)

	var regs []*discovery.Registration
	for id := uint64(1); id <= 3; id++ {
		m, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: id, Tokens: 4})
		if err != nil {
			return err
		}
		defer m.Close()
		reg, err := discovery.Register(opts, dataplane.WorkerSpec{ID: id, URL: m.URL()}, *ttl)
		if err != nil {
			return err
		}
		regs = append(regs, reg)
		fmt.Printf("  worker %d on %s registered as %s (lease %v)\n", id, m.Addr(), reg.Key(), *ttl)
	}
	defer func() {
		for _, r := range regs[1:] {
			_ = r.Close()
		}
	}()
	if err := waitRoutable(routers, 3, 5*time.Second); err != nil {
		return err
	}
	client := &http.Client{Timeout: 5 * time.Second}
	for _, session := range []string{"alice", "bob", "carol"} {
		var on []string
		for _, r := range routers {
			req, _ := http.NewRequest(http.MethodPost, "http://"+r.Addr()+"/v1/chat/completions", strings.NewReader(`{"model":"mock-model","messages":[]}`))
			req.Header.Set("x-session-id", session)
			resp, err := client.Do(req)
			if err != nil {
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			on = append(on, resp.Header.Get("x-fastroute-worker"))
		}
		fmt.Printf("  session %-6s -> worker %s through replica 1, worker %s through replica 2\n", session, on[0], on[1])
		if on[0] != on[1] {
			return fmt.Errorf("the replicas placed session %s apart", session)
		}
	}

	fmt.Printf("\nworker 1's registrar dies (its lease is no longer kept alive):\n")
	if err := regs[0].Abandon(); err != nil {
		return err
	}
	start := time.Now()
	for i, r := range routers {
		for r.Registry.Snapshot().Has(1) {
			if time.Since(start) > *ttl+5*time.Second {
				return fmt.Errorf("replica %d still routes to worker 1", i+1)
			}
			time.Sleep(20 * time.Millisecond)
		}
		fmt.Printf("  replica %d dropped worker 1 after %v (lease TTL %v)\n", i+1, time.Since(start).Round(10*time.Millisecond), *ttl)
	}
	fmt.Println("\ndemo-cluster ok")
	return nil
}

func waitRoutable(routers []*router.Router, n int, within time.Duration) error {
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		ready := 0
		for _, r := range routers {
			if r.Registry.Snapshot().Len() == n {
				ready++
			}
		}
		if ready == len(routers) {
			return nil
		}
	}
	return fmt.Errorf("the routers did not find %d workers on etcd within %v", n, within)
}
