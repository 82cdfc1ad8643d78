package router

import (
	"fmt"
	"net/url"
	"os"
	"reflect"
	"slices"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/aliases"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/dataplane/mirrors"
	"github.com/fastroute/fastroute/dataplane/tracing"
)

// Reload applies a new config to the running router, for the requests and
// connections that begin from then on (streams in flight are untouched):
// workers added, removed (drained: in-flight requests finish) or changed
// (replaced; the old spec's in-flight requests finish on it), and every key
// a running router can change: the routing policy (router.mode,
// busy_threshold, cpu_ratio, retries and their budget, prefix affinity's
// slack, and its peers and share interval on a replica that shares, or its
// table (turned on or off too: applyPrefixTable) on one that does not
// (reloadablePrefixes), the routing knobs: routingKnobs, session affinity's
// TTL and bound (SetMaxSessions), the phases' pickers, and the embedding
// cache's size: a new, empty table), the front end's policy (frontendPolicy:
// the limits of an exchange with a worker among them, and disaggregation's
// protocol), a client connection's own limits (SetClientLimits: the
// connections handed to fasthttp from then on, a kept-alive one from the
// request after the one it carries), the listener's bound on open
// connections and its PROXY protocol headers, the wait queue (turned on or
// off too), health's keys (its thresholds and ejections, the probes'
// interval, timeout and path), the GPU/CPU readers (turned on or off too:
// applyWeights), the engine scrapes (turned on or off too: applyEngines),
// log format (FormatLogsWith), DNS discovery's keys (turned on or off too:
// applyDNS) and etcd discovery's (moveEtcd; turned on or off too:
// startDiscovery, stopDiscovery, but off where the replica advertises itself
// there), the secrets and the clients' API keys (read again from their files
// or the environment), the certificates and revocation lists (tls, turned on
// or off too: applyListenerTLS, admin_tls: its certificate and CAs, turned
// on or off too unless the replica advertises itself, worker_tls's client
// certificate and the way workers' certificates are checked: read again),
// the API keys' sharing interval (the share started, stopped or started
// again: stopKeyShare, shareKeyUsage), aliases, mirrors, tracing (its sample
// ratio, its collector, turned on or off too: Tracer.Configure),
// metrics_public, the shutdown keys, state_file (the state that runs written
// to the new file, which replaces what it held) and pid_file (this process's
// id written to the new file, the old one removed if it holds it:
// pidfile.go). A config that fails validation is refused with the same error
// as at start, and nothing changes. A key a running router cannot change (a
// listener, prefix affinity's advertise), or one whose field that cannot
// change changed beside those that can (which holds the whole key back), is
// named in needRestart and keeps its old value.
func (r *Router) Reload(cfg config.Config) (applied, needRestart []string, err error) {
	r.reloadMu.Lock()
	defer r.reloadMu.Unlock()
	if err := cfg.Validate(); err != nil {
		return nil, nil, err
	}
	if err := cfg.ResolveSecrets(os.Getenv); err != nil {
		return nil, nil, err
	}
	old := r.Config
	if cfg.AdminToken == "" && config.OffHost(old.AdminListen) { // a new admin_listen waits for a restart
		return nil, nil, fmt.Errorf("key admin_token: the admin listener runs on %s, reachable from other hosts, and this config sets no admin token (admin_token, admin_token_file or %s)",
			old.AdminListen, config.AdminTokenEnv)
	}
	static := map[uint64]bool{}
	for _, s := range old.Workers {
		static[s.ID] = true
	}
	for i, s := range cfg.Workers {
		if !static[s.ID] && r.knownDiscovered(s.ID) {
			return nil, nil, fmt.Errorf("key workers[%d].id: %d is a worker found on etcd or in DNS; an id is never used twice", i, s.ID)
		}
	}
	var reread *frontConfig // read before anything applies: a bad one refuses the reload
	if cfg.TLS.On() {
		var err error
		if reread, err = r.cert.read(cfg.TLS, r.log); err != nil {
			return nil, nil, err
		}
	}
	// admin_tls applies, its files (whichever are set: peer_ca_file goes
	// without the listener's TLS too) read before anything applies; but
	// turning the listener's TLS on or off waits for a restart where the
	// replica advertises its admin listener's URL to the others (the
	// scheme of prefix_affinity.advertise, which a restart changes too).
	var adminRead *adminFiles
	adminTLSApplies := old.AdminTLS.On() == cfg.AdminTLS.On() || old.Router.PrefixAffinity.Advertise == ""
	if adminTLSApplies {
		files, err := readAdminTLS(cfg.AdminTLS)
		if err != nil {
			return nil, nil, err
		}
		adminRead = &files
	}
	// worker_tls's files, read before anything applies: its client
	// certificate, and a new configuration of the connections to workers
	// when the way their certificates are checked changed (a CA file
	// replaced under its name included).
	workerCert, err := readClientCertificate(cfg.WorkerTLS)
	if err != nil {
		return nil, nil, err
	}
	workerTLS, err := r.workerCert.workerConfig(cfg.WorkerTLS)
	if err != nil {
		return nil, nil, err
	}
	if old.WorkerTLS.Verification() == cfg.WorkerTLS.Verification() && workerTLS.RootCAs.Equal(r.workerTLS.RootCAs) {
		workerTLS = nil // as it is
	}
	// A new state_file takes the state that runs, written before anything
	// applies (one the router cannot write refuses the reload, as it stops
	// a start), and again once the reload applied.
	if cfg.StateFile != "" && cfg.StateFile != old.StateFile {
		if err := r.writeState(cfg.StateFile); err != nil {
			return nil, nil, err
		}
	}
	// A new pid_file gets this process's id before anything applies (one
	// the router cannot write refuses the reload); the old one goes.
	if cfg.PIDFile != old.PIDFile {
		if cfg.PIDFile != "" {
			if err := writePIDFile(cfg.PIDFile); err != nil {
				return nil, nil, err
			}
		}
		if old.PIDFile != "" {
			if err := removeOwnPIDFile(old.PIDFile); err != nil {
				r.log.Warn("reload: the pid_file before not removed", "file", old.PIDFile, "err", err)
			}
		}
	}
	// Prefix affinity's slack and peers apply unless another of its keys
	// changed too: that one waits for a restart, and the whole key with it.
	// discovery applies: discovery.dns's keys (turned on or off too:
	// applyDNS); discovery.etcd's, the watch, this replica's registration
	// and the keys' share following the new etcd (moveEtcd), and etcd
	// turned on (startDiscovery) or off (stopDiscovery: its workers
	// drained), but off on a replica that advertises itself there
	// (prefix_affinity.advertise, which needs etcd, waits for a restart:
	// the whole key with it). api_keys_share_interval applies (the share
	// started, stopped, or started again at the new interval): Validate
	// asks for etcd beside it, which the reload turns on if need be.
	od, nd := old.Discovery, cfg.Discovery
	etcdOn := len(od.Etcd.Endpoints) == 0 && len(nd.Etcd.Endpoints) > 0
	etcdOff := len(od.Etcd.Endpoints) > 0 && len(nd.Etcd.Endpoints) == 0
	discoveryApplies := !etcdOff || old.Router.PrefixAffinity.Advertise == ""
	// etcd's TLS files are read again: one replaced under its name (a
	// rotated client certificate) moves the router to the etcd it names,
	// as a new key would.
	etcdMoves, etcdFiles := !reflect.DeepEqual(od.Etcd, nd.Etcd), r.etcdFiles
	if r.Discovery() != nil && len(nd.Etcd.Endpoints) > 0 {
		if etcdFiles, err = etcdFilesDigest(nd.Etcd); err != nil {
			return nil, nil, err
		}
	}
	filesReplaced := etcdFiles != r.etcdFiles
	prefixesApply := reflect.DeepEqual(old.Router.PrefixAffinity, r.reloadablePrefixes(old.Router.PrefixAffinity, cfg.Router.PrefixAffinity))
	for key, same := range map[string]bool{
		"listen": old.Listen == cfg.Listen, "admin_listen": old.AdminListen == cfg.AdminListen,
		"admin_tls":              adminTLSApplies,
		"router.prefix_affinity": prefixesApply,
		"discovery":              discoveryApplies,
		"log.format":             old.Log.Format == cfg.Log.Format || r.logFormat != nil,
	} {
		if !same {
			needRestart = append(needRestart, key)
		}
	}
	slices.Sort(needRestart)
	etcdNow := od.Etcd // the etcd the router runs with once the reload applied
	switch {
	case !discoveryApplies:
	case etcdOn:
		if err := r.startDiscovery(nd.Etcd); err != nil {
			return nil, needRestart, err
		}
		etcdNow = nd.Etcd
		applied = append(applied, fmt.Sprintf("discovery.etcd on: endpoints %v, prefix %s", nd.Etcd.Endpoints, nd.Etcd.Prefix))
	case etcdOff:
		r.stopDiscovery()
		etcdNow = nd.Etcd
		applied = append(applied, "discovery.etcd off (its workers drained)")
	case etcdMoves || filesReplaced:
		if err := r.moveEtcd(nd.Etcd, old.APIKeysShareInterval); err != nil {
			return nil, needRestart, err
		}
		etcdNow, r.etcdFiles = nd.Etcd, etcdFiles
		change := fmt.Sprintf("discovery.etcd: endpoints %v, prefix %s", nd.Etcd.Endpoints, nd.Etcd.Prefix)
		if !etcdMoves {
			change += " (its TLS files replaced)"
		}
		applied = append(applied, change)
	}

	if cfg.Router.Mode != old.Router.Mode || cfg.Router.BusyThreshold != old.Router.BusyThreshold || cfg.Router.CPURatio != old.Router.CPURatio {
		if err := r.Selector.SetPolicy(cfg.Router.Mode, cfg.Router.BusyThreshold, cfg.Router.CPURatio); err != nil {
			return nil, needRestart, err // Validate checked them: not reached
		}
		applied = append(applied, fmt.Sprintf("router.mode=%s router.busy_threshold=%d router.cpu_ratio=%g",
			cfg.Router.Mode, cfg.Router.BusyThreshold, cfg.Router.CPURatio))
	}
	if cfg.Router.Retries != old.Router.Retries {
		r.Frontend.SetRetries(cfg.Router.Retries)
		applied = append(applied, fmt.Sprintf("router.retries=%d", cfg.Router.Retries))
	}
	if cfg.Router.RetryBudget != old.Router.RetryBudget {
		r.Frontend.SetRetryBudget(retryBudget(cfg.Router.RetryBudget))
		applied = append(applied, fmt.Sprintf("router.retry_budget=%+v", cfg.Router.RetryBudget))
	}
	if pa := cfg.Router.PrefixAffinity; prefixesApply {
		if r.PrefixShare == nil {
			applied = append(applied, r.applyPrefixTable(old.Router.PrefixAffinity, pa)...)
		}
		if pa.Slack != old.Router.PrefixAffinity.Slack {
			r.Selector.Reroute(func(rt *dataplane.Routing) { rt.PrefixSlack = int64(pa.Slack) })
			applied = append(applied, fmt.Sprintf("router.prefix_affinity.slack=%d", pa.Slack))
		}
		if !slices.Equal(pa.Peers, old.Router.PrefixAffinity.Peers) {
			r.PrefixShare.SetStatic(pa.Peers)
			applied = append(applied, fmt.Sprintf("router.prefix_affinity.peers=%v", pa.Peers))
		}
		if pa.ShareInterval != old.Router.PrefixAffinity.ShareInterval {
			r.PrefixShare.SetInterval(pa.ShareInterval)
			applied = append(applied, fmt.Sprintf("router.prefix_affinity.share_interval=%v", pa.ShareInterval))
		}
	}
	if !reflect.DeepEqual(cfg.Tracing, old.Tracing) {
		if err := r.Tracer.Configure(cfg.Tracing); err != nil {
			return nil, needRestart, err // Validate checked it: not reached
		}
		applied = append(applied, tracingChange(old.Tracing, cfg.Tracing))
	}
	if !reflect.DeepEqual(cfg.ModelAliases, old.ModelAliases) {
		t, err := aliases.New(cfg.ModelAliases)
		if err != nil {
			return nil, needRestart, err // Validate checked them: not reached
		}
		t.KeepCounts(r.Frontend.Aliases())
		r.Frontend.SetAliases(t)
		applied = append(applied, fmt.Sprintf("model_aliases (%d)", len(cfg.ModelAliases)))
	}
	if !reflect.DeepEqual(cfg.ModelMirrors, old.ModelMirrors) {
		t, err := mirrors.New(cfg.ModelMirrors)
		if err != nil {
			return nil, needRestart, err // Validate checked them: not reached
		}
		t.KeepCounts(r.Frontend.Mirrors())
		r.Frontend.SetMirrors(t)
		applied = append(applied, fmt.Sprintf("model_mirrors (%d)", len(cfg.ModelMirrors)))
	}
	if iv := cfg.APIKeysShareInterval; iv != old.APIKeysShareInterval {
		r.stopKeyShare()
		r.shareKeyUsage(etcdNow, iv)
		applied = append(applied, fmt.Sprintf("api_keys_share_interval=%v", iv))
	}
	if cfg.APIKeysFile != "" || old.APIKeysFile != "" {
		r.APIKeys.Set(cfg.APIKeys)
		applied = append(applied, fmt.Sprintf("api_keys_file=%q (%d keys)", cfg.APIKeysFile, len(cfg.APIKeys)))
	}
	// The secrets apply to the next request that sends or checks one (never
	// said: only that they changed).
	if cfg.AdminToken != old.AdminToken {
		r.adminToken.Set(cfg.AdminToken)
		applied = append(applied, "admin_token changed")
	}
	if f := cfg.Log.Format; f != old.Log.Format && r.logFormat != nil {
		r.logFormat(f)
		applied = append(applied, fmt.Sprintf("log.format=%s", f))
	}
	if cfg.MetricsPublic != old.MetricsPublic {
		r.metricsPublic.Store(cfg.MetricsPublic)
		applied = append(applied, fmt.Sprintf("metrics_public=%v", cfg.MetricsPublic))
	}
	if cfg.WorkerAPIKey != old.WorkerAPIKey {
		r.workerKey.Set(cfg.WorkerAPIKey)
		applied = append(applied, "worker_api_key changed")
	}
	if n := cfg.Limits.MaxConnections; n != old.Limits.MaxConnections {
		r.Frontend.SetMaxConnections(n)
		applied = append(applied, fmt.Sprintf("limits.max_connections=%d", r.Frontend.MaxConnections()))
	}
	if p := cfg.ProxyProtocol; !reflect.DeepEqual(p, old.ProxyProtocol) {
		r.Frontend.SetProxyProtocol(proxyProtocol(p))
		applied = append(applied, fmt.Sprintf("proxy_protocol={enabled: %v, from: %v}", p.Enabled, p.From))
	}
	// Disaggregation's protocol is the front end's (which requests split,
	// and how: a request split before finishes as it began) and routing's
	// (whether decode workers prefill: routingChanges names it).
	protocolMoves := old.Router.Disaggregation.Protocol != cfg.Router.Disaggregation.Protocol
	if changed := policyChanges(old, cfg); len(changed) > 0 || protocolMoves {
		r.Frontend.SetPolicy(frontendPolicy(cfg))
		applied = append(applied, changed...)
	}
	if ol, nl := old.Limits, cfg.Limits; clientLimits(ol) != clientLimits(nl) {
		r.Frontend.SetClientLimits(clientLimits(nl))
		applied = append(applied, changes(
			keyChange{"limits.max_body_bytes", ol.MaxBodyBytes == nl.MaxBodyBytes, nl.MaxBodyBytes},
			keyChange{"limits.max_header_bytes", ol.MaxHeaderBytes == nl.MaxHeaderBytes, nl.MaxHeaderBytes},
			keyChange{"limits.read_timeout", ol.ReadTimeout == nl.ReadTimeout, nl.ReadTimeout},
			keyChange{"limits.write_timeout", ol.WriteTimeout == nl.WriteTimeout, nl.WriteTimeout},
			keyChange{"limits.idle_timeout", ol.IdleTimeout == nl.IdleTimeout, nl.IdleTimeout})...)
	}
	if changed := routingChanges(old, cfg); len(changed) > 0 {
		routed := routedConfig(old, cfg)
		d := routed.Router.Disaggregation
		if err := r.Selector.SetPhaseModes(d.PrefillMode, d.DecodeMode); err != nil {
			return nil, needRestart, err // Validate checked them: not reached
		}
		r.Selector.Reroute(func(rt *dataplane.Routing) { routingKnobs(routed, rt) })
		applied = append(applied, changed...)
	}
	if n := cfg.Router.SessionAffinity.MaxSessions; n != old.Router.SessionAffinity.MaxSessions {
		r.Sessions.SetMaxSessions(n)
		applied = append(applied, fmt.Sprintf("router.session_affinity.max_sessions=%d", n))
	}
	if ttl := cfg.Router.SessionAffinity.TTL; ttl != old.Router.SessionAffinity.TTL {
		r.Sessions.SetTTL(ttl)
		applied = append(applied, fmt.Sprintf("router.session_affinity.ttl=%v", ttl))
	}
	applied = append(applied, r.applyWeights(old.Telemetry, cfg.Telemetry)...)
	applied = append(applied, r.applyEngines(old.Telemetry.Engine, cfg.Telemetry.Engine)...)
	if discoveryApplies {
		applied = append(applied, r.applyDNS(od.DNS, nd.DNS)...)
	}
	if n := cfg.Router.EmbeddingCacheSize; n != old.Router.EmbeddingCacheSize {
		r.Selector.Reroute(func(rt *dataplane.Routing) { rt.EmbedCache = embedCache(n) })
		applied = append(applied, fmt.Sprintf("router.embedding_cache_size=%d (the table starts empty)", n))
	}
	if q := cfg.Router.Queue; q != old.Router.Queue {
		r.Frontend.SetQueue(q.Size, q.Timeout)
		applied = append(applied, fmt.Sprintf("router.queue.size=%d router.queue.timeout=%v", q.Size, q.Timeout))
	}
	if h, o := cfg.Health, old.Health; h != o {
		r.Registry.SetEjectPolicy(ejectPolicy(h))
		r.Health.SetUnhealthyAfter(h.UnhealthyAfter)
		if h.Interval != o.Interval || h.Timeout != o.Timeout || h.Path != o.Path {
			r.Health.SetProbes(h.Interval, h.Timeout, h.Path)
			r.drainSweep.Set(h.Interval)
			applied = append(applied, fmt.Sprintf("health.interval=%v health.timeout=%v health.path=%q", h.Interval, h.Timeout, h.Path))
		}
		applied = append(applied, fmt.Sprintf("health.unhealthy_after=%d health.eject_after=%d health.eject_time=%v health.eject_max=%v",
			h.UnhealthyAfter, h.EjectAfter, h.EjectTime, h.EjectMax))
	}
	applied = append(applied, changes(
		keyChange{"shutdown_delay", cfg.ShutdownDelay == old.ShutdownDelay, cfg.ShutdownDelay},
		keyChange{"shutdown_timeout", cfg.ShutdownTimeout == old.ShutdownTimeout, cfg.ShutdownTimeout},
		keyChange{"state_file", cfg.StateFile == old.StateFile, cfg.StateFile},
		keyChange{"pid_file", cfg.PIDFile == old.PIDFile, cfg.PIDFile})...)
	applied = append(applied, r.reloadWorkers(old.Workers, cfg.Workers)...)
	applied = append(applied, r.applyListenerTLS(old.TLS, cfg.TLS, reread)...)
	if adminRead != nil {
		applied = append(applied, r.applyAdminTLS(old.AdminTLS, cfg.AdminTLS, *adminRead)...)
	}
	applied = append(applied, r.applyWorkerTLS(old.WorkerTLS, cfg.WorkerTLS, workerCert, workerTLS)...)

	next := old // what runs now: the applied keys new, the others as they were
	next.Router.Mode, next.Router.BusyThreshold, next.Router.Retries = cfg.Router.Mode, cfg.Router.BusyThreshold, cfg.Router.Retries
	next.Router.RetryBudget, next.Router.EmbeddingCacheSize = cfg.Router.RetryBudget, cfg.Router.EmbeddingCacheSize
	next.Router.CPURatio = cfg.Router.CPURatio
	if prefixesApply {
		next.Router.PrefixAffinity = cfg.Router.PrefixAffinity
	}
	next.Workers, next.ShutdownDelay, next.ShutdownTimeout = cfg.Workers, cfg.ShutdownDelay, cfg.ShutdownTimeout
	next.StateFile, next.PIDFile = cfg.StateFile, cfg.PIDFile
	next.Routes, next.CORSAllowedOrigins, next.Router.RetryStatuses = cfg.Routes, cfg.CORSAllowedOrigins, cfg.Router.RetryStatuses
	next.GenerateRequestIDs, next.AddXForwardedFor, next.Log.Access = cfg.GenerateRequestIDs, cfg.AddXForwardedFor, cfg.Log.Access
	if r.logFormat != nil {
		next.Log.Format = cfg.Log.Format
	}
	next.RealIP, next.ForwardedClientCert, next.Limits = cfg.RealIP, cfg.ForwardedClientCert, cfg.Limits
	next.AdminToken, next.AdminTokenFile, next.MetricsPublic = cfg.AdminToken, cfg.AdminTokenFile, cfg.MetricsPublic
	next.WorkerAPIKey, next.WorkerAPIKeyFile = cfg.WorkerAPIKey, cfg.WorkerAPIKeyFile
	next.APIKeysFile, next.APIKeys = cfg.APIKeysFile, cfg.APIKeys
	next.APIKeysShareInterval = cfg.APIKeysShareInterval
	next.ProxyProtocol = cfg.ProxyProtocol
	next.ModelAliases, next.ModelMirrors = cfg.ModelAliases, cfg.ModelMirrors
	next.TLS = cfg.TLS
	next.Tracing = cfg.Tracing
	next.Health = cfg.Health
	next.Router.Queue = cfg.Router.Queue
	if discoveryApplies {
		next.Discovery = cfg.Discovery
	}
	next.Telemetry = cfg.Telemetry
	next.Router = routedConfig(next, cfg).Router
	next.WorkerTLS = cfg.WorkerTLS
	if adminTLSApplies {
		next.AdminTLS = cfg.AdminTLS
	}
	r.Config = next
	r.saveStateLocked() // the config may name a worker the admin API added
	r.log.Info("config reloaded", "applied", applied, "need_restart", needRestart)
	return applied, needRestart, nil
}

// applyWeights restarts the GPU/CPU weight loop over the readers nt turns
// on when nvml or cpu changed (stopWeights, runWeights: the workers measured
// by none keep their static capacity), or applies a new interval to it, and
// says what changed. While both stay off, nt's interval is only recorded.
// The caller holds reloadMu.
func (r *Router) applyWeights(ot, nt config.Telemetry) (applied []string) {
	if ot.NVML != nt.NVML || ot.CPU != nt.CPU {
		r.stopWeights()
		r.runWeights(nt)
		return []string{fmt.Sprintf("telemetry.nvml=%v telemetry.cpu=%v telemetry.interval=%v", nt.NVML, nt.CPU, nt.Interval)}
	}
	if l := r.weights.Load(); l != nil && nt.Interval != ot.Interval {
		l.SetInterval(nt.Interval)
		applied = append(applied, fmt.Sprintf("telemetry.interval=%v", nt.Interval))
	}
	return applied
}

// applyEngines turns the engine scrapes on or off (stopEngines withdraws
// their readings), or applies a new interval, timeout or stall bound to
// them, as telemetry.engine changed from oe to ne, and says what changed.
// While they stay off, ne's keys are only recorded. The caller holds
// reloadMu.
func (r *Router) applyEngines(oe, ne config.Engine) (applied []string) {
	switch l := r.engines.Load(); {
	case !ne.Enabled:
		if oe.Enabled {
			r.stopEngines()
			applied = append(applied, "telemetry.engine.enabled=false (the workers' readings withdrawn)")
		}
	case !oe.Enabled:
		r.runEngines(ne, false)
		applied = append(applied, fmt.Sprintf("telemetry.engine.enabled=true telemetry.engine.interval=%v telemetry.engine.timeout=%v telemetry.engine.stall_after=%v",
			ne.Interval, ne.Timeout, ne.StallAfter))
	default:
		if ne.StallAfter != oe.StallAfter {
			l.SetStallAfter(ne.StallAfter)
			applied = append(applied, fmt.Sprintf("telemetry.engine.stall_after=%v", ne.StallAfter))
		}
		if ne.Interval != oe.Interval || ne.Timeout != oe.Timeout {
			l.SetTiming(ne.Interval, ne.Timeout)
			applied = append(applied, fmt.Sprintf("telemetry.engine.interval=%v telemetry.engine.timeout=%v", ne.Interval, ne.Timeout))
		}
	}
	return applied
}

// keyChange is a config key compared between the running config and a
// reload's: whether it stayed the same, and its new value.
type keyChange struct {
	key  string
	same bool
	now  any
}

// changes says which of keys changed, each as key=value.
func changes(keys ...keyChange) (changed []string) {
	for _, c := range keys {
		if !c.same {
			changed = append(changed, fmt.Sprintf("%s=%v", c.key, c.now))
		}
	}
	return changed
}

// policyChanges says which keys of the front end's policy (frontendPolicy)
// differ between old and cfg.
func policyChanges(old, cfg config.Config) []string {
	ol, nl := old.Limits, cfg.Limits
	return changes(
		keyChange{"routes", slices.Equal(old.Routes, cfg.Routes), cfg.Routes},
		keyChange{"cors_allowed_origins", slices.Equal(old.CORSAllowedOrigins, cfg.CORSAllowedOrigins), cfg.CORSAllowedOrigins},
		keyChange{"router.retry_statuses", slices.Equal(old.Router.RetryStatuses, cfg.Router.RetryStatuses), cfg.Router.RetryStatuses},
		keyChange{"generate_request_ids", old.GenerateRequestIDs == cfg.GenerateRequestIDs, cfg.GenerateRequestIDs},
		keyChange{"add_x_forwarded_for", old.AddXForwardedFor == cfg.AddXForwardedFor, cfg.AddXForwardedFor},
		keyChange{"log.access", old.Log.Access == cfg.Log.Access, cfg.Log.Access},
		keyChange{"real_ip", reflect.DeepEqual(old.RealIP, cfg.RealIP), fmt.Sprintf("{header: %q, from: %v}", cfg.RealIP.Header, cfg.RealIP.From)},
		keyChange{"forwarded_client_cert.from", slices.Equal(old.ForwardedClientCert.From, cfg.ForwardedClientCert.From), cfg.ForwardedClientCert.From},
		keyChange{"limits.connect_timeout", ol.ConnectTimeout == nl.ConnectTimeout, nl.ConnectTimeout},
		keyChange{"limits.first_byte_timeout", ol.FirstByteTimeout == nl.FirstByteTimeout, nl.FirstByteTimeout},
		keyChange{"limits.stream_idle_timeout", ol.StreamIdleTimeout == nl.StreamIdleTimeout, nl.StreamIdleTimeout},
		keyChange{"limits.answer_buffer_bytes", ol.AnswerBufferBytes == nl.AnswerBufferBytes, nl.AnswerBufferBytes},
		keyChange{"limits.max_requests_per_connection", ol.MaxRequestsPerConnection == nl.MaxRequestsPerConnection, nl.MaxRequestsPerConnection},
	)
}

// routingChanges says which keys routingKnobs and the phases' pickers
// read differ between old and cfg.
func routingChanges(old, cfg config.Config) []string {
	oa, na := old.Router.SessionAffinity, cfg.Router.SessionAffinity
	od, nd := old.Router.Disaggregation, cfg.Router.Disaggregation
	return changes(
		keyChange{"router.session_affinity.mode", oa.Mode == na.Mode, na.Mode},
		keyChange{"router.session_affinity.header", oa.Header == na.Header, na.Header},
		keyChange{"router.lora_placement", old.Router.LoRAPlacement == cfg.Router.LoRAPlacement, cfg.Router.LoRAPlacement},
		keyChange{"router.disaggregation.protocol", od.Protocol == nd.Protocol, nd.Protocol},
		keyChange{"router.disaggregation.prefill_mode", od.PrefillMode == nd.PrefillMode, nd.PrefillMode},
		keyChange{"router.disaggregation.decode_mode", od.DecodeMode == nd.DecodeMode, nd.DecodeMode},
		keyChange{"router.disaggregation.min_prefill_tokens", od.MinPrefillTokens == nd.MinPrefillTokens, nd.MinPrefillTokens},
		keyChange{"router.disaggregation.max_prefill_queue", od.MaxPrefillQueue == nd.MaxPrefillQueue, nd.MaxPrefillQueue},
		keyChange{"router.disaggregation.fallback", od.Fallback == nd.Fallback, nd.Fallback},
	)
}

// routedConfig is old with the keys routingChanges compares taken from
// cfg.
func routedConfig(old, cfg config.Config) config.Config {
	old.Router.SessionAffinity = cfg.Router.SessionAffinity
	old.Router.LoRAPlacement = cfg.Router.LoRAPlacement
	old.Router.Disaggregation = cfg.Router.Disaggregation
	return old
}

// reloadablePrefixes returns cfg with the keys of router.prefix_affinity
// a reload applies set to the running values: slack; peers and
// share_interval while the replica shares (it was started with peers or
// an address to advertise); enabled and the table's keys (table_size,
// block_bytes, max_blocks) while it does not (a sharing replica's table
// is the one it journals to its peers, keyed by the block size they
// share). The config equals old when nothing else changed.
func (r *Router) reloadablePrefixes(old, cfg config.PrefixAffinity) config.PrefixAffinity {
	cfg.Slack = old.Slack
	if r.PrefixShare != nil {
		cfg.Peers, cfg.ShareInterval = old.Peers, old.ShareInterval
	} else {
		cfg.Enabled, cfg.TableSize, cfg.BlockBytes, cfg.MaxBlocks = old.Enabled, old.TableSize, old.BlockBytes, old.MaxBlocks
	}
	return cfg
}

// tracingChange says what a reload changed in tracing: its sample ratio,
// or its collector (the endpoint's password and the headers' values left
// out), or that it turned off (or stays off, its other keys changed).
func tracingChange(old, t tracing.Config) string {
	switch {
	case !t.On() && !old.On():
		return fmt.Sprintf("tracing stays off (sample_ratio %g, service_name %s)", t.SampleRatio, t.ServiceName)
	case !t.On():
		return "tracing off"
	case old.On() && tracing.SameCollector(old, t):
		return fmt.Sprintf("tracing.sample_ratio=%g", t.SampleRatio)
	}
	endpoint, _ := url.Parse(t.OTLPEndpoint) // Validate checked it
	return fmt.Sprintf("tracing to %s (service_name %s, %d headers, sample_ratio %g)",
		endpoint.Redacted(), t.ServiceName, len(t.Headers), t.SampleRatio)
}

// applyPrefixTable gives routing a new, empty prefix table (none: prefix
// affinity off) when prefix affinity was turned on or off, or its table's
// keys changed, and says what changed. Its records are lost: a prompt's
// next request is keyed anew. The caller holds reloadMu, and the replica
// does not share (reloadablePrefixes).
func (r *Router) applyPrefixTable(old, pa config.PrefixAffinity) (applied []string) {
	if pa.Enabled == old.Enabled && (!pa.Enabled ||
		pa.TableSize == old.TableSize && pa.BlockBytes == old.BlockBytes && pa.MaxBlocks == old.MaxBlocks) {
		return nil
	}
	t := prefixTable(pa)
	r.prefixes.Store(t)
	r.Selector.Reroute(func(rt *dataplane.Routing) {
		rt.Prefixes, rt.PrefixBlock, rt.PrefixBlocks = t, pa.BlockBytes, pa.MaxBlocks
	})
	if !pa.Enabled {
		return []string{"router.prefix_affinity.enabled=false"}
	}
	return []string{fmt.Sprintf("router.prefix_affinity.enabled=true table_size=%d block_bytes=%d max_blocks=%d (a new, empty table)",
		pa.TableSize, pa.BlockBytes, pa.MaxBlocks)}
}

// reloadWorkers brings the registry from the old config's workers to the
// new ones' and says what it did.
func (r *Router) reloadWorkers(old, next []dataplane.WorkerSpec) (applied []string) {
	before := map[uint64]dataplane.WorkerSpec{}
	for _, s := range old {
		before[s.ID] = s
	}
	for _, s := range next {
		prev, known := before[s.ID]
		delete(before, s.ID)
		w, registered := r.Registry.Get(s.ID)
		switch {
		case !registered:
			if _, err := r.Registry.AddUnprobed(s); err != nil {
				r.log.Warn("reload: worker not added", "worker", s.ID, "err", err)
				continue
			}
			applied = append(applied, fmt.Sprintf("worker %d added", s.ID))
			r.probeSoon(s.ID)
		case !known || w.Draining() || !reflect.DeepEqual(prev, s):
			// Changed, still draining from an earlier removal, or added
			// through the admin API: the config's spec replaces it.
			if err := r.replaceWorker(s); err == nil {
				applied = append(applied, fmt.Sprintf("worker %d replaced", s.ID))
			}
		}
	}
	for id := range before {
		if err := r.Registry.Drain(id); err == nil {
			applied = append(applied, fmt.Sprintf("worker %d removed (draining)", id))
		}
	}
	slices.Sort(applied)
	return applied
}

// FormatLogsWith has a reload apply a new log.format by calling set with
// it (the router's logger was made to follow it: logformat.Switch);
// without, a new log.format waits for a restart.
func (r *Router) FormatLogsWith(set func(format string)) {
	r.reloadMu.Lock()
	defer r.reloadMu.Unlock()
	r.logFormat = set
}

// SetConfigSource sets where ReloadFromSource reads the config (the file
// and flags the router was started with).
func (r *Router) SetConfigSource(load func() (config.Config, error)) {
	r.reloadMu.Lock()
	defer r.reloadMu.Unlock()
	r.source = load
}

// ReloadFromSource reads the config again and applies it (SIGHUP, POST
// /config/reload).
func (r *Router) ReloadFromSource() (applied, needRestart []string, err error) {
	r.reloadMu.Lock()
	load := r.source
	r.reloadMu.Unlock()
	if load == nil {
		return nil, nil, errNoSource
	}
	cfg, err := load()
	if err == nil {
		applied, needRestart, err = r.Reload(cfg)
	}
	if err != nil {
		r.log.Warn("config reload refused; the running config stays", "err", err)
	}
	r.reloads.record(needRestart, err, time.Now())
	return applied, needRestart, err
}

var errNoSource = dataplane.Errorf(dataplane.InvalidArgument, "this router was started without a config source to reload from")
