// Package prefixshare sends what this router's prefix table records anew
// to the other replicas in front of the same workers, so that a
// conversation whose turns reach different replicas still finds the
// worker holding its prefix. Every interval it reads the table's journal
// (affinity.Prefixes.Changed) and posts the records to each peer's admin
// listener (POST /prefixes), one sender per peer: a slow or absent peer
// delays and loses only its own records. It runs off the request path.
package prefixshare

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fastroute/fastroute/affinity"
	"github.com/fastroute/fastroute/dataplane/metrics"
	"github.com/fastroute/fastroute/internal/bearer"
	"github.com/fastroute/fastroute/internal/every"
	"github.com/fastroute/fastroute/internal/workerclient"
)

// Path is the admin route that takes a peer's records.
const Path = "/prefixes"

// JournalKeys is how many keys the table's journal holds between two
// reads: at the default 10ms interval, 6.5 million new prefix blocks a
// second.
const JournalKeys = 1 << 16

// queued is how many batches wait for a peer before the newest are
// dropped.
const queued = 4

// Options configures a Loop.
type Options struct {
	Prefixes *affinity.Prefixes // Share must have been called on it
	// Peers are the other replicas' admin listeners, as base URLs
	// (http://10.0.0.2:8001); SetPeers adds those found later, and
	// SetStatic replaces these.
	Peers []string
	// Self is this replica's own admin URL as its peers reach it: left
	// out of what SetPeers is given.
	Self string
	// Token goes as "Authorization: Bearer <token>" (the replicas share
	// their admin token; a reload may change it); nil or empty: none.
	Token    *bearer.Token
	Interval time.Duration
	// Timeout bounds one post to a peer.
	Timeout time.Duration
	// TLS is the configuration of posts to https:// peers (nil: Go's
	// default, the system's roots).
	TLS    *tls.Config
	Logger *slog.Logger
}

// Loop is the sender. Its counters are read by its Collector.
type Loop struct {
	opts    Options
	client  atomic.Pointer[http.Client] // SetTLS replaces it
	every   *every.Period               // Options.Interval as it is now (SetInterval)
	lost    atomic.Uint64               // keys the journal lost before they were read
	senders sync.WaitGroup

	mu            sync.Mutex // guards what follows (the tick, SetPeers, Collector)
	peers         []*peer    // in the order first named
	static, found []string   // the configured peers, and those SetPeers gave
	ctx           context.Context
	stopped       bool
}

// peer is one replica's sender and its counts, in records.
type peer struct {
	base, url             string // as configured; the route's URL
	batches               chan []byte
	sent, failed, dropped atomic.Uint64
	failing               bool // the last post failed (the sender's own)
}

// New returns a Loop; Run starts it.
func New(o Options) *Loop {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	l := &Loop{opts: o, every: every.NewPeriod(o.Interval)}
	l.client.Store(l.newClient(o.TLS))
	l.SetStatic(o.Peers)
	return l
}

// newClient is a client of its own transport, whose kept connections
// close when Run ends, speaking TLS under conf to https:// peers.
func (l *Loop) newClient(conf *tls.Config) *http.Client {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = conf
	return &http.Client{Timeout: l.opts.Timeout, Transport: transport}
}

// SetTLS replaces Options.TLS (a reload: new peer CAs): the next post
// connects under conf, and the connections kept under the old one close
// (workerclient.Retire).
func (l *Loop) SetTLS(conf *tls.Config) {
	workerclient.Retire(l.client.Swap(l.newClient(conf)), l.opts.Timeout)
}

// SetPeers sets the replicas found besides the configured ones (Self left
// out): a sender starts for each new one, and stops for each one gone.
func (l *Loop) SetPeers(found []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.found = slices.Clone(found)
	l.follow()
}

// SetStatic replaces the configured peers (a reload), as SetPeers does
// those found.
func (l *Loop) SetStatic(peers []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.static = slices.Clone(peers)
	l.follow()
}

// follow starts and stops senders to match the configured peers and those
// found. The caller holds mu.
func (l *Loop) follow() {
	if l.stopped {
		return
	}
	all := append(slices.Clone(l.static), l.found...)
	want := map[string]bool{}
	for _, u := range all {
		want[u] = u != l.opts.Self
	}
	kept := l.peers[:0]
	for _, p := range l.peers {
		if want[p.base] {
			kept = append(kept, p)
			delete(want, p.base)
		} else {
			close(p.batches)
		}
	}
	l.peers = kept
	for _, u := range all {
		if want[u] {
			delete(want, u)
			p := &peer{base: u, url: strings.TrimSuffix(u, "/") + Path, batches: make(chan []byte, queued)}
			l.peers = append(l.peers, p)
			if l.ctx != nil {
				l.senders.Go(func() { l.send(l.ctx, p) })
			}
		}
	}
}

// Peers returns the replicas shared with now, in the order first named.
func (l *Loop) Peers() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, len(l.peers))
	for i, p := range l.peers {
		out[i] = p.base
	}
	return out
}

// Run reads the journal every interval and hands each batch to every
// peer's sender, until ctx ends.
func (l *Loop) Run(ctx context.Context) {
	l.mu.Lock()
	l.ctx = ctx
	for _, p := range l.peers {
		l.senders.Go(func() { l.send(ctx, p) })
	}
	l.mu.Unlock()
	var buf []byte
	l.every.Tick(ctx, func() { buf = l.share(buf[:0]) })
	l.mu.Lock()
	l.stopped = true
	for _, p := range l.peers {
		close(p.batches)
	}
	l.mu.Unlock()
	l.senders.Wait()
	l.client.Load().CloseIdleConnections()
}

// share reads the journal's records into buf and hands them, as one batch,
// to every peer's sender (one whose queue is full drops it, counted), and
// returns buf to read the next ones into.
func (l *Loop) share(buf []byte) []byte {
	buf, lost := l.opts.Prefixes.Changed(buf)
	l.lost.Add(lost)
	if len(buf) == 0 {
		return buf
	}
	batch := bytes.Clone(buf) // the senders read it while buf is refilled
	l.mu.Lock()
	for _, p := range l.peers {
		select {
		case p.batches <- batch:
		default:
			p.dropped.Add(uint64(len(batch) / affinity.PrefixRecordBytes))
		}
	}
	l.mu.Unlock()
	return buf
}

// SetInterval changes Options.Interval (a reload): the next read of the
// journal comes d from now (every.Period).
func (l *Loop) SetInterval(d time.Duration) { l.every.Set(d) }

// send posts p's batches in turn until its queue is closed.
func (l *Loop) send(ctx context.Context, p *peer) {
	for batch := range p.batches {
		n := uint64(len(batch) / affinity.PrefixRecordBytes)
		if err := l.post(ctx, p.url, batch); err != nil {
			p.failed.Add(n)
			if !p.failing && ctx.Err() == nil {
				l.opts.Logger.Warn("prefix records not shared with a peer", "peer", p.base, "err", err)
			}
			p.failing = true
			continue
		}
		p.sent.Add(n)
		if p.failing {
			l.opts.Logger.Info("prefix records shared with a peer again", "peer", p.base)
		}
		p.failing = false
	}
}

// post sends one batch; anything but a 204 is an error.
func (l *Loop) post(ctx context.Context, url string, batch []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(batch))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	if auth := l.opts.Token.Header(); auth != nil {
		req.Header.Set("Authorization", string(auth))
	}
	resp, err := l.client.Load().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}

// Collector exports the keys recorded anew, the records sent to each
// peer, failed, dropped (the peer's queue was full), and the keys the
// journal lost.
func (l *Loop) Collector() metrics.Collector {
	return func(w *metrics.Writer) {
		const name = "fastroute_prefix_shared_records_total"
		w.Header(name, "counter", "Prefix records sent to each peer replica: sent, failed (the post failed), dropped (the peer's queue was full).")
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, p := range l.peers {
			w.Sample(name, float64(p.sent.Load()), "peer", p.base, "outcome", "sent")
			w.Sample(name, float64(p.failed.Load()), "peer", p.base, "outcome", "failed")
			w.Sample(name, float64(p.dropped.Load()), "peer", p.base, "outcome", "dropped")
		}
		w.Single("fastroute_prefix_recorded_keys_total", "counter", "Prefix keys this router recorded anew (sent to a worker other than the one its table named), each shared with every peer.", float64(l.opts.Prefixes.Recorded()))
		w.Single("fastroute_prefix_share_lost_total", "counter", "Prefix keys recorded anew that the journal lost before they could be shared.", float64(l.lost.Load()))
	}
}
