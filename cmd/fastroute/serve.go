package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cloudflare/tableflip"
	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/aliases"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/dataplane/mirrors"
	"github.com/fastroute/fastroute/dataplane/router"
	"github.com/fastroute/fastroute/internal/every"
	"github.com/fastroute/fastroute/internal/logformat"
	"github.com/fastroute/fastroute/internal/memlimit"
	"github.com/fastroute/fastroute/pickers"
)

// workerFlags collects repeated --worker flags.
type workerFlags []dataplane.WorkerSpec

func (w *workerFlags) String() string { return fmt.Sprint(len(*w), " workers") }

// Set parses "id=1,url=http://h:p,device=gpu,gpu_index=0,dp_size=1,capacity=1,loras=a;b,metrics_path=/metrics,health_path=/health,max_inflight=0,cgroup_path=/sys/fs/cgroup/x,role=both,bootstrap_port=8998,max_model_len=32768,backup=false".
func (w *workerFlags) Set(v string) error {
	s, err := parseSpec(v)
	if err != nil {
		return err
	}
	*w = append(*w, s)
	return nil
}

// parseSpec parses a worker's key=value pairs, comma-separated.
func parseSpec(v string) (dataplane.WorkerSpec, error) {
	var s dataplane.WorkerSpec
	for _, kv := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(kv, "=")
		if !ok {
			return s, fmt.Errorf("%q is not key=value", kv)
		}
		var err error
		switch k {
		case "id":
			s.ID, err = strconv.ParseUint(val, 10, 64)
		case "url":
			s.URL = val
		case "device":
			s.Device = dataplane.Device(val)
		case "gpu_index":
			s.GPUIndex, err = strconv.Atoi(val)
		case "gpu_uuid":
			s.GPUUUID = val
		case "dp_size":
			s.DPSize, err = strconv.Atoi(val)
		case "capacity":
			s.Capacity, err = strconv.ParseFloat(val, 64)
		case "loras":
			s.LoRAs = strings.Split(val, ";")
		case "models":
			s.Models = strings.Split(val, ";")
		case "metrics_path":
			s.MetricsPath = val
		case "health_path":
			s.HealthPath = val
		case "backup":
			s.Backup, err = strconv.ParseBool(val)
		case "max_inflight":
			s.MaxInflight, err = strconv.Atoi(val)
		case "cgroup_path":
			s.CgroupPath = val
		case "role":
			s.Role = dataplane.Role(val)
		case "bootstrap_port":
			s.BootstrapPort, err = strconv.Atoi(val)
		case "max_model_len":
			s.MaxModelLen, err = strconv.Atoi(val)
		default:
			return s, fmt.Errorf("unknown worker key %q", k)
		}
		if err != nil {
			return s, fmt.Errorf("worker key %s: %v", k, err)
		}
	}
	return s, nil
}

// bindFlags registers one flag per config key, defaulting to cfg's values.
func bindFlags(fs *flag.FlagSet, cfg *config.Config, workers *workerFlags) {
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "front end address")
	fs.Func("route", "an extra path to proxy like the OpenAI ones (repeatable)", func(v string) error {
		cfg.Routes = append(cfg.Routes, v)
		return nil
	})
	fs.Func("cors-allowed-origin", "an origin (scheme://host[:port], or *) whose browsers may call the front end (repeatable)", func(v string) error {
		cfg.CORSAllowedOrigins = append(cfg.CORSAllowedOrigins, v)
		return nil
	})
	fs.Func("model-alias", "a model name clients may ask for and the models it stands for, NAME=MODEL[:WEIGHT][,MODEL[:WEIGHT]...]: its requests go to the models by weight, the body's model rewritten (repeatable)", func(v string) error {
		a, err := parseAlias(v)
		cfg.ModelAliases = append(cfg.ModelAliases, a)
		return err
	})
	fs.Func("model-mirror", "copy a share of the requests routed as a model to the workers of a shadow model, whose answers are dropped, MODEL=SHADOW:PERCENT[,max_inflight=N] (repeatable)", func(v string) error {
		m, err := parseMirror(v)
		cfg.ModelMirrors = append(cfg.ModelMirrors, m)
		return err
	})
	fs.Func("model-fallback", "a model name clients may ask for and the models it stands for in order, NAME=MODEL[,MODEL...]: its requests go to the first a routable worker serves, the body's model rewritten (repeatable)", func(v string) error {
		a, err := parseAlias(v) // a weight is refused with the key's name (aliases.New)
		a.Fallback = true
		cfg.ModelAliases = append(cfg.ModelAliases, a)
		return err
	})
	fs.StringVar(&cfg.Log.Access, "log-access", cfg.Log.Access, "access log: off, all, or errors (400 and above, or cut)")
	fs.StringVar(&cfg.Log.Format, "log-format", cfg.Log.Format, "log format: text or json")
	fs.StringVar(&cfg.PIDFile, "pid-file", cfg.PIDFile, "write the serving process's id to this file once it accepts requests (an upgrade's new process writes its own)")
	fs.StringVar(&cfg.StateFile, "state-file", cfg.StateFile, "keep the workers the admin API added (and their declared adapters) in this file, read at start: they outlast a restart or an upgrade")
	fs.DurationVar(&cfg.ShutdownDelay, "shutdown-delay", cfg.ShutdownDelay, "after SIGTERM, go on serving this long with GET /health answering 503 (a load balancer takes the router out of rotation), then drain")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", cfg.ShutdownTimeout, "drain bound on SIGTERM; streams still open then are cut")
	fs.StringVar(&cfg.TLS.CertFile, "tls-cert-file", cfg.TLS.CertFile, "PEM certificate chain: clients speak TLS to the front end (with --tls-key-file)")
	fs.StringVar(&cfg.TLS.KeyFile, "tls-key-file", cfg.TLS.KeyFile, "PEM private key of --tls-cert-file")
	fs.StringVar(&cfg.TLS.ClientCAFile, "tls-client-ca-file", cfg.TLS.ClientCAFile, "PEM CA certificates: every client must show a certificate they signed (mutual TLS; with --tls-cert-file)")
	fs.StringVar(&cfg.TLS.ClientAuth, "tls-client-auth", cfg.TLS.ClientAuth, "require (default): a client without a certificate the --tls-client-ca-file CAs signed is refused; optional: one without any gets in")
	fs.StringVar(&cfg.TLS.ClientCRLFile, "tls-client-crl-file", cfg.TLS.ClientCRLFile, "certificate revocation lists (PEM, or one DER CRL) of the --tls-client-ca-file CAs and their intermediates: a revoked client, or one whose issuer's CRL is missing or expired, is refused")
	fs.StringVar(&cfg.TLS.MinVersion, "tls-min-version", cfg.TLS.MinVersion, "the oldest TLS version clients may speak: 1.2 (default) or 1.3")
	fs.StringVar(&cfg.AdminTLS.CertFile, "admin-tls-cert-file", cfg.AdminTLS.CertFile, "PEM certificate chain: the admin listener speaks TLS (HTTPS; with --admin-tls-key-file)")
	fs.StringVar(&cfg.AdminTLS.KeyFile, "admin-tls-key-file", cfg.AdminTLS.KeyFile, "PEM private key of --admin-tls-cert-file")
	fs.StringVar(&cfg.AdminTLS.PeerCAFile, "admin-tls-peer-ca-file", cfg.AdminTLS.PeerCAFile, "PEM CA certificates the admin listeners of https:// peer replicas (prefix sharing) are checked against, instead of the system's roots")
	fs.StringVar(&cfg.AdminTLS.ClientCAFile, "admin-tls-client-ca-file", cfg.AdminTLS.ClientCAFile, "PEM CA certificates: every client of the admin listener must show a certificate they signed (mutual TLS; replicas show theirs to their peers)")
	fs.StringVar(&cfg.AdminTLS.MinVersion, "admin-tls-min-version", cfg.AdminTLS.MinVersion, "the oldest TLS version the admin listener's clients may speak: 1.2 (default) or 1.3")
	fs.BoolVar(&cfg.ProxyProtocol.Enabled, "proxy-protocol", cfg.ProxyProtocol.Enabled, "connections to --listen begin with a PROXY protocol header (v1 or v2, from a load balancer) naming the client's address; one without is closed")
	fs.Func("proxy-protocol-from", "an IP or CIDR prefix whose connections carry the PROXY protocol header; others are served under their own address (repeatable; none: every connection)", func(v string) error {
		cfg.ProxyProtocol.From = append(cfg.ProxyProtocol.From, v)
		return nil
	})
	fs.BoolVar(&cfg.GenerateRequestIDs, "generate-request-ids", cfg.GenerateRequestIDs, "give each proxied request without an X-Request-Id one made up (sent to its worker, in the access log), and each answer the request's id")
	fs.BoolVar(&cfg.AddXForwardedFor, "add-x-forwarded-for", cfg.AddXForwardedFor, "append each proxied request's peer address to the X-Forwarded-For its worker gets, so an engine's log names the client")
	fs.StringVar(&cfg.RealIP.Header, "real-ip-header", cfg.RealIP.Header, "take a request's client address from this header (X-Forwarded-For, X-Real-IP) when it comes from a proxy of --real-ip-from, for the access log and the span")
	fs.Func("forwarded-client-cert-from", "an IP or CIDR prefix of a proxy (a mesh sidecar terminating mutual TLS) trusted to name its client's certificate in x-forwarded-client-cert (repeatable)", func(v string) error {
		cfg.ForwardedClientCert.From = append(cfg.ForwardedClientCert.From, v)
		return nil
	})
	fs.Func("real-ip-from", "an IP or CIDR prefix of an HTTP load balancer trusted to set --real-ip-header (repeatable)", func(v string) error {
		cfg.RealIP.From = append(cfg.RealIP.From, v)
		return nil
	})
	dn := &cfg.Discovery.DNS
	fs.Func("dns-name", "find workers by DNS name: host:port (each address the host resolves to is a worker on that port) or an SRV name, _service._proto.name (each address of each target, on the target's port) (repeatable)", func(v string) error {
		dn.Names = append(dn.Names, v)
		return nil
	})
	fs.DurationVar(&dn.Interval, "dns-interval", dn.Interval, "look the --dns-name hosts up this often")
	fs.StringVar(&dn.Server, "dns-server", dn.Server, "DNS server (host:port) that --dns-name lookups ask (default: the system's resolver)")
	fs.StringVar(&dn.Scheme, "dns-scheme", dn.Scheme, "http or https: how workers found by --dns-name are spoken to")
	fs.StringVar(&dn.Family, "dns-family", dn.Family, "which of a --dns-name host's addresses are workers: prefer_ipv4 (its IPv6 ones only when it has no IPv4 one), prefer_ipv6, or both (a dual-stack engine is then two workers)")
	fs.Func("dns-worker", "fields every worker found by --dns-name gets: device=gpu|cpu,capacity=C,dp_size=D,max_inflight=M,role=prefill|decode|both,models=a;b,... (as --worker, without id and url)", func(v string) error {
		spec, err := parseSpec(v)
		dn.Worker = spec
		return err
	})
	wt := &cfg.WorkerTLS
	fs.StringVar(&wt.CAFile, "worker-tls-ca-file", wt.CAFile, "PEM CA certificates that https:// workers' certificates are checked against (default: the system's roots)")
	fs.StringVar(&wt.CertFile, "worker-tls-cert-file", wt.CertFile, "PEM client certificate chain shown to https:// workers that ask for one (with --worker-tls-key-file; read again on reload)")
	fs.StringVar(&wt.KeyFile, "worker-tls-key-file", wt.KeyFile, "PEM private key of --worker-tls-cert-file")
	fs.StringVar(&wt.ServerName, "worker-tls-server-name", wt.ServerName, "name https:// workers' certificates are checked against and sent as SNI, instead of each url's host")
	fs.BoolVar(&wt.InsecureSkipVerify, "worker-tls-insecure-skip-verify", wt.InsecureSkipVerify, "accept any certificate an https:// worker shows (testing only)")
	fs.StringVar(&cfg.AdminListen, "admin-listen", cfg.AdminListen, "admin address (metrics, pprof, workers)")
	fs.StringVar(&cfg.AdminToken, "admin-token", cfg.AdminToken, "bearer token every admin route needs (visible in ps: prefer --admin-token-file or "+config.AdminTokenEnv+")")
	fs.StringVar(&cfg.AdminTokenFile, "admin-token-file", cfg.AdminTokenFile, "file whose first line is the admin token")
	fs.BoolVar(&cfg.MetricsPublic, "metrics-public", cfg.MetricsPublic, "serve GET /metrics without the admin token")
	fs.StringVar(&cfg.WorkerAPIKey, "worker-api-key", cfg.WorkerAPIKey, "bearer key of the router's own requests to workers (probes, /v1/models, engine metrics) and, with --api-keys-file, of clients' requests in place of their keys (visible in ps: prefer --worker-api-key-file or "+config.WorkerAPIKeyEnv+")")
	fs.StringVar(&cfg.APIKeysFile, "api-keys-file", cfg.APIKeysFile, "file of the API keys clients must present, one a line: NAME KEY [max_inflight=N] [tokens_per_minute=N] [requests_per_minute=N] [priority=P] [models=a;b] [expires=T] (read again on reload)")
	fs.DurationVar(&cfg.APIKeysShareInterval, "api-keys-share-interval", cfg.APIKeysShareInterval, "share each API key's use with the other replicas on discovery.etcd this often, so that its caps hold across them (0: each replica caps what it serves)")
	fs.StringVar(&cfg.WorkerAPIKeyFile, "worker-api-key-file", cfg.WorkerAPIKeyFile, "file whose first line is the workers' API key")
	fs.Func("mode", "selection mode: "+fmt.Sprint(pickers.Modes)+" (default "+string(cfg.Router.Mode)+")", func(v string) error {
		cfg.Router.Mode = pickers.Mode(v)
		return nil
	})
	fs.IntVar(&cfg.Router.BusyThreshold, "busy-threshold", cfg.Router.BusyThreshold, "max in-flight per worker (0 = none)")
	fs.IntVar(&cfg.Router.Retries, "retries", cfg.Router.Retries, "retries on transport failure before the first byte")
	fs.Func("retry-status", "a worker answer status that moves the request to another worker, e.g. 503 (repeatable; 408, 429 or 5xx)", func(v string) error {
		st, err := strconv.Atoi(v)
		cfg.Router.RetryStatuses = append(cfg.Router.RetryStatuses, st)
		return err
	})
	fs.Float64Var(&cfg.Router.RetryBudget.Percent, "retry-budget-percent", cfg.Router.RetryBudget.Percent, "the share of the requests holding a worker that may be on a retry at once, in percent (0: no budget)")
	fs.IntVar(&cfg.Router.RetryBudget.MinRetries, "retry-budget-min-retries", cfg.Router.RetryBudget.MinRetries, "requests that may be on a retry at once whatever the budget's percent")
	fs.StringVar(&cfg.Tracing.OTLPEndpoint, "otlp-traces-endpoint", cfg.Tracing.OTLPEndpoint, "an OpenTelemetry collector's OTLP/HTTP traces URL (as http://collector:4318/v1/traces): each sampled request's span goes there, and its traceparent to its worker names it (empty: no tracing)")
	fs.Float64Var(&cfg.Tracing.SampleRatio, "trace-sample-ratio", cfg.Tracing.SampleRatio, "the share of requests without a sampled traceparent that start a trace, 0 to 1")
	fs.IntVar(&cfg.Router.Queue.Size, "queue-size", cfg.Router.Queue.Size, "requests that may wait for a busy worker instead of a 429 (0: none)")
	fs.DurationVar(&cfg.Router.Queue.Timeout, "queue-timeout", cfg.Router.Queue.Timeout, "longest wait in the queue before a 429")
	fs.Float64Var(&cfg.Router.CPURatio, "cpu-ratio", cfg.Router.CPURatio, "device-aware-weighted: CPU workers take a request only while cpu_inflight < gpu_inflight × cpus / (ratio × gpus) (0: off)")
	d := &cfg.Router.Disaggregation
	fs.StringVar(&d.Protocol, "disagg-protocol", d.Protocol, "prefill/decode disaggregation: off, vllm-nixl or sglang-bootstrap")
	fs.Func("prefill-mode", "the prefill pool's selection mode (default: --mode)", func(v string) error {
		d.PrefillMode = pickers.Mode(v)
		return nil
	})
	fs.Func("decode-mode", "the decode pool's selection mode (default: --mode)", func(v string) error {
		d.DecodeMode = pickers.Mode(v)
		return nil
	})
	fs.IntVar(&d.MinPrefillTokens, "min-prefill-tokens", d.MinPrefillTokens, "prompts shorter than this (4 body bytes a token) go whole to a decode worker")
	fs.IntVar(&d.MaxPrefillQueue, "disagg-max-prefill-queue", d.MaxPrefillQueue, "a request goes whole to its decode worker while its prefill pick's engine reports this many requests waiting (0: never)")
	fs.StringVar(&d.Fallback, "disagg-fallback", d.Fallback, "with no routable prefill worker (or, with vllm-nixl, no free one): aggregated (whole, to a decode worker) or error (503, or 429 while all are busy)")
	fs.StringVar(&cfg.Router.SessionAffinity.Mode, "affinity-mode", cfg.Router.SessionAffinity.Mode, "session affinity: off|soft|hard")
	fs.StringVar(&cfg.Router.SessionAffinity.Header, "affinity-header", cfg.Router.SessionAffinity.Header, "session id header")
	fs.DurationVar(&cfg.Router.SessionAffinity.TTL, "affinity-ttl", cfg.Router.SessionAffinity.TTL, "idle session expiry")
	fs.IntVar(&cfg.Router.SessionAffinity.MaxSessions, "affinity-max-sessions", cfg.Router.SessionAffinity.MaxSessions, "session table bound")
	fs.StringVar(&cfg.Router.LoRAPlacement, "lora-placement", cfg.Router.LoRAPlacement, "an adapter no routable worker holds: off (404/503) or rendezvous (placed by hashing its name)")
	pa := &cfg.Router.PrefixAffinity
	fs.BoolVar(&pa.Enabled, "prefix-affinity", pa.Enabled, "send a generation request to the worker last sent the longest prefix of its prompt (its KV cache)")
	fs.IntVar(&pa.TableSize, "prefix-affinity-table-size", pa.TableSize, "prompt prefixes remembered (table slots)")
	fs.IntVar(&pa.BlockBytes, "prefix-affinity-block-bytes", pa.BlockBytes, "prompt bytes a prefix block")
	fs.IntVar(&pa.MaxBlocks, "prefix-affinity-max-blocks", pa.MaxBlocks, "blocks of a prompt keyed at most")
	fs.IntVar(&pa.Slack, "prefix-affinity-slack", pa.Slack, "requests a prefix's worker may be busier than the least loaded candidate and still take it (in engine cost while every engine is priced)")
	fs.Func("prefix-affinity-peer", "another replica's admin listener (http://host:port) to share prefix records with (repeatable)", func(v string) error {
		pa.Peers = append(pa.Peers, v)
		return nil
	})
	fs.DurationVar(&pa.ShareInterval, "prefix-affinity-share-interval", pa.ShareInterval, "how often prefix records go to the peers")
	fs.StringVar(&pa.Advertise, "prefix-affinity-advertise", pa.Advertise, "this replica's admin listener as its peers reach it (http://host:port): registered on etcd (discovery.etcd of the config file), where replicas find each other to share prefix records")
	fs.IntVar(&cfg.Router.EmbeddingCacheSize, "embedding-cache-size", cfg.Router.EmbeddingCacheSize, "embedding cache table keys (0 = off)")
	fs.BoolVar(&cfg.Telemetry.NVML, "telemetry-nvml", cfg.Telemetry.NVML, "poll GPUs through NVML")
	fs.BoolVar(&cfg.Telemetry.CPU, "telemetry-cpu", cfg.Telemetry.CPU, "poll /proc and cgroup CPU state")
	fs.DurationVar(&cfg.Telemetry.Interval, "telemetry-interval", cfg.Telemetry.Interval, "telemetry poll period")
	fs.BoolVar(&cfg.Telemetry.Engine.Enabled, "telemetry-engine", cfg.Telemetry.Engine.Enabled, "poll each worker's engine metrics (vLLM/SGLang queue, batch, KV cache)")
	fs.DurationVar(&cfg.Telemetry.Engine.Interval, "telemetry-engine-interval", cfg.Telemetry.Engine.Interval, "engine metrics poll period")
	fs.DurationVar(&cfg.Telemetry.Engine.Timeout, "telemetry-engine-timeout", cfg.Telemetry.Engine.Timeout, "one engine metrics scrape's timeout")
	fs.DurationVar(&cfg.Telemetry.Engine.StallAfter, "telemetry-engine-stall-after", cfg.Telemetry.Engine.StallAfter, "take a worker out of rotation once its engine has had requests running this long without generating a token (0: never)")
	fs.DurationVar(&cfg.Health.Interval, "health-interval", cfg.Health.Interval, "health probe period")
	fs.DurationVar(&cfg.Health.Timeout, "health-timeout", cfg.Health.Timeout, "bound of one health probe (0: the period)")
	fs.StringVar(&cfg.Health.Path, "health-path", cfg.Health.Path, "health probe path")
	fs.IntVar(&cfg.Health.UnhealthyAfter, "unhealthy-after", cfg.Health.UnhealthyAfter, "failed probes before a worker is unhealthy")
	fs.IntVar(&cfg.Health.EjectAfter, "eject-after", cfg.Health.EjectAfter, "consecutive 5xx answers or transport failures that eject a worker (0: never)")
	fs.DurationVar(&cfg.Health.EjectTime, "eject-time", cfg.Health.EjectTime, "first ejection's length, doubled while the worker keeps failing")
	fs.DurationVar(&cfg.Health.EjectMax, "eject-max", cfg.Health.EjectMax, "longest ejection")
	fs.Var(&cfg.Limits.MaxBodyBytes, "max-body-bytes", "request body limit, e.g. 16MiB (413 above)")
	fs.Var(&cfg.Limits.AnswerBufferBytes, "answer-buffer-bytes", "largest non-streamed answer read whole before it is sent, e.g. 1MiB (larger ones pass through as they come)")
	fs.IntVar(&cfg.Limits.MaxConnections, "max-connections", cfg.Limits.MaxConnections, "client connections open at once; beyond, new ones wait in the listen queue (0: half the open-files limit less 128)")
	fs.IntVar(&cfg.Limits.MaxRequestsPerConnection, "max-requests-per-connection", cfg.Limits.MaxRequestsPerConnection, "requests a client connection carries before its answer closes it, so kept-alive clients spread again over replicas (0: no limit)")
	fs.Var(&cfg.Limits.MaxHeaderBytes, "max-header-bytes", "request line and headers limit, e.g. 64KiB (431 above)")
	fs.DurationVar(&cfg.Limits.ReadTimeout, "read-timeout", cfg.Limits.ReadTimeout, "client request read timeout")
	fs.DurationVar(&cfg.Limits.WriteTimeout, "write-timeout", cfg.Limits.WriteTimeout, "client response write timeout")
	fs.DurationVar(&cfg.Limits.IdleTimeout, "idle-timeout", cfg.Limits.IdleTimeout, "client keep-alive idle timeout")
	fs.DurationVar(&cfg.Limits.ConnectTimeout, "connect-timeout", cfg.Limits.ConnectTimeout, "dial timeout to workers")
	fs.DurationVar(&cfg.Limits.FirstByteTimeout, "first-byte-timeout", cfg.Limits.FirstByteTimeout, "wait for a worker's response headers (504 beyond)")
	fs.DurationVar(&cfg.Limits.StreamIdleTimeout, "stream-idle-timeout", cfg.Limits.StreamIdleTimeout, "gap between two reads of a worker's answer (a stream is cut with an SSE error event)")
	fs.Var(workers, "worker", "add a worker: id=N,url=http://host:port|https://host:port|unix:/path[,device=gpu|cpu,gpu_index=I,dp_size=D,capacity=C,loras=a;b,models=a;b,metrics_path=/metrics,health_path=/health,max_inflight=M,cgroup_path=DIR,role=prefill|decode|both,bootstrap_port=P,max_model_len=N,backup=true] (repeatable)")
}

// loadServeConfig reads --config (when given) and applies the other flags over it.
func loadServeConfig(args []string) (config.Config, error) {
	pre := flag.NewFlagSet("serve", flag.ContinueOnError)
	pre.SetOutput(new(strings.Builder))
	path := pre.String("config", "", "YAML config file")
	_ = pre.Parse(filterConfigFlag(args))
	cfg := config.Default()
	if *path != "" {
		var err error
		if cfg, err = config.Load(*path); err != nil {
			return cfg, err
		}
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.String("config", *path, "YAML config file")
	var workers workerFlags
	bindFlags(fs, &cfg, &workers)
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	cfg.Workers = append(cfg.Workers, workers...)
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("flags: %w", err)
	}
	return cfg, nil
}

// filterConfigFlag keeps only --config so the first pass ignores the rest.
func filterConfigFlag(args []string) []string {
	for i, a := range args {
		switch {
		case a == "--config" || a == "-config":
			if i+1 < len(args) {
				return []string{a, args[i+1]}
			}
		case strings.HasPrefix(a, "--config=") || strings.HasPrefix(a, "-config="):
			return []string{a}
		}
	}
	return nil
}

func runServe(args []string) error {
	cfg, err := loadServeConfig(args)
	if err != nil {
		return err
	}
	logs := logformat.New(os.Stderr, cfg.Log.Format)
	log := logs.Logger()
	followMemoryLimit(log)
	// Signals are caught from the start: one that comes while the router
	// starts is handled once it serves (SIGHUP's default would end the
	// process, and systemd may send it as soon as READY=1 is told).
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR2)
	// The listeners come from the process this one upgrades, if any
	// (SIGUSR2 there started this one), with the connections queued on
	// them; that process drains once this one is ready.
	upg, err := tableflip.New(tableflip.Options{PIDFile: cfg.PIDFile})
	if err != nil {
		return err
	}
	defer upg.Stop()
	// Sockets systemd passed (socket activation) serve their keys, else
	// the listeners are opened here.
	sockets, err := systemdListeners(cfg)
	if err != nil {
		return err
	}
	defer func() {
		for _, ln := range sockets { // those Start did not take
			ln.Close()
		}
	}()
	r, err := router.StartWith(cfg, log, listenVia(upg, sockets))
	if err != nil {
		return err
	}
	r.SetConfigSource(func() (config.Config, error) { return loadServeConfig(args) })
	r.FormatLogsWith(logs.Set)
	if err := upg.Ready(); err != nil {
		_ = r.Close()
		return err
	}
	notifyReady()
	if upg.HasParent() {
		log.Info("took the listeners over from the process before this one, which drains its open requests and exits")
	}
	return handleSignals(r, sig, log, os.Exit, upg)
}

// followMemoryLimit has the Go runtime's soft memory limit stand below
// the memory limit of the router's cgroup (memlimit.Limiter; GOMEMLIMIT,
// when set, stands instead), now and as the cgroup's limit changes,
// checked every memoryLimitCheck, and says so.
func followMemoryLimit(log *slog.Logger) {
	if runtime.GOOS != "linux" || os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	l := &memlimit.Limiter{Root: "/", Getenv: os.Getenv}
	failed := false
	apply := func() {
		soft, lim, changed, err := l.Apply()
		switch {
		case err != nil:
			if !failed {
				log.Warn("the cgroup's memory limit cannot be read; the Go runtime's soft memory limit stays as it is", "err", err)
			}
		case changed && soft > 0:
			log.Info("the Go runtime's soft memory limit stands below the cgroup's", "soft_limit_bytes", soft, "cgroup_limit_bytes", lim.Bytes, "from", lim.File)
		case changed:
			log.Info("the cgroup has no memory limit any more; the Go runtime's soft memory limit is lifted")
		}
		failed = err != nil
	}
	apply()
	go every.Tick(context.Background(), memoryLimitCheck, apply)
}

// memoryLimitCheck is how often the cgroup's memory limit is read again.
const memoryLimitCheck = 30 * time.Second

// runCheck reads the config of serve's flags (--config and the others) as
// serve would, files and certificates included, and starts nothing (as
// nginx -t): before a reload or an upgrade, say. It writes a line saying
// what would run to out, a line for each certificate the router would
// show (its subject, and when it expires) and for each revocation list
// (when it is due to be replaced: past that, its issuer's clients are
// refused), and with --print the config itself, secrets redacted.
func runCheck(args []string, out io.Writer) error {
	serveArgs := slices.DeleteFunc(slices.Clone(args), func(a string) bool { return a == "--print" || a == "-print" })
	show := len(serveArgs) < len(args)
	cfg, err := loadServeConfig(serveArgs)
	if err != nil {
		return err
	}
	cfg, checked, err := router.Check(cfg)
	if err != nil {
		return err
	}
	if show {
		text, err := cfg.RedactedYAML()
		if err != nil {
			return err
		}
		_, _ = out.Write(text)
	}
	restored := ""
	if checked.Workers > 0 {
		restored = fmt.Sprintf(" and %d from state_file", checked.Workers)
	}
	switch {
	case checked.DNSDrained == 0:
	case checked.DNSOff:
		restored += fmt.Sprintf("; state_file's %d drained DNS addresses dropped (discovery.dns is off)", checked.DNSDrained)
	default:
		restored += fmt.Sprintf("; %d drained DNS addresses held from state_file", checked.DNSDrained)
	}
	if checked.Down > 0 {
		restored += fmt.Sprintf("; %d workers kept down from state_file", checked.Down)
	}
	if _, err := fmt.Fprintf(out, "config ok: listen %s, admin_listen %s, mode %s, %d workers%s\n",
		cfg.Listen, cfg.AdminListen, cfg.Router.Mode, len(cfg.Workers), restored); err != nil {
		return err
	}
	for _, c := range checked.Certificates {
		if _, err := fmt.Fprintf(out, "certificate %s: %s, valid until %s (%s)\n", c.Key, c.Leaf.Subject,
			c.Leaf.NotAfter.UTC().Format(time.RFC3339), timeLeft(time.Until(c.Leaf.NotAfter))); err != nil {
			return err
		}
	}
	for _, l := range checked.RevocationLists {
		due := "no next update"
		if !l.Next.IsZero() {
			due = fmt.Sprintf("next update %s (%s)", l.Next.UTC().Format(time.RFC3339), timeLeft(time.Until(l.Next)))
		}
		if _, err := fmt.Fprintf(out, "revocation list of %s (tls.client_crl_file): %s\n", l.Issuer, due); err != nil {
			return err
		}
	}
	return nil
}

// timeLeft says how long a certificate or revocation list with left to
// run has: days, hours under two days, or that it expired (a check does
// not fail for it: the router would start; a client refuses an expired
// certificate, and the router the clients of an out-of-date list).
func timeLeft(left time.Duration) string {
	switch {
	case left <= 0:
		return "EXPIRED"
	case left < 48*time.Hour:
		return fmt.Sprintf("%.0fh left", left.Hours())
	}
	return fmt.Sprintf("%d days left", int(left.Hours()/24))
}

// listenVia returns the router's Listen: a listener of the process this
// one upgrades (upg), when its key and address are the same (so two keys
// on port 0 stay apart), else a socket systemd passed for its key (taken
// from sockets), else a new one. A new one's failure is the system call's
// ("bind: address already in use"): the router names the key and the
// address, which tableflip's and net's wrappings would say twice more.
func listenVia(upg *tableflip.Upgrader, sockets map[string]net.Listener) router.Listen {
	return func(key, address string) (net.Listener, error) {
		var failed error
		ln, err := upg.ListenWithCallback("tcp", key+"="+address, func(network, _ string) (net.Listener, error) {
			if ln := sockets[key]; ln != nil {
				delete(sockets, key)
				return ln, nil
			}
			ln, err := net.Listen(network, address)
			if op, ok := errors.AsType[*net.OpError](err); ok {
				failed = op.Err
			}
			return ln, err
		})
		if failed != nil {
			return nil, failed
		}
		return ln, err
	}
}

// upgrader starts a new process of the router's executable on the
// listeners (tableflip.Upgrader).
type upgrader interface {
	// Upgrade starts the new process and returns once it is ready, or
	// failed to start, or timed out (then killed).
	Upgrade() error
	// Stop ends an upgrade under way (its process killed) and refuses new
	// ones.
	Stop()
}

// handleSignals reloads the config on SIGHUP (a refused config leaves the
// running one) and upgrades on SIGUSR2: a new process of the executable
// (the file at its path now, a new build maybe) reads the config and
// takes the listeners over, then this one drains as on SIGTERM; an
// upgrade that fails leaves this one serving. On SIGINT or SIGTERM it
// withdraws the router for shutdown_delay (GET /health answers 503,
// requests are served), then drains it (up to shutdown_timeout); a second
// such signal exits at once through exit.
func handleSignals(r *router.Router, sig <-chan os.Signal, log *slog.Logger, exit func(int), upg upgrader) error {
	upgraded := make(chan error, 1)
	upgrading := false
	for {
		select {
		case s := <-sig:
			switch s {
			case syscall.SIGHUP:
				if upgrading { // as the admin API's reload is refused (Router.BeginUpgrade)
					log.Warn("SIGHUP ignored: an upgrade is under way, and its new process reads the config as it starts; send SIGHUP to it once it serves")
					continue
				}
				notifyReloading()
				_, _, _ = r.ReloadFromSource() // the router logs what it applied or why it refused
				notifyReady()
				continue
			case syscall.SIGUSR2:
				if upgrading {
					log.Warn("SIGUSR2 ignored: an upgrade is under way")
					continue
				}
				upgrading = true
				r.BeginUpgrade()
				log.Info("upgrading: a new process of the executable takes the listeners over once ready", "executable", os.Args[0])
				go func() { upgraded <- upg.Upgrade() }()
				continue
			}
			upg.Stop() // a new process not yet ready is killed
			notify(daemon.SdNotifyStopping)
			if d := r.CurrentConfig().ShutdownDelay; d > 0 {
				r.Frontend.Withdraw()
				log.Info("withdrawing: GET /health answers 503, requests are still served; draining after shutdown_delay; a second signal exits at once",
					"signal", s.String(), "shutdown_delay", d)
				if !await(d, sig, log, exit) {
					return nil
				}
			}
			log.Info("draining: open requests finish, new ones are refused; a second signal exits at once",
				"signal", s.String(), "shutdown_timeout", r.CurrentConfig().ShutdownTimeout)
			return drain(r, sig, log, exit)
		case err := <-upgraded:
			upgrading = false
			if err != nil {
				r.EndUpgrade()
				log.Error("upgrade failed: this process goes on serving", "err", err)
				continue
			}
			log.Info("upgraded: the new process serves; this one drains its open requests and exits",
				"shutdown_timeout", r.CurrentConfig().ShutdownTimeout)
			r.HandOverAdmin()
			return drain(r, sig, log, exit)
		}
	}
}

// await waits d, and reports true; a SIGINT or SIGTERM meanwhile exits at
// once through exit (false).
func await(d time.Duration, sig <-chan os.Signal, log *slog.Logger, exit func(int)) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			return true
		case s := <-sig:
			if secondSignal(s, log, exit) {
				return false
			}
		}
	}
}

// secondSignal exits through exit on a SIGINT or SIGTERM that comes while
// the router stops, and reports whether it did; other signals are ignored
// then (no reload nor upgrade).
func secondSignal(s os.Signal, log *slog.Logger, exit func(int)) bool {
	if s != syscall.SIGINT && s != syscall.SIGTERM {
		return false
	}
	log.Warn("second signal: exiting now", "signal", s.String())
	exit(1)
	return true
}

// drain closes the router, waiting for its open requests up to
// shutdown_timeout; a SIGINT or SIGTERM meanwhile exits at once through
// exit.
func drain(r *router.Router, sig <-chan os.Signal, log *slog.Logger, exit func(int)) error {
	done := make(chan error, 1)
	go func() { done <- r.Close() }()
	for {
		select {
		case err := <-done:
			log.Info("drained")
			return err
		case s := <-sig:
			if secondSignal(s, log, exit) {
				return nil
			}
		}
	}
}

// parseMirror reads --model-mirror's MODEL=SHADOW:PERCENT[,max_inflight=N];
// the shadow model's name may hold colons (llama3:8b): the percent is
// after its last one.
func parseMirror(v string) (mirrors.Mirror, error) {
	bad := fmt.Errorf("%q is not MODEL=SHADOW:PERCENT[,max_inflight=N]", v)
	model, rest, ok := strings.Cut(v, "=")
	rest, opt, hasOpt := strings.Cut(rest, ",")
	i := strings.LastIndexByte(rest, ':')
	if !ok || model == "" || i <= 0 {
		return mirrors.Mirror{}, bad
	}
	m := mirrors.Mirror{Model: model, To: rest[:i]}
	var err error
	if m.Percent, err = strconv.ParseFloat(rest[i+1:], 64); err != nil {
		return mirrors.Mirror{}, fmt.Errorf("%q: percent %q is not a number", v, rest[i+1:])
	}
	if hasOpt {
		n, found := strings.CutPrefix(opt, "max_inflight=")
		if !found {
			return mirrors.Mirror{}, bad
		}
		if m.MaxInflight, err = strconv.Atoi(n); err != nil {
			return mirrors.Mirror{}, fmt.Errorf("%q: max_inflight %q is not an integer", v, n)
		}
	}
	return m, nil
}

// parseAlias reads --model-alias's NAME=MODEL[:WEIGHT][,MODEL[:WEIGHT]...];
// a model's name may hold colons (llama3:8b): only digits after its last
// one are a weight.
func parseAlias(v string) (aliases.Alias, error) {
	name, list, ok := strings.Cut(v, "=")
	if !ok || name == "" || list == "" {
		return aliases.Alias{}, fmt.Errorf("%q is not NAME=MODEL[:WEIGHT][,MODEL[:WEIGHT]...]", v)
	}
	a := aliases.Alias{Name: name}
	for _, t := range strings.Split(list, ",") {
		target := aliases.Target{Model: t}
		if i := strings.LastIndexByte(t, ':'); i >= 0 && i+1 < len(t) && strings.Trim(t[i+1:], "0123456789") == "" {
			w, err := strconv.Atoi(t[i+1:])
			if err != nil {
				return aliases.Alias{}, fmt.Errorf("%q: weight %s: %w", v, t[i+1:], err)
			}
			target = aliases.Target{Model: t[:i], Weight: w}
		}
		a.Targets = append(a.Targets, target)
	}
	return a, nil
}
