package router

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"slices"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/apikeys"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/dataplane/http/admin"
	"github.com/fastroute/fastroute/dataplane/metrics"
	"github.com/fastroute/fastroute/discovery"
	"github.com/fastroute/fastroute/discovery/dns"
)

// newDNS makes the DNS watcher of d when it names hosts (startDNS starts
// it): at start, before the state file's hand drains are restored into
// it, or at a reload that turns DNS discovery on. The caller holds
// reloadMu, or starts the router.
func (r *Router) newDNS(d config.DNS) error {
	if !d.On() {
		return nil
	}
	o := d.Options(r.log)
	o.HoldsChanged = r.saveState
	w, err := dns.New(o, discoveryTarget{r, "in DNS"})
	if err != nil {
		return fmt.Errorf("discovery.dns: %w", err) // Validate checked it: not reached
	}
	r.dns.Store(w)
	return nil
}

// DNS returns the watcher of the workers found by DNS name; nil while
// discovery.dns names no host.
func (r *Router) DNS() *dns.Watcher { return r.dns.Load() }

// dnsCollector writes the DNS watcher's families while it runs.
func (r *Router) dnsCollector(mw *metrics.Writer) {
	if w := r.DNS(); w != nil {
		w.Collector()(mw)
	}
}

// applyDNS applies a reload's discovery.dns (old: the one running): turned
// on, the names are looked up at once and every interval (startDNS);
// turned off, the lookups stop and every worker found by DNS is drained
// (its hand drains forgotten); else the watcher takes the new keys
// (Reconfigure). The caller holds reloadMu.
func (r *Router) applyDNS(old, d config.DNS) (applied []string) {
	w := r.DNS()
	switch {
	case reflect.DeepEqual(old, d):
		return nil
	case w == nil:
		if err := r.newDNS(d); err != nil {
			r.log.Error("reload: discovery.dns not started", "err", err) // Validate checked it: not reached
			return nil
		}
		r.startDNS(false)
		return []string{fmt.Sprintf("discovery.dns on: names %v", d.Names)}
	case !d.On():
		r.dnsLoop.end()
		r.dnsLoop = nil
		r.dns.Store(nil)
		w.DrainAll()
		return []string{"discovery.dns off (its workers drained)"}
	}
	if err := w.Reconfigure(d.Options(r.log)); err != nil {
		r.log.Error("reload: discovery.dns not changed", "err", err) // Validate checked it: not reached
		return nil
	}
	return changes(
		keyChange{"discovery.dns.names", slices.Equal(old.Names, d.Names), d.Names},
		keyChange{"discovery.dns.interval", old.Interval == d.Interval, d.Interval},
		keyChange{"discovery.dns.server", old.Server == d.Server, d.Server},
		keyChange{"discovery.dns.scheme", old.Scheme == d.Scheme, d.Scheme},
		keyChange{"discovery.dns.family", old.Family == d.Family, d.Family},
		keyChange{"discovery.dns.worker", reflect.DeepEqual(old.Worker, d.Worker), fmt.Sprintf("%+v", d.Worker)})
}

// startDiscovery watches etcd e for workers when it names endpoints (at
// start, or turned on by a reload); the static workers of the config, and
// those found by DNS, stay beside them. The caller holds reloadMu, or
// starts the router.
func (r *Router) startDiscovery(e config.Etcd) error {
	if len(e.Endpoints) == 0 {
		return nil
	}
	files, err := etcdFilesDigest(e) // before the client reads them: a file replaced meanwhile is read again at the next reload
	if err != nil {
		return err
	}
	w, err := discovery.Watch(etcdOptions(e, r.log), discoveryTarget{r, "on etcd"})
	if err != nil {
		return fmt.Errorf("discovery.etcd: %w", err)
	}
	r.etcd.Store(w)
	r.etcdFiles = files
	return nil
}

// stopDiscovery stops watching etcd (a reload that turns it off): the
// workers found there are drained, the down marks it held lifted and the
// replicas it named no longer prefix peers (Watcher.DrainAll). The caller
// holds reloadMu.
func (r *Router) stopDiscovery() {
	w := r.etcd.Swap(nil)
	if w == nil {
		return
	}
	_ = w.Close()
	w.DrainAll()
	r.etcdFiles = [sha256.Size]byte{}
}

// Discovery returns the watcher of the workers found on etcd; nil while
// discovery.etcd names no endpoint.
func (r *Router) Discovery() *discovery.Watcher { return r.etcd.Load() }

// etcdCollector writes whether etcd answers while the router watches it.
func (r *Router) etcdCollector(mw *metrics.Writer) {
	w := r.Discovery()
	if w == nil {
		return
	}
	up := 0.0
	if w.Up() {
		up = 1
	}
	mw.Header("fastroute_discovery_up", "gauge", "1 while etcd answers; 0: routing on the last known workers.")
	mw.Sample("fastroute_discovery_up", up)
}

// startDNS looks discovery.dns's names up every interval until the
// router's close or a reload that turns it off, the first round at once:
// before the router starts (first: it starts with their workers), or in
// the loop (a reload's, which waits for no lookup). The caller holds
// reloadMu, or starts the router.
func (r *Router) startDNS(first bool) {
	w := r.DNS()
	if w == nil {
		return
	}
	if first {
		w.Sync(r.ctx)
	}
	l := r.start(func(ctx context.Context) {
		if !first {
			w.Sync(ctx)
		}
		w.Run(ctx)
	})
	r.dnsLoop = &l
}

// knownDiscovered reports a worker found on etcd or in DNS.
func (r *Router) knownDiscovered(id uint64) bool {
	w := r.DNS()
	e := r.Discovery()
	return (e != nil && e.Known(id)) || (w != nil && w.Known(id))
}

// etcdFilesDigest is a digest of what discovery.etcd's TLS files hold
// (none: the digest of nothing), so that a reload tells one replaced
// under its name.
func etcdFilesDigest(e config.Etcd) ([sha256.Size]byte, error) {
	h := sha256.New()
	for _, f := range []struct{ key, path string }{{"cert_file", e.CertFile}, {"key_file", e.KeyFile}, {"ca_file", e.CAFile}} {
		if f.path != "" {
			b, err := os.ReadFile(f.path)
			if err != nil {
				return [sha256.Size]byte{}, fmt.Errorf("key discovery.etcd.%s: %w", f.key, err)
			}
			h.Write(b)
		}
		h.Write([]byte{0}) // a file's end
	}
	return [sha256.Size]byte(h.Sum(nil)), nil
}

// routerTTL is the lease of a replica's key on etcd: a replica that dies
// without deleting it stops getting its peers' prefixes after that.
const routerTTL = 10 * time.Second

// etcdOptions locates etcd as the config says.
func etcdOptions(e config.Etcd, log *slog.Logger) discovery.Options {
	return discovery.Options{Endpoints: e.Endpoints, Prefix: e.Prefix, DialTimeout: e.DialTimeout,
		Username: e.Username, Password: e.Password, CertFile: e.CertFile, KeyFile: e.KeyFile, CAFile: e.CAFile, Logger: log}
}

// keepRegistered registers this replica's admin listener on etcd e until
// the router's close, or a reload's move to another etcd (moveEtcd), when
// it shares prompt prefixes and advertises an address. The caller holds
// reloadMu (a reload), or starts the router.
func (r *Router) keepRegistered(e config.Etcd) {
	adv := r.Config.Router.PrefixAffinity.Advertise // a restart's key
	if r.Discovery() == nil || r.PrefixShare == nil || adv == "" {
		return
	}
	opts := etcdOptions(e, r.log)
	l := r.start(func(ctx context.Context) { discovery.KeepRouterRegistered(ctx, opts, adv, routerTTL) })
	r.registration = &l
}

// moveEtcd has the router follow etcd e (a reload's new endpoints, prefix,
// credentials or TLS files): the watch of the workers (Reconnect), this
// replica's registration (its key on the etcd before deleted) and the
// share of the keys' use at interval iv (its key there deleted too; the
// others' last known use counts until the new etcd's first share). A
// client of e that cannot be made (a TLS file that does not load) is an
// error, and nothing moved. The caller holds reloadMu.
func (r *Router) moveEtcd(e config.Etcd, iv time.Duration) error {
	if err := r.Discovery().Reconnect(etcdOptions(e, r.log)); err != nil {
		return fmt.Errorf("discovery.etcd: %w", err)
	}
	if r.registration != nil {
		r.registration.end()
		r.registration = nil
		r.keepRegistered(e)
	}
	if r.keyShare != nil {
		r.keyShare.end()
		r.keyShare = nil
		r.shareKeyUsage(e, iv)
	}
	return nil
}

// shareKeyUsage shares the API keys' use with the other replicas on etcd e
// every iv (api_keys_share_interval; 0: not shared) until stopKeyShare,
// moveEtcd or the router's close: this replica's under a key of its own,
// read back by the others into their admissions. The caller holds
// reloadMu (a reload), or starts the router.
func (r *Router) shareKeyUsage(e config.Etcd, iv time.Duration) {
	if iv <= 0 {
		return
	}
	read := func() []byte {
		b, _ := json.Marshal(r.APIKeys.Usage(time.Now())) // a list of plain structs always marshals
		return b
	}
	apply := func(others [][]byte) {
		var all []apikeys.Usage
		for _, b := range others {
			var u []apikeys.Usage
			if err := json.Unmarshal(b, &u); err != nil {
				r.log.Warn("another replica's key use on etcd is not a list of uses: ignored", "err", err)
				continue
			}
			all = append(all, u...)
		}
		r.APIKeys.SetPeerUsage(all)
	}
	opts, self := etcdOptions(e, r.log), r.keyShareSelf
	l := r.start(func(ctx context.Context) { discovery.ShareUsage(ctx, opts, self, iv, read, apply) })
	r.keyShare = &l
}

// newReplicaID names this replica's key of the shared key use: 16 random
// hex digits.
func newReplicaID() string {
	var id [8]byte
	_, _ = rand.Read(id[:])
	return hex.EncodeToString(id[:])
}

// stopKeyShare ends the share of the API keys' use (its key deleted from
// etcd, within a tick) and forgets the others' use: each key's caps count
// what this replica serves. The caller holds reloadMu.
func (r *Router) stopKeyShare() {
	if r.keyShare == nil {
		return
	}
	r.keyShare.end()
	r.keyShare = nil
	r.APIKeys.SetPeerUsage(nil)
}

// discoveryTarget applies what etcd or DNS says to the registry, and the
// replicas registered on etcd to the prefix sharing.
type discoveryTarget struct {
	r     *Router
	where string // "on etcd", "in DNS": for the log
}

// SetPeers shares prompt prefixes with every replica registered on etcd
// (itself left out), besides those of the config. A value that does not
// name an admin listener as http(s)://host:port is ignored: the records
// go with the admin token.
func (t discoveryTarget) SetPeers(urls []string) {
	if t.r.PrefixShare == nil {
		return
	}
	valid := urls[:0:0]
	for _, u := range urls {
		if config.IsBaseURL(u) {
			valid = append(valid, u)
		} else {
			t.r.log.Warn("etcd router key does not name an admin listener as http(s)://host:port: ignored", "value", u)
		}
	}
	t.r.PrefixShare.SetPeers(valid)
}

// Put adds a discovered worker (routable after its first probe) or
// replaces it when its spec changed. An id the config file uses is
// refused: a worker is never there twice.
func (t discoveryTarget) Put(spec dataplane.WorkerSpec) error {
	r := t.r
	for _, s := range r.CurrentConfig().Workers {
		if s.ID == spec.ID {
			return fmt.Errorf("id %d is a worker of the config file; the one %s is ignored", spec.ID, t.where)
		}
	}
	if err := spec.Normalize(); err != nil {
		return err
	}
	w, ok := r.Registry.Get(spec.ID)
	switch {
	case !ok:
		if _, err := r.Registry.AddUnprobed(spec); err != nil {
			return err
		}
		r.log.Info("worker found "+t.where, "worker", spec.ID, "url", spec.URL)
		r.probeSoon(spec.ID)
	case w.Draining() || !reflect.DeepEqual(*w.Spec(), spec):
		if err := r.replaceWorker(spec); err != nil {
			return err
		}
		r.log.Info("worker changed "+t.where, "worker", spec.ID)
	}
	return nil
}

// Settle probes the workers a list put at once (discovery.Settler), so
// that they take requests before the ones it lacks are drained.
func (t discoveryTarget) Settle(ids []uint64) { t.r.Health.Check(ids...) }

// Drain drains a worker that left etcd or DNS: its requests finish.
func (t discoveryTarget) Drain(id uint64) { _ = t.r.Registry.Drain(id) }

// SetDown puts a worker down or back as its down mark on etcd says; an id
// not registered yet joins so.
func (t discoveryTarget) SetDown(id uint64, down bool) { t.r.Registry.SetDownID(id, down) }

// setWorkerDown puts a worker down or back (PATCH /workers/{id}); one
// found on etcd on every router, through its down mark there (written or
// deleted whatever this router had: another may have it down). Here
// first, as drainWorker, so the answer shows it; the mark comes back
// through this router's own watch and changes nothing more.
func (r *Router) setWorkerDown(id uint64, down bool) (changed bool, err error) {
	changed, err = r.Registry.SetDown(id, down)
	e := r.Discovery()
	if err != nil || e == nil || !e.Known(id) {
		return changed, err
	}
	if err := e.MarkDown(id, down); err != nil {
		where := "back"
		if down {
			where = "down"
		}
		return changed, &admin.UnavailableError{Msg: fmt.Sprintf("worker %d put %s on this router only: etcd did not take its down mark: %v", id, where, err)}
	}
	return changed, nil
}

// drainWorker drains a worker (DELETE /workers/{id}); one found on etcd is
// drained on every router through a drain mark there. It drains here
// first: the mark comes back through this router's own watch too, which
// drains the worker and may remove it (no request in flight) before a
// drain made after the mark would find it.
//
// One found in DNS stays drained while its address stays in DNS (on this
// router: DNS has no mark the others would read), across a restart too
// with state_file (Watcher.Held is in it).
func (r *Router) drainWorker(id uint64) error {
	if w := r.DNS(); w != nil && w.Hold(id) {
		// Held first: a lookup's put of it under way has ended, and none
		// after puts it, so nothing takes this drain back.
		return r.Registry.Drain(id)
	}
	if err := r.Registry.Drain(id); err != nil {
		return err
	}
	e := r.Discovery()
	if e == nil || !e.Known(id) {
		return nil
	}
	if err := e.MarkDrain(id); err != nil {
		return fmt.Errorf("worker %d drained on this router only: the drain mark could not be written to etcd: %v", id, err)
	}
	return nil
}
