// Package dns finds workers by DNS name, as nginx's resolve, HAProxy's
// server-template and Envoy's strict DNS clusters do: every address a
// name resolves to (a Kubernetes headless service's ready pods, a Consul
// service, a scaled compose service) is a worker on the name's port, or
// for an SRV name every address of every target on the target's port,
// looked up again every interval. An address that leaves every answer is
// drained; a lookup that fails keeps what the name had, so a DNS outage
// does not empty the fleet.
package dns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/metrics"
	"github.com/fastroute/fastroute/discovery"
	"github.com/fastroute/fastroute/internal/every"
)

// Options configures a Watcher.
type Options struct {
	// Names are the entries looked up: host:port, each address the host
	// resolves to a worker on that port, or an SRV name
	// (_service._proto.name), each address of each target a worker on
	// the target's port.
	Names []string
	// Interval is the time between two rounds of lookups.
	Interval time.Duration
	// Server is the DNS server asked, host:port ("": the system's
	// resolver, /etc/resolv.conf).
	Server string
	// Scheme is how workers are spoken to: http or https.
	Scheme string
	// Family is which of a host's addresses are workers: PreferIPv4 (""
	// too), PreferIPv6 or BothFamilies.
	Family string
	// Worker holds the fields every worker found gets (device, capacity,
	// role...); its id and url are each address's.
	Worker dataplane.WorkerSpec
	Logger *slog.Logger
	// HoldsChanged, when set, is called after a lookup round forgot the
	// hand drains of addresses that left DNS (Held changed), so that a
	// caller keeping them (state_file) writes them again.
	HoldsChanged func()
}

// The address families a host's workers are taken from (Options.Family).
// A dual-stack engine has an address of each: taking both would make it
// two workers, each given the engine's whole capacity and half its load,
// as HAProxy's server-template (resolve-prefer) and Envoy's strict DNS
// (dns_lookup_family) avoid by taking one family.
const (
	// PreferIPv4 takes a host's IPv4 addresses, its IPv6 ones when it has
	// none.
	PreferIPv4 = "prefer_ipv4"
	// PreferIPv6 takes a host's IPv6 addresses, its IPv4 ones when it has
	// none.
	PreferIPv6 = "prefer_ipv6"
	// BothFamilies takes every address: for hosts whose IPv4 and IPv6
	// addresses are different engines.
	BothFamilies = "both"
)

// Watcher keeps a Target in step with the addresses of Options.Names.
type Watcher struct {
	o        Options       // its Names, Server, Scheme, Family and Worker guarded by mu (Reconfigure)
	every    *every.Period // Options.Interval as it is now (Reconfigure)
	target   discovery.Target
	resolver *net.Resolver // Options.Server's; guarded by mu
	// putting makes a worker's put (putAddr: its hold checked, the put,
	// its record) and a Hold one after the other: a put that checked
	// before a Hold would otherwise land after it, and so after the
	// caller's drain. Not mu: the target's Put takes the caller's locks,
	// which may be held while mu is taken.
	putting sync.Mutex
	mu      sync.Mutex
	names   map[string][]uint64 // each name's workers at its last good lookup
	put     map[uint64]string   // the workers put and not drained since: their addresses
	held    map[uint64]string   // drained by hand (Hold, Restore): not put again while their address stays
	refused map[uint64]bool     // the target refused them (logged once, while their address stays)
	failing map[string]bool     // names whose last lookup failed
}

// New checks o and returns a Watcher over t; Run starts it.
func New(o Options, t discovery.Target) (*Watcher, error) {
	if err := o.Check(); err != nil {
		return nil, err
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	w := &Watcher{o: o, target: t, every: every.NewPeriod(o.Interval), resolver: resolverOf(o.Server),
		names: map[string][]uint64{}, put: map[uint64]string{}, held: map[uint64]string{}, refused: map[uint64]bool{}, failing: map[string]bool{}}
	return w, nil
}

// resolverOf is the resolver that asks server (host:port; "": the
// system's).
func resolverOf(server string) *net.Resolver {
	if server == "" {
		return net.DefaultResolver
	}
	var d net.Dialer
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, network, server)
	}}
}

// Check reports the first field of o that is wrong, by its name.
func (o Options) Check() error {
	if len(o.Names) == 0 {
		return errors.New("names: none")
	}
	for i, n := range o.Names {
		host, port, err := net.SplitHostPort(n)
		if err != nil && strings.HasPrefix(n, "_") && !strings.Contains(n, ":") {
			continue // an SRV name
		}
		if p, perr := strconv.ParseUint(port, 10, 16); err != nil || host == "" || perr != nil || p == 0 {
			return fmt.Errorf("names[%d]: %q is not host:port or an SRV name (_service._proto.name)", i, n)
		}
	}
	if o.Interval <= 0 {
		return fmt.Errorf("interval: %v must be positive", o.Interval)
	}
	if o.Scheme != "http" && o.Scheme != "https" {
		return fmt.Errorf("scheme: %q is not http or https", o.Scheme)
	}
	switch o.Family {
	case "", PreferIPv4, PreferIPv6, BothFamilies:
	default:
		return fmt.Errorf("family: %q is not %s, %s or %s", o.Family, PreferIPv4, PreferIPv6, BothFamilies)
	}
	if o.Worker.ID != 0 || o.Worker.URL != "" {
		return errors.New("worker: id and url are each address's, not set here")
	}
	probe := o.Worker
	probe.ID, probe.URL = 1, o.Scheme+"://127.0.0.1:1"
	if err := probe.Normalize(); err != nil {
		return fmt.Errorf("worker.%w", err)
	}
	if o.Server != "" {
		if _, _, err := net.SplitHostPort(o.Server); err != nil {
			return fmt.Errorf("server: %q is not host:port", o.Server)
		}
	}
	return nil
}

// ID is the worker id of the address addr (ip:port): the same on every
// replica, so that their sessions and prefix records name the same
// workers, and within 1..2^53−1, which a JSON number holds exactly.
func ID(addr string) uint64 {
	return xxhash.Sum64String(addr)&(1<<53-1) | 1<<52
}

// Run looks the names up every Interval until ctx ends (Sync looks them
// up at once).
func (w *Watcher) Run(ctx context.Context) {
	w.every.Tick(ctx, func() { w.Sync(ctx) })
}

// Sync is one round: each name looked up (each within an Interval, at
// most 5 s), the workers of the addresses found put, and those of
// addresses no name holds any more drained. A name whose lookup fails
// keeps its workers; one that does not exist (NXDOMAIN) has none.
func (w *Watcher) Sync(ctx context.Context) {
	w.mu.Lock()
	rd := round{o: w.o, resolver: w.resolver}
	w.mu.Unlock()
	for _, n := range rd.o.Names {
		found, err := w.lookup(ctx, rd, n)
		if err != nil {
			w.setFailing(n, err)
			continue
		}
		w.setFailing(n, nil)
		ids := make([]uint64, 0, len(found))
		for _, a := range found {
			ids = append(ids, w.putAddr(rd, a))
		}
		w.mu.Lock()
		if slices.Contains(w.o.Names, n) { // not dropped by Reconfigure meanwhile
			w.names[n] = ids
		}
		w.mu.Unlock()
	}
	w.drainGone()
}

// round is what one round (Sync) looks up and puts by: the options and
// resolver as it began.
type round struct {
	o        Options
	resolver *net.Resolver
}

// Reconfigure applies o (a reload's) from the next round on: its names (a
// name added is looked up then, and the workers only a dropped name held
// are drained then), its server, scheme, family and worker fields (each
// worker found then takes them: a new scheme or field replaces it, a
// family that takes other addresses drains the ones it drops), and its
// interval, from now (every.Period; unchanged, the round keeps its time).
// Its Logger and HoldsChanged are the Watcher's own. An invalid o
// changes nothing.
func (w *Watcher) Reconfigure(o Options) error {
	if err := o.Check(); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.o.Names, w.o.Interval, w.o.Scheme, w.o.Family, w.o.Worker = slices.Clone(o.Names), o.Interval, o.Scheme, o.Family, o.Worker
	if o.Server != w.o.Server {
		w.o.Server, w.resolver = o.Server, resolverOf(o.Server)
	}
	for n := range w.names {
		if !slices.Contains(o.Names, n) {
			delete(w.names, n)
			delete(w.failing, n)
		}
	}
	if o.Interval != w.every.Get() {
		w.every.Set(o.Interval)
	}
	return nil
}

// lookup returns the addresses (ip:port) of name: a host:port's host's
// addresses on its port, or an SRV name's targets' addresses on their
// ports, each host's of the family Options.Family takes. A name that does
// not exist has none; an error is a lookup that failed.
func (w *Watcher) lookup(ctx context.Context, rd round, name string) ([]netip.AddrPort, error) {
	ctx, cancel := context.WithTimeout(ctx, min(w.every.Get(), 5*time.Second))
	defer cancel()
	host, port, err := net.SplitHostPort(name)
	if err != nil { // an SRV name (Check)
		_, srvs, err := rd.resolver.LookupSRV(ctx, "", "", name)
		if err != nil && (len(srvs) == 0 || !notFound(err)) { // some targets' names may be invalid: the others count
			return nil, absent(err)
		}
		var out []netip.AddrPort
		for _, srv := range srvs {
			addrs, err := hostAddrs(ctx, rd, srv.Target, srv.Port)
			if err != nil {
				return nil, absent(err)
			}
			out = append(out, addrs...)
		}
		return out, nil
	}
	p, _ := strconv.ParseUint(port, 10, 16) // Check checked it
	addrs, err := hostAddrs(ctx, rd, host, uint16(p))
	return addrs, absent(err)
}

// hostAddrs returns the addresses of one host on port, those of the family
// Options.Family takes, in their order (an IPv4-mapped IPv6 address is
// IPv4).
func hostAddrs(ctx context.Context, rd round, host string, port uint16) ([]netip.AddrPort, error) {
	addrs, err := rd.resolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, err
	}
	if rd.o.Family != BothFamilies {
		want4 := rd.o.Family != PreferIPv6
		if kept := slices.DeleteFunc(slices.Clone(addrs), func(a netip.Addr) bool { return a.Unmap().Is4() != want4 }); len(kept) > 0 {
			addrs = kept
		}
	}
	out := make([]netip.AddrPort, len(addrs))
	for i, a := range addrs {
		out[i] = netip.AddrPortFrom(a, port)
	}
	return out, nil
}

// notFound reports a name that does not exist (NXDOMAIN, or no record of
// the kind asked).
func notFound(err error) bool {
	var dnsErr *net.DNSError
	return errors.As(err, &dnsErr) && dnsErr.IsNotFound
}

// absent is err, or nil for a name that does not exist: it has no
// workers, which is an answer, not a failure.
func absent(err error) error {
	if notFound(err) {
		return nil
	}
	return err
}

// putAddr puts the worker of address a, unless held, as round rd has it,
// and returns its id.
func (w *Watcher) putAddr(rd round, a netip.AddrPort) uint64 {
	addr := addrText(a)
	id := ID(addr)
	w.putting.Lock()
	defer w.putting.Unlock()
	w.mu.Lock()
	_, held := w.held[id]
	w.mu.Unlock()
	if held {
		return id
	}
	spec := rd.o.Worker
	spec.ID, spec.URL = id, rd.o.Scheme+"://"+addr
	spec.LoRAs, spec.Models = slices.Clone(spec.LoRAs), slices.Clone(spec.Models)
	err := w.target.Put(spec)
	w.mu.Lock()
	refused := w.refused[id]
	if err != nil {
		w.refused[id] = true
	} else {
		w.put[id] = addr
		delete(w.refused, id)
	}
	w.mu.Unlock()
	if err != nil && !refused {
		w.o.Logger.Warn("worker found in DNS not added", "url", spec.URL, "worker", id, "err", err)
	}
	return id
}

// addrText is a worker's address as its id and url take it: ip:port, an
// IPv4-mapped IPv6 address as its IPv4 one.
func addrText(a netip.AddrPort) string {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port()).String()
}

// drainGone drains the workers no name's last good lookup holds, and
// forgets the holds of addresses gone; while a name's lookups fail, its
// holds may be among them, and are all kept (as a restored hold is until
// every name answered once).
func (w *Watcher) drainGone() {
	w.mu.Lock()
	live := map[uint64]bool{}
	for _, ids := range w.names {
		for _, id := range ids {
			live[id] = true
		}
	}
	var gone []uint64
	for id := range w.put {
		if !live[id] {
			gone = append(gone, id)
			delete(w.put, id)
		}
	}
	forgot := false
	if w.answered() {
		for id := range w.held {
			if !live[id] {
				delete(w.held, id)
				forgot = true
			}
		}
	}
	for id := range w.refused {
		if !live[id] {
			delete(w.refused, id)
		}
	}
	w.mu.Unlock()
	for _, id := range gone {
		w.target.Drain(id)
	}
	if forgot && w.o.HoldsChanged != nil {
		w.o.HoldsChanged()
	}
}

// DrainAll drains every worker put and not drained since, and forgets
// the names' answers and the hand drains: DNS discovery turned off, once
// its rounds ended. HoldsChanged is not called: the caller keeps what it
// keeps.
func (w *Watcher) DrainAll() {
	w.mu.Lock()
	gone := slices.Collect(maps.Keys(w.put))
	clear(w.put)
	clear(w.names)
	clear(w.held)
	clear(w.refused)
	clear(w.failing)
	w.mu.Unlock()
	for _, id := range gone {
		w.target.Drain(id)
	}
}

// answered says every name's last lookup answered. The caller holds mu.
func (w *Watcher) answered() bool {
	for _, n := range w.o.Names {
		if _, looked := w.names[n]; !looked || w.failing[n] {
			return false
		}
	}
	return true
}

// setFailing records a name's lookup failure (nil: it answered), logged
// when it begins and when it ends.
func (w *Watcher) setFailing(name string, err error) {
	w.mu.Lock()
	was := w.failing[name]
	w.failing[name] = err != nil
	w.mu.Unlock()
	switch {
	case err != nil && !was:
		w.o.Logger.Warn("DNS lookup failed; the name keeps its last workers", "name", name, "err", err)
	case err == nil && was:
		w.o.Logger.Info("DNS lookup answers again", "name", name)
	}
}

// Known reports whether id is a worker found in DNS and not drained since.
func (w *Watcher) Known(id uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, put := w.put[id]
	_, held := w.held[id]
	return put || held
}

// Hold keeps a worker drained by hand (DELETE /workers/{id}) from being
// put again while its address stays in DNS; false: not a worker found
// here. A put under way ends first, so a drain made after Hold stays.
func (w *Watcher) Hold(id uint64) bool {
	w.putting.Lock()
	defer w.putting.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	addr, ok := w.put[id]
	if !ok {
		return false
	}
	delete(w.put, id)
	w.held[id] = addr
	return true
}

// Held returns the addresses (ip:port) of the workers drained by hand and
// held, sorted.
func (w *Watcher) Held() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	addrs := make([]string, 0, len(w.held))
	for _, a := range w.held {
		addrs = append(addrs, a)
	}
	slices.Sort(addrs)
	return addrs
}

// Restore holds the workers of addrs (as Held gives them, parsed), as a
// hand drain would have, before the first lookup: they are not put while
// DNS names them. Each is forgotten once its address left every name's
// answer, as a hold is.
func (w *Watcher) Restore(addrs []netip.AddrPort) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ap := range addrs {
		a := addrText(ap)
		w.held[ID(a)] = a
	}
}

// Collector writes fastroute_dns_discovery_up{name}: 0 while a name's
// lookups fail (its workers are the last good answer's).
func (w *Watcher) Collector() metrics.Collector {
	return func(mw *metrics.Writer) {
		mw.Header("fastroute_dns_discovery_up", "gauge", "1 while a discovery.dns name's lookups answer; 0: it keeps the workers of its last good answer.")
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, n := range w.o.Names {
			up := 1.0
			if w.failing[n] {
				up = 0
			}
			mw.Sample("fastroute_dns_discovery_up", up, "name", n)
		}
	}
}
