// Package router assembles a running fastroute from a config: registry,
// selector, front end, health checker, admin listener and metrics.
package router

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fastroute/fastroute/affinity"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/aliases"
	"github.com/fastroute/fastroute/dataplane/apikeys"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/dataplane/http/admin"
	"github.com/fastroute/fastroute/dataplane/http/frontend"
	"github.com/fastroute/fastroute/dataplane/loops/health"
	"github.com/fastroute/fastroute/dataplane/loops/prefixshare"
	"github.com/fastroute/fastroute/dataplane/loops/weights"
	"github.com/fastroute/fastroute/dataplane/metrics"
	"github.com/fastroute/fastroute/dataplane/mirrors"
	"github.com/fastroute/fastroute/dataplane/tracing"
	"github.com/fastroute/fastroute/discovery"
	"github.com/fastroute/fastroute/discovery/dns"
	"github.com/fastroute/fastroute/internal/bearer"
	"github.com/fastroute/fastroute/internal/dialer"
	"github.com/fastroute/fastroute/internal/every"
	"github.com/fastroute/fastroute/internal/tlsfiles"
	"github.com/fastroute/fastroute/telemetry/cpu"
	"github.com/fastroute/fastroute/telemetry/engine"
	"github.com/fastroute/fastroute/telemetry/nvml"
)

// Router is a started fastroute.
type Router struct {
	// Config is the configuration running now; Reload replaces it (read it
	// through CurrentConfig while a reload may run).
	Config   config.Config
	Registry *dataplane.Registry
	Selector *dataplane.Selector
	Frontend *frontend.Server
	Health   *health.Checker
	Sessions *affinity.Table
	// Responses holds where each stored response of the Responses API is
	// (storedResponses).
	Responses *affinity.Table
	// PrefixShare sends what the prefix table (Prefixes) records anew to
	// the peer replicas; nil without peers or an address to advertise.
	PrefixShare *prefixshare.Loop
	Metrics     *metrics.Set
	// APIKeys are the keys clients present (api_keys_file); none while it
	// is unset. A reload sets them anew.
	APIKeys apikeys.Keys
	// Tracer exports the sampled requests' spans while
	// tracing.otlp_endpoint is set (a reload turns it on or off).
	Tracer *tracing.Tracer

	log *slog.Logger
	// adminToken and workerKey are admin_token and worker_api_key as they
	// run: a reload sets them anew.
	adminToken, workerKey bearer.Token
	metricsPublic         atomic.Bool   // metrics_public as it runs
	prefixLearned         atomic.Uint64 // prefix records taken from peer replicas
	upgrading             atomic.Bool   // an upgrade's new process starts: admin changes are refused (BeginUpgrade)
	reloadMu              sync.Mutex    // one reload at a time; guards Config and source
	source                func() (config.Config, error)
	reloads               *reloads // those from source, for the scrape
	ln, adminLn           net.Listener
	admin                 *http.Server
	*tlsState                             // what the TLS files hold, as the start's check read them
	ctx                   context.Context // the loops': Close cancels it
	cancel                context.CancelFunc
	engines               atomic.Pointer[engineLoop]        // nil while telemetry.engine is off
	engineFallbacks       atomic.Uint64                     // those of the engine scrapes stopped (stopEngines)
	weights               atomic.Pointer[weightLoop]        // nil while telemetry's nvml and cpu are off
	weightFallbacks       metrics.Counter                   // the weight loops', one after another
	loops                 sync.WaitGroup                    // health and telemetry goroutines
	drainSweep            *every.Period                     // how often drained workers are swept: health.interval
	prefixes              atomic.Pointer[affinity.Prefixes] // the prefix table; nil while router.prefix_affinity is off
	keyShare              *running                          // the API keys' use shared on etcd (shareKeyUsage); nil: not shared. Under reloadMu
	keyShareSelf          string                            // this replica's key there
	registration          *running                          // this replica's registration on etcd (keepRegistered); nil: none. Under reloadMu
	dns                   atomic.Pointer[dns.Watcher]       // the workers found by DNS name; nil while discovery.dns names no host
	etcd                  atomic.Pointer[discovery.Watcher] // the workers found on etcd (Discovery); nil while discovery.etcd names no endpoint
	dnsLoop               *running                          // its lookups (startDNS); nil: none. Under reloadMu
	etcdFiles             [sha256.Size]byte                 // what discovery.etcd's TLS files held when its client was made (etcdFilesDigest). Under reloadMu
	logFormat             func(string)                      // sets log.format (FormatLogsWith); nil: a restart's
}

// Start validates cfg, registers its workers and opens both listeners.
// Nothing is left running when it returns an error.
func Start(cfg config.Config, log *slog.Logger) (*Router, error) {
	return StartWith(cfg, log, func(_, address string) (net.Listener, error) { return net.Listen("tcp", address) })
}

// Listen opens the TCP listener of a config key (listen, admin_listen) on
// its address; a process that took over from another (an upgrade) gets
// the listener the other served for that key, with the connections
// queued on it.
type Listen func(key, address string) (net.Listener, error)

// Restored is what a start would take from the state file.
type Restored struct {
	// Workers the admin API added that the config does not name.
	Workers int
	// DNSDrained counts the hand drains of workers found by DNS, held at
	// start while discovery.dns is on and dropped otherwise (DNSOff).
	DNSDrained int
	DNSOff     bool
	// Down counts the workers put down by hand, kept down at start.
	Down int
}

// Checked is what Check found: what the state file would restore at
// start, the certificates the router would show, and when each issuer's
// revocation list of tls.client_crl_file is due to be replaced.
type Checked struct {
	Restored
	Certificates    []Shown
	RevocationLists []tlsfiles.IssuerUpdate
}

// Shown is a certificate the router would show: the config key that names
// it (tls: the front end's; admin_tls: the admin listener's; worker_tls:
// its client certificate to workers), and its leaf.
type Shown struct {
	Key  string
	Leaf *x509.Certificate
}

// Check reads cfg as Start would, and starts nothing: it validates it,
// reads the files its secrets and clients' API keys are in, loads its
// TLS certificates and CA files (the front end's, the workers', etcd's)
// and reads its state file. It returns cfg with the secrets read, and what
// it found.
func Check(cfg config.Config) (config.Config, Checked, error) {
	cfg, found, err := check(cfg, slog.Default())
	if err != nil {
		return cfg, Checked{}, err
	}
	st := found.state
	checked := Checked{Certificates: found.tls.shown(),
		Restored: Restored{Workers: st.added(cfg.Workers), DNSDrained: len(st.DNSDrained), DNSOff: !cfg.Discovery.DNS.On(), Down: len(st.Down)}}
	if fc := found.tls.cert.cur.Load(); fc != nil && fc.crls != nil {
		checked.RevocationLists = fc.crls.NextUpdates()
	}
	return cfg, checked, nil
}

// checkedFiles is what check read: the state file's state (empty without
// one) and the TLS files.
type checkedFiles struct {
	state adminState
	tls   *tlsState
}

// check is Check; what it warns of (a revocation list out of date,
// workers' certificates left unchecked) goes to log.
func check(cfg config.Config, log *slog.Logger) (config.Config, checkedFiles, error) {
	var none checkedFiles
	found := checkedFiles{tls: &tlsState{}}
	if err := cfg.Validate(); err != nil {
		return cfg, none, err
	}
	if err := cfg.ResolveSecrets(os.Getenv); err != nil {
		return cfg, none, err
	}
	ts := found.tls
	if cfg.TLS.On() {
		if err := ts.cert.load(cfg.TLS, log); err != nil {
			return cfg, none, err
		}
	}
	adminFiles, err := readAdminTLS(cfg.AdminTLS)
	if err != nil {
		return cfg, none, err
	}
	ts.useAdminTLS(cfg.AdminTLS, adminFiles)
	if err := ts.startWorkerTLS(cfg.WorkerTLS, log); err != nil {
		return cfg, none, err
	}
	if _, err := discovery.TLSConfig(etcdOptions(cfg.Discovery.Etcd, nil)); err != nil {
		return cfg, none, err
	}
	if cfg.StateFile == "" {
		return cfg, found, nil
	}
	found.state, err = readState(cfg.StateFile)
	return cfg, found, err
}

// StartWith is Start with the listeners opened by listen.
func StartWith(cfg config.Config, log *slog.Logger, listen Listen) (*Router, error) {
	if log == nil {
		log = slog.Default()
	}
	cfg, found, err := check(cfg, log)
	if err != nil {
		return nil, err
	}
	reg := dataplane.NewRegistry()
	for _, spec := range cfg.Workers {
		if _, err := reg.Add(spec); err != nil {
			return nil, fmt.Errorf("worker %d: %w", spec.ID, err)
		}
	}
	reg.SetEjectPolicy(ejectPolicy(cfg.Health))
	sel, err := dataplane.NewSelector(reg, cfg.Router.Mode, cfg.Router.BusyThreshold)
	if err == nil {
		err = sel.SetPolicy(cfg.Router.Mode, cfg.Router.BusyThreshold, cfg.Router.CPURatio)
	}
	if err == nil {
		err = sel.SetPhaseModes(cfg.Router.Disaggregation.PrefillMode, cfg.Router.Disaggregation.DecodeMode)
	}
	if err != nil {
		return nil, err
	}
	aff := cfg.Router.SessionAffinity
	r := &Router{Config: cfg, Registry: reg, Selector: sel, Metrics: &metrics.Set{}, log: log, tlsState: found.tls,
		Sessions:  affinity.NewTable(affinity.Options{TTL: aff.TTL, MaxSessions: aff.MaxSessions}),
		Responses: affinity.NewTable(storedResponses), drainSweep: every.NewPeriod(cfg.Health.Interval),
		weightFallbacks: metrics.NewCounter(), keyShareSelf: newReplicaID(), reloads: newReloads(time.Now())}
	r.adminToken.Set(cfg.AdminToken)
	r.metricsPublic.Store(cfg.MetricsPublic)
	r.workerKey.Set(cfg.WorkerAPIKey)
	pa := cfg.Router.PrefixAffinity
	prefixes := prefixTable(pa)
	r.prefixes.Store(prefixes)
	if pa.Enabled {
		if len(pa.Peers) > 0 || pa.Advertise != "" {
			prefixes.Share(prefixshare.JournalKeys)
			r.PrefixShare = prefixshare.New(prefixshare.Options{Prefixes: prefixes, Peers: pa.Peers, Self: pa.Advertise,
				Token: &r.adminToken, Interval: pa.ShareInterval, Timeout: max(time.Second, pa.ShareInterval), TLS: r.adminCert.peerConfig(r.peerRoots), Logger: log})
			r.Metrics.Register(r.PrefixShare.Collector())
		}
	}
	rt := dataplane.Routing{Sessions: r.Sessions, EmbedCache: embedCache(cfg.Router.EmbeddingCacheSize), Responses: r.Responses,
		Prefixes: prefixes, PrefixSlack: int64(pa.Slack), PrefixBlock: pa.BlockBytes, PrefixBlocks: pa.MaxBlocks}
	routingKnobs(cfg, &rt)
	sel.SetRouting(rt)
	fo := frontend.Options{
		Selector: sel, Retries: cfg.Router.Retries, RetryBudget: retryBudget(cfg.Router.RetryBudget),
		ClientLimits: clientLimits(cfg.Limits), MaxConnections: cfg.Limits.MaxConnections, Logger: log,
		Policy: frontendPolicy(cfg), QueueSize: cfg.Router.Queue.Size, QueueTimeout: cfg.Router.Queue.Timeout,
		APIKeys: &r.APIKeys, WorkerAPIKey: &r.workerKey,
	}
	r.APIKeys.Set(cfg.APIKeys)
	modelAliases, err := aliases.New(cfg.ModelAliases)
	if err != nil {
		return nil, err // Validate checked them: not reached
	}
	modelMirrors, err := mirrors.New(cfg.ModelMirrors)
	if err != nil {
		return nil, err // Validate checked them: not reached
	}
	fo.WorkerTLS = r.workerTLS
	if r.Tracer, err = tracing.New(cfg.Tracing, tracing.Options{Logger: log}); err != nil {
		return nil, err // Validate checked it: not reached
	}
	fo.Tracer = r.Tracer
	r.Metrics.Register(r.Tracer.Collector())
	fo.AccessLog = log.With("log", "access")
	fo.ProxyProtocol = proxyProtocol(cfg.ProxyProtocol)
	if cfg.TLS.On() {
		fo.TLS = r.cert.serverConfig()
	}
	r.Frontend = frontend.New(fo)
	r.Frontend.SetAliases(modelAliases)
	r.Frontend.SetMirrors(modelMirrors)
	r.Health = health.New(reg, health.Options{
		Interval: cfg.Health.Interval, Timeout: cfg.Health.Timeout, Path: cfg.Health.Path, UnhealthyAfter: cfg.Health.UnhealthyAfter,
		Logger: log, APIKey: &r.workerKey, TLS: r.workerTLS,
	})
	r.Metrics.Register(r.Frontend.Metrics().Collector(func() string { return string(r.CurrentConfig().Router.Mode) }, reg))
	r.Metrics.Register(r.stateCollector())
	r.Metrics.Register(r.reloads.collector())
	r.Metrics.Register(metrics.Process())
	r.Metrics.Register(r.dnsCollector)
	r.Metrics.Register(r.etcdCollector)
	if err := r.newDNS(cfg.Discovery.DNS); err != nil {
		return nil, err
	}
	if err := r.restoreState(found.state); err != nil {
		return nil, err
	}

	if r.ln, err = listen("listen", cfg.Listen); err != nil {
		return nil, fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	if r.adminLn, err = listen("admin_listen", cfg.AdminListen); err != nil {
		r.ln.Close()
		return nil, fmt.Errorf("admin_listen %s: %w", cfg.AdminListen, err)
	}
	r.admin = &http.Server{
		Handler: admin.Handler(admin.Options{Registry: reg, Metrics: r.Metrics, Token: &r.adminToken,
			MetricsPublic: &r.metricsPublic, Logger: log, Reload: r.ReloadFromSource, Probe: r.probeSoon,
			Config:   func() ([]byte, error) { return r.CurrentConfig().RedactedYAML() },
			Describe: r.describe, Drain: r.drainWorker, SetDown: r.setWorkerDown, LearnPrefixes: r.learnPrefixes, APIKeys: &r.APIKeys,
			WritesRefused: r.writesRefused,
			Changed:       r.saveState}),
		ReadHeaderTimeout: 10 * time.Second,
		// What net/http says of a connection (a failed TLS handshake, a
		// handler's panic) goes to the router's log, in its format.
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	if err := r.startDiscovery(cfg.Discovery.Etcd); err != nil {
		r.ln.Close()
		r.adminLn.Close()
		return nil, err
	}
	// Nothing can fail from here on: the GPU library, initialised now, is
	// shut down only by Close (or a reload that turns nvml off).
	ctx, cancel := context.WithCancel(context.Background())
	r.ctx, r.cancel = ctx, cancel
	r.registerTelemetryMetrics()
	r.runWeights(cfg.Telemetry)
	if e := cfg.Telemetry.Engine; e.Enabled {
		// The engines' first readings before the first request (a
		// restart in front of busy engines routes its first requests by
		// their costs); new connections wait in the listener's backlog
		// meanwhile, a scrape timeout at most.
		r.runEngines(e, true)
	}
	go func() {
		// nil once Close closed the listener; a failure otherwise (the
		// front end already waits out a shortage of descriptors).
		if err := r.Frontend.Serve(r.ln); err != nil {
			log.Error("the front end stopped accepting connections", "listen", r.Addr(), "err", err)
		}
	}()
	go func() {
		ln := adminListener{Listener: r.adminLn, ts: r.tlsState, conf: r.adminListenerConfig()}
		if err := r.admin.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("the admin listener stopped accepting connections", "listen", r.AdminAddr(), "err", err)
		}
	}()
	r.loops.Go(func() { r.Health.Run(ctx) })
	r.loops.Go(func() { reg.Run(ctx, r.drainSweep) })
	r.loops.Go(func() { r.Sessions.Run(ctx) })
	r.loops.Go(func() { r.Responses.Run(ctx) })
	if r.PrefixShare != nil {
		r.loops.Go(func() { r.PrefixShare.Run(ctx) })
	}
	r.keepRegistered(cfg.Discovery.Etcd)
	r.shareKeyUsage(cfg.Discovery.Etcd, cfg.APIKeysShareInterval)
	r.startDNS(true)
	r.Tracer.Start()
	log.Info("fastroute started", "listen", r.Addr(), "admin", r.AdminAddr(),
		"mode", cfg.Router.Mode, "workers", len(cfg.Workers), "max_connections", r.Frontend.MaxConnections())
	return r, nil
}

// learnPrefixes takes in a peer replica's prefix records (POST /prefixes
// on the admin listener): admin.ErrPrefixAffinityOff while prefix affinity
// is off.
func (r *Router) learnPrefixes(records []byte) (int, error) {
	t := r.prefixes.Load()
	if t == nil {
		return 0, admin.ErrPrefixAffinityOff
	}
	n, err := t.Learn(records)
	r.prefixLearned.Add(uint64(n))
	return n, err
}

// Prefixes returns the prefix table routing reads (router.prefix_affinity),
// nil while prefix affinity is off.
func (r *Router) Prefixes() *affinity.Prefixes { return r.prefixes.Load() }

// prefixTable is a new, empty table of pa's size, nil while pa is off.
func prefixTable(pa config.PrefixAffinity) *affinity.Prefixes {
	if !pa.Enabled {
		return nil
	}
	return affinity.NewPrefixes(pa.TableSize)
}

// PrefixesLearned returns how many prefix records this router took in
// from its peer replicas.
func (r *Router) PrefixesLearned() uint64 { return r.prefixLearned.Load() }

// probeSoon probes worker id now, so a worker added while running (admin
// API, reload, discovery) enters rotation as soon as it answers.
func (r *Router) probeSoon(id uint64) { go r.Health.Check(id) }

// replaceWorker gives a registered worker a new spec (Registry.Replace)
// and probes it now when the spec names another engine (another URL: the
// worker is on probation until a probe judges it).
func (r *Router) replaceWorker(spec dataplane.WorkerSpec) error {
	if _, err := r.Registry.Replace(spec); err != nil {
		return err
	}
	if w, ok := r.Registry.Get(spec.ID); ok && w.OnProbation() {
		r.probeSoon(spec.ID)
	}
	return nil
}

// CurrentConfig returns the configuration running now. Its slices and
// maps are the running config's own: a caller that changes one (to Reload
// the result, say) copies it first, or the change is the running config's
// too and the reload finds nothing changed.
func (r *Router) CurrentConfig() config.Config {
	r.reloadMu.Lock()
	defer r.reloadMu.Unlock()
	return r.Config
}

// Addr returns the front end's address.
func (r *Router) Addr() string { return r.ln.Addr().String() }

// AdminAddr returns the admin listener's address.
func (r *Router) AdminAddr() string { return r.adminLn.Addr().String() }

// BeginUpgrade has the admin API refuse changes (503, Retry-After: 1)
// while an upgrade's new process starts: it reads the config and the
// state file as it starts, so a worker added, drained or given adapters
// here meanwhile, or a reload, would be lost when it takes over. Reads are
// served. EndUpgrade takes the refusal back when the upgrade failed; once
// it succeeded, HandOverAdmin leaves the admin API to the new process.
func (r *Router) BeginUpgrade() { r.upgrading.Store(true) }

// EndUpgrade has the admin API take changes again (BeginUpgrade).
func (r *Router) EndUpgrade() { r.upgrading.Store(false) }

// writesRefused is admin.Options.WritesRefused: why changes are refused
// now, if they are.
func (r *Router) writesRefused() string {
	if r.upgrading.Load() {
		return "an upgrade is under way: the new process takes the admin API over once it is ready (a change made here would be lost); retry then"
	}
	return ""
}

// HandOverAdmin stops accepting admin connections and closes the idle
// ones, leaving open admin requests to finish: an upgrade's old process so
// leaves the admin listener, whose socket the new process holds too, to
// the new one while it drains (its metrics, reloads and worker drains
// would otherwise land on either process by turns).
func (r *Router) HandOverAdmin() {
	go func() { _ = r.admin.Shutdown(context.Background()) }()
}

// spanFlushTimeout bounds the export of the spans still queued at Close.
const spanFlushTimeout = 5 * time.Second

// Close stops the health loop and both listeners, waiting for open
// requests up to shutdown_timeout and cutting those still open then.
func (r *Router) Close() error {
	r.closeDiscovery()
	r.reloadMu.Lock()
	r.cancel()
	// The loops end; the workers' readings and weights stay as they are
	// (stopEngines and stopWeights give them up, for a reload that turns
	// a reader off).
	if l := r.engines.Swap(nil); l != nil {
		l.end()
	}
	if l := r.weights.Swap(nil); l != nil {
		l.end()
	}
	if r.keyShare != nil {
		r.keyShare.end() // its key deleted from etcd
	}
	if r.registration != nil {
		r.registration.end() // its key deleted from etcd
	}
	if r.dnsLoop != nil {
		r.dnsLoop.end()
	}
	r.reloadMu.Unlock()
	r.loops.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), r.CurrentConfig().ShutdownTimeout)
	defer cancel()
	err := r.Frontend.Shutdown(ctx)
	_ = r.ln.Close() // in case Serve had not yet taken the listener
	// The spans still queued, the drained requests' among them.
	flush, cancelFlush := context.WithTimeout(context.Background(), spanFlushTimeout)
	defer cancelFlush()
	r.Tracer.Close(flush)
	if aerr := r.admin.Close(); aerr != nil && !errors.Is(aerr, http.ErrServerClosed) {
		err = errors.Join(err, aerr)
	}
	return err
}

// newGPU returns the collector of this machine's GPUs; a test puts a mock
// library behind it.
var newGPU = nvml.NewSystem

// running is a loop a reload may start and stop (the weights', the engine
// scrapes'): the stop of its context, and its end.
type running struct {
	stop context.CancelFunc
	done chan struct{}
}

// start runs loop in a goroutine until end, or until the router closes.
func (r *Router) start(loop func(ctx context.Context)) running {
	ctx, stop := context.WithCancel(r.ctx)
	l := running{stop: stop, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		loop(ctx)
	}()
	return l
}

// end stops the loop and waits for it to return.
func (l running) end() {
	l.stop()
	<-l.done
}

// weightLoop is the GPU/CPU weight loop as it runs, with the GPU library
// it started (nil: none).
type weightLoop struct {
	*weights.Loop
	gpu *nvml.Collector
	running
}

// end stops the loop, waits for its last tick, and shuts its GPU library
// down.
func (l *weightLoop) end() {
	l.running.end()
	if l.gpu != nil {
		l.gpu.Close()
	}
}

// runWeights starts the weight loop over the readers t turns on (none:
// nothing runs). A GPU library that cannot start is logged once; GPU
// workers then keep their static capacity and say why in GET /workers.
// The caller holds reloadMu, or starts the router.
func (r *Router) runWeights(t config.Telemetry) {
	if !t.NVML && !t.CPU {
		return
	}
	o := weights.Options{Registry: r.Registry, Interval: t.Interval, Logger: r.log, Fallbacks: r.weightFallbacks}
	var gpu *nvml.Collector
	if t.NVML {
		gpu = newGPU()
		if err := gpu.Start(); err != nil {
			r.log.Warn("gpu telemetry unavailable; gpu workers keep their static capacity", "err", err)
			o.Sources = append(o.Sources, weights.GPUDown(err.Error()))
			gpu = nil
		} else {
			o.Sources = append(o.Sources, weights.NewGPU(gpu))
		}
	}
	if t.CPU {
		o.Sources = append(o.Sources, weights.NewCPU(cpu.NewCollector("/")))
	}
	l := &weightLoop{Loop: weights.New(o), gpu: gpu}
	l.running = r.start(l.Run)
	r.weights.Store(l)
}

// stopWeights ends the weight loop, if it runs, shuts its GPU library
// down, and gives every worker its static capacity back. The caller holds
// reloadMu (a reload).
func (r *Router) stopWeights() {
	l := r.weights.Swap(nil)
	if l == nil {
		return
	}
	l.end() // its last tick ended: none sets a weight after the reset
	for _, w := range r.Registry.All() {
		w.SetWeight(w.Spec().Capacity)
	}
	r.Registry.Republish()
}

// Weights returns the GPU/CPU weight loop running now; nil while
// telemetry's nvml and cpu are off.
func (r *Router) Weights() *weights.Loop {
	if l := r.weights.Load(); l != nil {
		return l.Loop
	}
	return nil
}

// engineLoop is the engine scrapes as they run.
type engineLoop struct {
	*engine.Scraper
	running
}

// runEngines starts the poller of every worker's engine metrics (after a
// first round of scrapes when prime is set); each reading lands on its
// worker (Registry.SetEngine), where the load-aware cost reads it, and
// takes the worker out of rotation while its engine sleeps or stalled.
// The caller holds reloadMu, or starts the router.
func (r *Router) runEngines(e config.Engine, prime bool) {
	reg := r.Registry
	s := engine.New(engine.Options{
		Interval: e.Interval, Timeout: e.Timeout, Logger: r.log, APIKey: &r.workerKey, TLS: r.workerTLS, StallAfter: e.StallAfter,
		Dial: (&dialer.Dialer{CacheTime: dataplane.NameCacheTime}).Dial,
		Targets: func() []engine.Target {
			all := reg.All()
			out := make([]engine.Target, len(all))
			for i, w := range all {
				s := w.Spec()
				out[i] = engine.Target{ID: s.ID, URL: s.BaseURL() + s.MetricsPath, Slots: s.MaxInflight, Socket: s.Socket(), Relayed: w.Relayed}
			}
			return out
		},
		Publish: reg.SetEngine,
	})
	if prime {
		s.Prime(r.ctx)
	}
	r.engines.Store(&engineLoop{Scraper: s, running: r.start(s.Run)})
}

// stopEngines ends the engine scrapes, if they run, and withdraws every
// worker's reading: each is routed on the router's own signals from then
// on, and one whose engine slept or stalled is judged by its probes
// again. The caller holds reloadMu (a reload).
func (r *Router) stopEngines() {
	l := r.engines.Swap(nil)
	if l == nil {
		return
	}
	l.end() // its scrapes ended: none publishes after the withdrawal
	fallbacks, _ := l.Counts()
	r.engineFallbacks.Add(fallbacks)
	for _, w := range r.Registry.All() {
		r.Registry.SetEngine(w.ID(), nil)
	}
}

// registerTelemetryMetrics has the scrape show the weight loop's readings
// and the engine scrapes' counts while they run; their fallbacks count on
// across their stops and starts.
func (r *Router) registerTelemetryMetrics() {
	r.Metrics.Register(func(w *metrics.Writer) {
		if l := r.weights.Load(); l != nil {
			l.Collector()(w)
		}
		// The stopped loops' count before the running loop: stopEngines
		// adds a loop's count after it took the loop away, so no loop's
		// count is in both.
		stopped := r.engineFallbacks.Load()
		l := r.engines.Load()
		if l == nil {
			return
		}
		fallbacks, without := l.Counts()
		w.Header("fastroute_engine_fallbacks_total", "counter", "Times a worker lost its fresh engine metrics and was routed on the router's own signals.")
		w.Sample("fastroute_engine_fallbacks_total", float64(stopped+fallbacks))
		w.Header("fastroute_engine_workers_without_reading", "gauge", "Workers with no fresh engine metrics reading.")
		w.Sample("fastroute_engine_workers_without_reading", float64(without))
	})
}

// closeDiscovery stops watching etcd; the workers found stay.
func (r *Router) closeDiscovery() {
	if w := r.Discovery(); w != nil {
		_ = w.Close()
	}
}

// describe adds the telemetry view of a worker to GET /workers, and where
// it came from when discovery found it.
func (r *Router) describe(w *dataplane.Worker, info map[string]any) {
	if e := r.Discovery(); e != nil && e.Known(w.ID()) {
		info["discovered"] = "etcd"
		info["discovery_up"] = e.Up()
	}
	if d := r.DNS(); d != nil && d.Known(w.ID()) {
		info["discovered"] = "dns"
	}
	if l := r.weights.Load(); l != nil {
		l.Describe(w, info)
	}
	if l := r.engines.Load(); l != nil {
		l.Describe(w.ID(), info)
	}
	if st := w.Engine(); st != nil && st.StandIn > 0 {
		info["engine_stand_in_capacity"] = st.StandIn
	}
	if st := w.Engine(); st != nil && st.Dialect == engine.DialectRouter {
		info["engine_slots"] = st.Slots // the batch it is priced for (Registry.SetEngine)
	}
}

// storedResponses bounds the table of where stored responses are: an id
// unused for a day, or created 65,536 ids ago, is forgotten, and the next
// request naming it searches the workers for it. (vLLM keeps a stored
// response until it restarts.)
var storedResponses = affinity.Options{TTL: 24 * time.Hour, MaxSessions: 1 << 16}

// disaggOptions maps the config's disaggregation keys onto the front end's.
func disaggOptions(d config.Disaggregation) frontend.Disagg {
	var out frontend.Disagg
	switch d.Protocol {
	case config.DisaggVLLM:
		out.Protocol = frontend.ProtocolVLLM
	case config.DisaggSGLang:
		out.Protocol = frontend.ProtocolSGLang
	}
	return out
}

// retryBudget is the front end's form of router.retry_budget.
func retryBudget(b config.RetryBudget) frontend.RetryBudget {
	return frontend.RetryBudget{Percent: b.Percent, MinRetries: int64(b.MinRetries)}
}

// frontendPolicy is what the front end takes of cfg that a reload may
// change of how it treats requests. Validate checked what it reads.
func frontendPolicy(cfg config.Config) frontend.Policy {
	access, _ := frontend.ParseAccess(cfg.Log.Access)
	p := frontend.Policy{Routes: cfg.Routes, CORSOrigins: cfg.CORSAllowedOrigins, RetryStatuses: cfg.Router.RetryStatuses,
		GenerateRequestIDs: cfg.GenerateRequestIDs, AddXForwardedFor: cfg.AddXForwardedFor, Access: access,
		Disagg: disaggOptions(cfg.Router.Disaggregation)}
	if cfg.RealIP.Header != "" {
		from, _ := cfg.RealIP.Prefixes()
		p.RealIP = &frontend.RealIP{Header: cfg.RealIP.Header, From: from}
	}
	p.ForwardedCertFrom, _ = cfg.ForwardedClientCert.Prefixes()
	l := cfg.Limits
	p.Limits = frontend.Limits{ConnectTimeout: l.ConnectTimeout, FirstByteTimeout: l.FirstByteTimeout, StreamIdleTimeout: l.StreamIdleTimeout,
		AnswerBufferBytes: int(l.AnswerBufferBytes), MaxRequestsPerConnection: l.MaxRequestsPerConnection}
	return p
}

// clientLimits are the bounds of a client connection of l (the front
// end's ClientLimits).
func clientLimits(l config.Limits) frontend.ClientLimits {
	return frontend.ClientLimits{MaxBodyBytes: int(l.MaxBodyBytes), MaxHeaderBytes: int(l.MaxHeaderBytes),
		ReadTimeout: l.ReadTimeout, WriteTimeout: l.WriteTimeout, IdleTimeout: l.IdleTimeout}
}

// proxyProtocol is the front end's reading of PROXY protocol headers
// proxy_protocol asks for (nil: none). Validate checked its prefixes.
func proxyProtocol(p config.ProxyProtocol) *frontend.ProxyProtocol {
	if !p.Enabled {
		return nil
	}
	from, _ := p.Prefixes()
	return &frontend.ProxyProtocol{From: from}
}

// ejectPolicy is the passive health check health's keys set.
func ejectPolicy(h config.Health) dataplane.EjectPolicy {
	return dataplane.EjectPolicy{After: h.EjectAfter, Base: h.EjectTime, Max: h.EjectMax}
}

// routingKnobs sets the keys of rt a reload may change: session
// affinity's mode and header, LoRA placement and disaggregation's bounds,
// fallback and whether decode workers prefill (vLLM's protocol). Validate
// checked what it reads.
func routingKnobs(cfg config.Config, rt *dataplane.Routing) {
	aff, d := cfg.Router.SessionAffinity, cfg.Router.Disaggregation
	rt.SessionMode, _ = affinity.ParseMode(aff.Mode)
	rt.SessionHeader = aff.Header
	rt.PlaceAdapters = cfg.Router.LoRAPlacement == "rendezvous"
	rt.MinPrefillTokens, rt.MaxPrefillQueue, rt.PrefillFallback = d.MinPrefillTokens, d.MaxPrefillQueue, d.Fallback == config.FallbackAggr
	rt.DecodePrefills = d.Protocol == config.DisaggVLLM
}

// embedCache is the embedding cache table of router.embedding_cache_size
// keys; nil for 0 (off).
func embedCache(keys int) *affinity.Cache {
	if keys <= 0 {
		return nil
	}
	return affinity.NewCache(keys)
}
