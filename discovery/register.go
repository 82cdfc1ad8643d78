package discovery

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Registration keeps one worker's key, or one router replica's, alive on
// etcd.
type Registration struct {
	cli    *clientv3.Client
	key    string
	lease  clientv3.LeaseID
	cancel context.CancelFunc
	done   chan struct{}
}

// Register puts spec under <prefix>/workers/<id> on a lease of ttl and keeps
// the lease alive until Close (which deletes the key) or until the process
// dies (the lease expires after ttl and every router drains the worker).
func Register(o Options, spec dataplane.WorkerSpec, ttl time.Duration) (*Registration, error) {
	if err := spec.Normalize(); err != nil {
		return nil, err
	}
	value, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	r, err := register(context.Background(), o, WorkersKey, strconv.FormatUint(spec.ID, 10), value, ttl)
	if err != nil {
		return nil, fmt.Errorf("register worker %d on etcd: %w", spec.ID, err)
	}
	return r, nil
}

// RegisterRouter puts a router replica's admin listener (adminURL, as its
// peers reach it) under <prefix>/routers/, on a lease of ttl kept alive
// until Close: every replica watching the prefix (PeerTarget) shares its
// prompt prefixes with it while it is there.
func RegisterRouter(o Options, adminURL string, ttl time.Duration) (*Registration, error) {
	return registerRouter(context.Background(), o, adminURL, ttl)
}

// registerRouter is RegisterRouter, given up when ctx ends.
func registerRouter(ctx context.Context, o Options, adminURL string, ttl time.Duration) (*Registration, error) {
	r, err := register(ctx, o, RoutersKey, url.PathEscape(adminURL), []byte(adminURL), ttl)
	if err != nil {
		return nil, fmt.Errorf("register router %s on etcd: %w", adminURL, err)
	}
	return r, nil
}

// register puts value under keyOf(prefix)+name on a lease of ttl and keeps
// the lease alive until Close; it gives up when parent ends.
func register(parent context.Context, o Options, keyOf func(prefix string) string, name string, value []byte, ttl time.Duration) (*Registration, error) {
	o = o.withDefaults()
	if ttl < time.Second {
		return nil, fmt.Errorf("ttl %v: etcd leases last whole seconds, at least 1s", ttl)
	}
	cli, err := client(o)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(parent, o.DialTimeout+5*time.Second)
	defer cancel()
	var lease *clientv3.LeaseGrantResponse
	if lease, err = cli.Grant(ctx, int64(ttl/time.Second)); err == nil {
		r := &Registration{cli: cli, key: keyOf(o.Prefix) + name, lease: lease.ID, done: make(chan struct{})}
		if _, err = cli.Put(ctx, r.key, string(value), clientv3.WithLease(lease.ID)); err == nil {
			var kctx context.Context
			kctx, r.cancel = context.WithCancel(context.Background())
			var alive <-chan *clientv3.LeaseKeepAliveResponse
			if alive, err = cli.KeepAlive(kctx, lease.ID); err == nil {
				go func() {
					defer close(r.done)
					for range alive { // drained until the keep-alive ends
					}
				}()
				return r, nil
			}
			r.cancel()
		}
		// The put may have been applied though its answer never came (ctx
		// ended as etcd wrote it): revoking the lease deletes the key
		// rather than leaving it to its peers for ttl.
		rctx, rcancel := context.WithTimeout(context.Background(), o.DialTimeout)
		_, _ = cli.Revoke(rctx, lease.ID)
		rcancel()
	}
	_ = cli.Close()
	return nil, err
}

// Key is the registered key.
func (r *Registration) Key() string { return r.key }

// Close deletes the key (every router drains the worker at once) and
// revokes the lease; a key another registration put since (the same
// worker's or router's, from a process that took over) stays.
func (r *Registration) Close() error { return r.close(5 * time.Second) }

// close is Close, waiting at most timeout for etcd.
func (r *Registration) close(timeout time.Duration) error {
	r.cancel()
	<-r.done
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// The key goes only while it is this lease's: a process that took over
	// the same name (a router's upgrade, a worker's sidecar restarted) put
	// it on a lease of its own, and keeps it.
	_, err := r.cli.Txn(ctx).If(clientv3.Compare(clientv3.LeaseValue(r.key), "=", r.lease)).
		Then(clientv3.OpDelete(r.key)).Commit()
	if _, rerr := r.cli.Revoke(ctx, r.lease); err == nil {
		err = rerr
	}
	if cerr := r.cli.Close(); err == nil {
		err = cerr
	}
	return err
}

// Abandon stops keeping the lease alive without deleting the key, as a
// crashed registrar would: the routers drop the worker when the lease
// expires.
func (r *Registration) Abandon() error {
	r.cancel()
	<-r.done
	return r.cli.Close()
}

// KeepRouterRegistered registers a router replica (RegisterRouter) until
// ctx ends, when it deletes the key: a registration that fails (etcd
// unreachable) is tried again, and one whose lease is lost (an outage
// longer than ttl) is made again.
func KeepRouterRegistered(ctx context.Context, o Options, adminURL string, ttl time.Duration) {
	o = o.withDefaults()
	log := o.Logger
	pause, warned := 100*time.Millisecond, false
	for ctx.Err() == nil {
		r, err := registerRouter(ctx, o, adminURL, ttl) // a router that stops does not wait for an etcd that does not answer
		if err != nil {
			if !warned && ctx.Err() == nil {
				log.Warn("router not registered on etcd: its peers do not share prefixes with it yet; trying again", "err", err)
			}
			warned = true
			sleep(ctx, pause)
			pause = min(2*pause, reconnectMax)
			continue
		}
		if warned {
			log.Info("router registered on etcd", "key", r.key)
		}
		pause, warned = 100*time.Millisecond, false
		select {
		case <-ctx.Done():
			if err := r.close(o.DialTimeout); err != nil { // a stopping router waits no longer for etcd
				log.Warn("router's etcd key not deleted: its peers drop it when its lease expires", "err", err)
			}
			return
		case <-r.done:
			_ = r.Abandon()
			log.Warn("router's etcd lease lost: registering again", "key", r.key)
		}
	}
}
