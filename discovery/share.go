package discovery

import (
	"context"
	"math"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// UsageKey is the key prefix of the replicas' shared usage under prefix.
func UsageKey(prefix string) string { return root(prefix) + "usage/" }

// ShareUsage publishes what read returns under <prefix>/usage/<self>
// every interval, on a lease of three intervals (two seconds at least),
// and gives apply what every other replica published there, until ctx
// ends, when it deletes its key. A replica that dies leaves its key to
// its lease: the others stop counting its usage within the lease's time.
// While etcd does not answer, apply is not called: the others' last
// known usage stays, as the last known workers do.
func ShareUsage(ctx context.Context, o Options, self string, interval time.Duration, read func() []byte, apply func(others [][]byte)) {
	o = o.withDefaults()
	log := o.Logger
	cli, err := client(o)
	if err != nil {
		log.Warn("usage not shared: etcd client", "err", err)
		return
	}
	defer cli.Close()
	s := &sharer{cli: cli, key: UsageKey(o.Prefix) + self, prefix: UsageKey(o.Prefix),
		ttl: int64(max(2, math.Ceil((3 * interval).Seconds()))), wait: o.DialTimeout + interval}
	failing := false
	for {
		others, err := s.tick(ctx, read())
		switch {
		case ctx.Err() != nil:
			s.leave()
			return
		case err != nil:
			if !failing {
				log.Warn("usage not shared with the other replicas: etcd does not answer; their last known usage stays", "err", err)
			}
			failing = true
		default:
			if failing {
				log.Info("usage shared with the other replicas again")
			}
			failing = false
			apply(others)
		}
		sleep(ctx, interval)
	}
}

// sharer is one replica's key of ShareUsage.
type sharer struct {
	cli         *clientv3.Client
	key, prefix string
	ttl         int64 // seconds
	wait        time.Duration
	lease       clientv3.LeaseID // 0: none granted (yet, or any more)
}

// tick puts value under the replica's key, on its lease (granted anew
// when lost), and returns the other replicas' values.
func (s *sharer) tick(parent context.Context, value []byte) ([][]byte, error) {
	ctx, cancel := context.WithTimeout(parent, s.wait)
	defer cancel()
	if s.lease != 0 {
		if _, err := s.cli.KeepAliveOnce(ctx, s.lease); err != nil {
			s.lease = 0 // expired during an outage, say: a new one
		}
	}
	if s.lease == 0 {
		g, err := s.cli.Grant(ctx, s.ttl)
		if err != nil {
			return nil, err
		}
		s.lease = g.ID
	}
	if _, err := s.cli.Put(ctx, s.key, string(value), clientv3.WithLease(s.lease)); err != nil {
		return nil, err
	}
	got, err := s.cli.Get(ctx, s.prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	var others [][]byte
	for _, kv := range got.Kvs {
		if string(kv.Key) != s.key {
			others = append(others, kv.Value)
		}
	}
	return others, nil
}

// leave deletes the replica's key and its lease, waiting for etcd no
// longer than a tick.
func (s *sharer) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), s.wait)
	defer cancel()
	_, _ = s.cli.Delete(ctx, s.key)
	if s.lease != 0 {
		_, _ = s.cli.Revoke(ctx, s.lease)
	}
}
