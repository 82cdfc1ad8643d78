package discovery

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Registration keeps one worker's key alive on etcd.
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
	if o.Prefix == "" {
		o.Prefix = "/fastroute"
	}
	if ttl < time.Second {
		return nil, fmt.Errorf("ttl %v: etcd leases last whole seconds, at least 1s", ttl)
	}
	cli, err := client(o)
	if err != nil {
		return nil, err
	}
	value, err := json.Marshal(spec)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), o.DialTimeout+5*time.Second)
		defer cancel()
		var lease *clientv3.LeaseGrantResponse
		if lease, err = cli.Grant(ctx, int64(ttl/time.Second)); err == nil {
			r := &Registration{cli: cli, key: WorkersKey(o.Prefix) + strconv.FormatUint(spec.ID, 10), lease: lease.ID, done: make(chan struct{})}
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
		}
	}
	_ = cli.Close()
	return nil, fmt.Errorf("register worker %d on etcd: %w", spec.ID, err)
}

// Key is the worker's key.
func (r *Registration) Key() string { return r.key }

// Close deletes the key (every router drains the worker at once) and
// revokes the lease.
func (r *Registration) Close() error {
	r.cancel()
	<-r.done
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := r.cli.Delete(ctx, r.key)
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
