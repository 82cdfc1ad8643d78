// Package config loads and validates fastroute's YAML configuration.
package config

import (
	"bytes"
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/fastroute/fastroute/affinity"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/aliases"
	"github.com/fastroute/fastroute/dataplane/apikeys"
	"github.com/fastroute/fastroute/dataplane/http/frontend"
	"github.com/fastroute/fastroute/dataplane/mirrors"
	"github.com/fastroute/fastroute/dataplane/tracing"
	"github.com/fastroute/fastroute/discovery/dns"
	"github.com/fastroute/fastroute/internal/fielderr"
	"github.com/fastroute/fastroute/pickers"
	"golang.org/x/net/http/httpguts"
	"gopkg.in/yaml.v3"
)

// Config is the whole file. Every field has a default (Default) and a flag.
type Config struct {
	Listen      string `yaml:"listen"`
	AdminListen string `yaml:"admin_listen"`
	AdminToken  string `yaml:"admin_token"`
	// AdminTokenFile holds the admin token (its first line), kept out of
	// the config and the command line.
	AdminTokenFile string `yaml:"admin_token_file"`
	// MetricsPublic opens GET /metrics alone to scrapers without the token.
	MetricsPublic bool `yaml:"metrics_public"`
	// AdminTLS serves the admin listener over TLS, and checks the
	// certificates of the peer replicas' admin listeners this replica
	// shares prefixes with.
	AdminTLS AdminTLS `yaml:"admin_tls"`
	// WorkerAPIKey goes as "Authorization: Bearer <key>" on the router's
	// own requests to workers (health probes, /v1/models, engine metrics):
	// an engine started with --api-key answers /v1/models only with it.
	// Clients' requests keep their own Authorization, unless APIKeysFile
	// is set: the router then takes their keys and sends this one in their
	// place. WorkerAPIKeyFile holds it (its first line) out of the config
	// and the command line.
	WorkerAPIKey     string `yaml:"worker_api_key"`
	WorkerAPIKeyFile string `yaml:"worker_api_key_file"`
	// APIKeysFile lists the API keys clients must present, one a line
	// with its options ("NAME KEY [max_inflight=N] [tokens_per_minute=N]
	// [requests_per_minute=N] [priority=P] [models=a;b] [expires=T]",
	// apikeys.Parse): every request but a CORS preflight and GET /health
	// needs one. Empty: none is checked and a client's Authorization
	// reaches its worker. A reload reads it again.
	APIKeysFile string `yaml:"api_keys_file"`
	// APIKeysShareInterval, when positive, has the replicas on
	// discovery.etcd share each key's use (its tokens and requests over the
	// last minute, its requests in flight) that often, so that its caps hold across
	// them: each replica counts the others' last shared use beside its
	// own. 0: each replica caps what it serves.
	APIKeysShareInterval time.Duration `yaml:"api_keys_share_interval"`
	// APIKeys are APIKeysFile's keys, read by ResolveSecrets.
	APIKeys []apikeys.Entry `yaml:"-"`
	// ShutdownTimeout bounds the drain on SIGTERM; streams still open then are cut.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// ShutdownDelay is how long the router goes on serving after SIGTERM,
	// its GET /health answering 503 meanwhile, before the drain closes
	// the listener: a load balancer (a Kubernetes Service's endpoints)
	// takes it out of rotation meanwhile, and sends no connection to a
	// closed port. 0: the drain begins at once.
	ShutdownDelay time.Duration `yaml:"shutdown_delay"`
	// PIDFile, when set, is where the serving process writes its process
	// id once it accepts requests; an upgrade (SIGUSR2) has its new
	// process write its own, so that a supervisor reading the file (as
	// systemd's PIDFile=) follows the upgrade.
	PIDFile string `yaml:"pid_file"`
	// StateFile, when set, is where the router keeps what the admin API
	// changed (the workers POST /workers added, with the adapters declared
	// for them), written after each change and read at start: a restart,
	// or an upgrade's new process, starts with them, as a reload keeps
	// them.
	StateFile string `yaml:"state_file"`
	// Routes are extra paths proxied like the OpenAI ones, beyond every POST
	// under /v1/ and the engines' own (/tokenize, /detokenize, /pooling,
	// /classify, /score, /rerank, /generate).
	Routes []string `yaml:"routes"`
	// CORSAllowedOrigins are the origins (scheme://host[:port]) whose
	// browsers may call the front end, "*" for any: the router answers
	// their CORS preflights and marks its answers. Empty: no CORS.
	CORSAllowedOrigins []string `yaml:"cors_allowed_origins"`
	// ModelAliases are model names clients may ask for and the models
	// their requests go to instead, split by weight (aliases.Alias): the
	// body's model is rewritten. A reload applies them.
	ModelAliases []aliases.Alias `yaml:"model_aliases"`
	// ModelMirrors copy a share of the requests routed as a model to the
	// workers of a shadow model, whose answers are dropped
	// (mirrors.Mirror). A reload applies them.
	ModelMirrors []mirrors.Mirror       `yaml:"model_mirrors"`
	Router       Router                 `yaml:"router"`
	Telemetry    Telemetry              `yaml:"telemetry"`
	Health       Health                 `yaml:"health"`
	Limits       Limits                 `yaml:"limits"`
	Log          Log                    `yaml:"log"`
	Workers      []dataplane.WorkerSpec `yaml:"workers"`
	// Discovery finds more workers on etcd, beside the static ones.
	Discovery Discovery `yaml:"discovery"`
	// TLS has clients speak TLS to the front end.
	TLS TLS `yaml:"tls"`
	// ProxyProtocol has the connections of a load balancer in front of
	// the router begin with a PROXY protocol header naming the client.
	ProxyProtocol ProxyProtocol `yaml:"proxy_protocol"`
	// RealIP takes a request's client address from a header that an HTTP
	// load balancer in front of the router sets.
	RealIP RealIP `yaml:"real_ip"`
	// ForwardedClientCert names the proxies (a mesh sidecar that
	// terminates mutual TLS in front of the router) trusted to name their
	// client's certificate in Envoy's x-forwarded-client-cert.
	ForwardedClientCert ForwardedClientCert `yaml:"forwarded_client_cert"`
	// GenerateRequestIDs gives each proxied request without an
	// X-Request-Id one made up (32 hex digits), sent to its worker and
	// written in the access log, and has each answer carry the request's
	// id: a line of the router's log, of the engine's and a client's
	// report name the same request.
	GenerateRequestIDs bool `yaml:"generate_request_ids"`
	// AddXForwardedFor appends each proxied request's peer address (its
	// connection's, or the one a PROXY protocol header named) to the
	// X-Forwarded-For its worker gets, as nginx's
	// $proxy_add_x_forwarded_for does, so an engine's log names the client
	// rather than the router.
	AddXForwardedFor bool `yaml:"add_x_forwarded_for"`
	// WorkerTLS is how the router speaks TLS to workers whose url is
	// https://.
	WorkerTLS WorkerTLS `yaml:"worker_tls"`
	// Tracing exports a span of each sampled request to an OpenTelemetry
	// collector (OTLP/HTTP), its traceparent sent on to the worker.
	Tracing tracing.Config `yaml:"tracing"`
}

// TLS serves the front end over TLS (HTTP/1.1 inside) when both files
// are set: a PEM certificate chain and its private key. A reload reads
// them again (a rotated certificate).
type TLS struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ClientCAFile, when set, is a PEM bundle of CA certificates: every
	// client must show a certificate one of them signed (mutual TLS), or
	// its handshake fails.
	ClientCAFile string `yaml:"client_ca_file"`
	// ClientAuth is how the client CAs apply: ClientAuthRequire (the
	// default) refuses a client without a certificate they signed;
	// ClientAuthOptional lets a client without one in, and refuses one
	// whose certificate they did not sign (nginx's ssl_verify_client
	// optional: a move to mutual TLS, its clients one by one).
	ClientAuth string `yaml:"client_auth"`
	// ClientCRLFile, when set, holds the certificate revocation lists
	// (PEM, or one DER CRL) of the client CAs and of any intermediate CA
	// between them and a client: a client whose certificate, or an
	// intermediate's, is revoked, or whose issuer's CRL is missing,
	// expired or not signed by it, fails its handshake (nginx's ssl_crl).
	ClientCRLFile string `yaml:"client_crl_file"`
	// MinVersion is the oldest TLS version clients may speak: "1.2" (the
	// default, "" too) or "1.3" (nginx's ssl_protocols TLSv1.3).
	MinVersion string `yaml:"min_version"`
}

// TLSVersion is a min_version key's value as crypto/tls names it: TLS 1.3
// for "1.3", else TLS 1.2.
func TLSVersion(v string) uint16 {
	if v == "1.3" {
		return tls.VersionTLS13
	}
	return tls.VersionTLS12
}

// checkTLSVersion says what is wrong with a min_version key's value v.
func checkTLSVersion(key, v string) error {
	if v != "" && v != "1.2" && v != "1.3" {
		return keyErr(key, "%q is not 1.2 or 1.3", v)
	}
	return nil
}

// The values of tls.client_auth.
const (
	ClientAuthRequire  = "require"
	ClientAuthOptional = "optional"
)

// On reports whether the front end speaks TLS.
func (t TLS) On() bool { return t.CertFile != "" }

// AdminTLS serves the admin listener over TLS 1.2 or 1.3 (HTTPS) when
// both files are set: a PEM certificate chain and its private key, which
// a reload reads again (a rotated certificate). PeerCAFile, when set,
// holds the CA certificates the admin listeners of https:// peer replicas
// (router.prefix_affinity's peers, or those found on etcd) must show a
// certificate of; empty: the system's roots. ClientCAFile, when set,
// holds the CA certificates every client of the admin listener must show
// a certificate of (mutual TLS); replicas show their admin certificate to
// the peers they post to.
type AdminTLS struct {
	CertFile     string `yaml:"cert_file"`
	KeyFile      string `yaml:"key_file"`
	PeerCAFile   string `yaml:"peer_ca_file"`
	ClientCAFile string `yaml:"client_ca_file"`
	// MinVersion is the oldest TLS version the admin listener's clients
	// may speak, as TLS.MinVersion.
	MinVersion string `yaml:"min_version"`
}

// On reports whether the admin listener speaks TLS.
func (t AdminTLS) On() bool { return t.CertFile != "" }

// ProxyProtocol, when Enabled, has each connection to listen from one of
// the addresses From (an IP, or a CIDR prefix; none: every connection)
// begin with a PROXY protocol header (HAProxy's, version 1 or 2), as a
// load balancer in TCP mode sends it (an AWS Network Load Balancer,
// HAProxy's send-proxy, nginx's proxy_protocol): the address it names is
// the client's, in the access log. A connection from elsewhere is served
// under its own address, and one from From without a header is closed
// unserved.
type ProxyProtocol struct {
	Enabled bool     `yaml:"enabled"`
	From    []string `yaml:"from"`
}

// Prefixes returns From as prefixes, a lone IP as the prefix of it
// alone.
func (p ProxyProtocol) Prefixes() ([]netip.Prefix, error) { return prefixesOf(p.From) }

// RealIP, when Header is set, takes a request's client address from that
// header (X-Forwarded-For, or one naming a single address such as
// X-Real-IP) when the request came from one of the proxies From (IPs or
// CIDR prefixes), as nginx's realip module does (set_real_ip_from,
// real_ip_header, real_ip_recursive on): behind an HTTP load balancer
// (an AWS Application Load Balancer, nginx, Envoy), the access log and
// the request's span show the client, not the balancer. Of
// X-Forwarded-For's addresses the client is the last one that is not a
// proxy of From: the one the nearest trusted proxy saw. A request from
// elsewhere keeps its connection's address, whatever it sends.
type RealIP struct {
	Header string   `yaml:"header"`
	From   []string `yaml:"from"`
}

// Prefixes returns From as prefixes, a lone IP as the prefix of it alone.
func (r RealIP) Prefixes() ([]netip.Prefix, error) { return prefixesOf(r.From) }

// ForwardedClientCert, when From is set, takes a request's client
// certificate from the x-forwarded-client-cert header (Envoy's XFCC: the
// last element's Subject common name, else its URI, else its DNS name)
// when the request's connection comes from one of the proxies From (IPs
// or CIDR prefixes): behind an Envoy or Istio sidecar that terminates
// mutual TLS, the access log's client_cert and api_keys_file's cert:
// lines name the client. The header reaches no worker.
type ForwardedClientCert struct {
	From []string `yaml:"from"`
}

// Prefixes returns From as prefixes, a lone IP as the prefix of it alone.
func (f ForwardedClientCert) Prefixes() ([]netip.Prefix, error) { return prefixesOf(f.From) }

// prefixesOf returns addresses (IPs or CIDR prefixes) as prefixes, a lone
// IP as the prefix of it alone.
func prefixesOf(addresses []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range addresses {
		pre, err := netip.ParsePrefix(f)
		if err != nil {
			ip, ipErr := netip.ParseAddr(f)
			if ipErr != nil {
				return nil, fmt.Errorf("%q is neither an IP nor a CIDR prefix", f)
			}
			pre = netip.PrefixFrom(ip, ip.BitLen())
		}
		out = append(out, pre.Masked())
	}
	return out, nil
}

// check says what is wrong with the real_ip key, naming the key.
func (r RealIP) check() error {
	if _, err := r.Prefixes(); err != nil {
		return keyErr("real_ip.from", "%v", err)
	}
	switch {
	case r.Header == "" && len(r.From) > 0:
		return keyErr("real_ip.from", "set, but real_ip.header is empty")
	case r.Header == "":
		return nil
	case len(r.From) == 0:
		return keyErr("real_ip.from", "names no proxy: every client could then name its own address in %s", r.Header)
	case !httpguts.ValidHeaderFieldName(r.Header):
		return keyErr("real_ip.header", "%q is not a header name", r.Header)
	}
	return nil
}

// WorkerTLS is the TLS of the router's connections to workers whose url is
// https:// (TLS 1.2 or later, HTTP/1.1 inside). Their certificates are
// checked against CAFile's PEM certificates (default: the system's roots)
// for the url's host, or ServerName when set (also sent as SNI), unless
// InsecureSkipVerify. CertFile and KeyFile are the router's client
// certificate, for workers that ask for one (mutual TLS). A reload reads
// the files again and applies them, a new ServerName and
// InsecureSkipVerify to the next connections.
type WorkerTLS struct {
	CAFile             string `yaml:"ca_file"`
	CertFile           string `yaml:"cert_file"`
	KeyFile            string `yaml:"key_file"`
	ServerName         string `yaml:"server_name"`
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify"`
}

// Verification is how workers' certificates are checked: the roots, the
// name checked and whether they are checked at all.
func (t WorkerTLS) Verification() WorkerTLS {
	t.CertFile, t.KeyFile = "", ""
	return t
}

// Discovery configures worker discovery.
type Discovery struct {
	Etcd Etcd `yaml:"etcd"`
	DNS  DNS  `yaml:"dns"`
}

// DNS finds workers by DNS name (off without names): every address each
// host:port of Names resolves to, of the family Family takes (dns.PreferIPv4,
// dns.PreferIPv6, dns.BothFamilies), is a worker on its port, spoken to over
// Scheme, with Worker's fields (device, capacity, role...), looked up
// again every Interval, from Server when set (else the system's
// resolver).
type DNS struct {
	Names    []string             `yaml:"names"`
	Interval time.Duration        `yaml:"interval"`
	Server   string               `yaml:"server"`
	Scheme   string               `yaml:"scheme"`
	Family   string               `yaml:"family"`
	Worker   dataplane.WorkerSpec `yaml:"worker"`
}

// On reports whether workers are found by DNS name.
func (d DNS) On() bool { return len(d.Names) > 0 }

// Options are the DNS watcher's options.
func (d DNS) Options(log *slog.Logger) dns.Options {
	return dns.Options{Names: d.Names, Interval: d.Interval, Server: d.Server, Scheme: d.Scheme, Family: d.Family, Worker: d.Worker, Logger: log}
}

// Etcd locates the etcd cluster workers register on (no endpoints: off).
type Etcd struct {
	Endpoints   []string      `yaml:"endpoints"`
	Prefix      string        `yaml:"prefix"`
	DialTimeout time.Duration `yaml:"dial_timeout"`
	Username    string        `yaml:"username"`
	Password    string        `yaml:"password"`
	CertFile    string        `yaml:"cert_file"`
	KeyFile     string        `yaml:"key_file"`
	CAFile      string        `yaml:"ca_file"`
}

// Router holds the selection settings.
type Router struct {
	Mode            pickers.Mode `yaml:"mode"`
	BusyThreshold   int          `yaml:"busy_threshold"`
	Retries         int          `yaml:"retries"`
	SessionAffinity Affinity     `yaml:"session_affinity"`
	// EmbeddingCacheSize bounds the embedding cache table (keys); 0 turns it off.
	EmbeddingCacheSize int `yaml:"embedding_cache_size"`
	// PrefixAffinity sends a generation request to the worker last sent
	// the longest prefix of its prompt, where its KV cache may still be.
	PrefixAffinity PrefixAffinity `yaml:"prefix_affinity"`
	// LoRAPlacement is where a request for an adapter no routable worker
	// holds goes: off (404 for an unknown model, 503 for an adapter whose
	// holders are all gone) or rendezvous (the worker rendezvous hashing of
	// the adapter's name picks, the same on every replica: for engines that
	// load adapters at run time).
	LoRAPlacement string `yaml:"lora_placement"`
	// CPURatio is device-aware-weighted's CPU overflow rule (0: off): with
	// GPU and CPU workers and no engine readings, the CPU group takes a
	// request only while cpu_inflight < gpu_inflight × cpus / (ratio × gpus).
	CPURatio float64 `yaml:"cpu_ratio"`
	// Disaggregation splits generation requests between a prefill and a
	// decode pool (workers' role).
	Disaggregation Disaggregation `yaml:"disaggregation"`
	// Queue holds requests that find every worker they may go to busy,
	// instead of answering them 429 at once.
	Queue Queue `yaml:"queue"`
	// RetryStatuses are worker answer statuses that move a request to
	// another worker, as a transport failure does (within Retries), when
	// the answer is small enough to be read whole first; the last worker's
	// answer reaches the client as it is. Empty: answers are never retried.
	RetryStatuses []int `yaml:"retry_statuses"`
	// RetryBudget caps the requests on a retry at once: a retry is made
	// only while fewer than max(MinRetries, Percent% of the requests
	// holding a worker) are on one. Percent 0: no budget.
	RetryBudget RetryBudget `yaml:"retry_budget"`
}

// RetryBudget is router.retry_budget.
type RetryBudget struct {
	Percent    float64 `yaml:"percent"`
	MinRetries int     `yaml:"min_retries"`
}

// PrefixAffinity is prefix-aware routing: a generation request's prompt
// (its messages, prompt or input, with the model's name) is keyed in
// blocks of BlockBytes, up to MaxBlocks of them; a table of TableSize
// slots remembers the worker each prefix was last sent to, and a request
// goes to the worker holding its longest known prefix while that worker
// is within Slack requests of the least loaded candidate (in requests in
// flight, or in engine cost while engine telemetry prices every candidate).
// Replicas in front of the same workers share what they record: every
// ShareInterval the prefixes recorded anew go to each of Peers (the other
// replicas' admin listeners, scheme://host:port), which take them in.
type PrefixAffinity struct {
	Enabled       bool          `yaml:"enabled"`
	TableSize     int           `yaml:"table_size"`
	BlockBytes    int           `yaml:"block_bytes"`
	MaxBlocks     int           `yaml:"max_blocks"`
	Slack         int           `yaml:"slack"`
	Peers         []string      `yaml:"peers"`
	ShareInterval time.Duration `yaml:"share_interval"`
	// Advertise is this replica's admin listener as its peers reach it
	// (scheme://host:port): with discovery.etcd on, the replica registers
	// it there and shares with every other replica registered.
	Advertise string `yaml:"advertise"`
}

// validate checks the prefix routing settings, whether on or not.
func (p PrefixAffinity) validate() error {
	switch {
	case p.TableSize < 64 || p.TableSize > 1<<26:
		return keyErr("router.prefix_affinity.table_size", "%d is outside 64..%d", p.TableSize, 1<<26)
	case p.BlockBytes < 16 || p.BlockBytes > 1<<16:
		return keyErr("router.prefix_affinity.block_bytes", "%d is outside 16..%d", p.BlockBytes, 1<<16)
	case p.MaxBlocks < 1 || p.MaxBlocks > 4096:
		return keyErr("router.prefix_affinity.max_blocks", "%d is outside 1..4096", p.MaxBlocks)
	case p.Slack < 0:
		return keyErr("router.prefix_affinity.slack", "%d is negative", p.Slack)
	case p.ShareInterval < time.Millisecond || p.ShareInterval > 10*time.Second:
		return keyErr("router.prefix_affinity.share_interval", "%v is outside 1ms..10s", p.ShareInterval)
	}
	for _, peer := range p.Peers {
		if !IsBaseURL(peer) {
			return keyErr("router.prefix_affinity.peers", "%q is not a replica's admin listener as http(s)://host:port", peer)
		}
	}
	if p.Advertise != "" && !IsBaseURL(p.Advertise) {
		return keyErr("router.prefix_affinity.advertise", "%q is not this replica's admin listener as http(s)://host:port", p.Advertise)
	}
	return nil
}

// Queue is the router's wait queue for requests that find their workers
// busy: up to Size of them wait, each up to Timeout, for a worker to free
// a slot, the lowest body priority (vLLM's field) first; a request beyond
// Size that goes before no waiter, or one still waiting at Timeout, is
// answered 429. Size 0 turns it off (429 at once).
type Queue struct {
	Size    int           `yaml:"size"`
	Timeout time.Duration `yaml:"timeout"`
}

// The disaggregation protocols.
const (
	DisaggOff     = "off"
	DisaggVLLM    = "vllm-nixl"        // vLLM's KV connector: prefill first, its kv_transfer_params to decode
	DisaggSGLang  = "sglang-bootstrap" // SGLang's: both at once, meeting at the prefill's bootstrap port
	FallbackAggr  = "aggregated"
	FallbackError = "error"
)

// Disaggregation configures prefill/decode disaggregation.
type Disaggregation struct {
	Protocol    string       `yaml:"protocol"`     // off|vllm-nixl|sglang-bootstrap
	PrefillMode pickers.Mode `yaml:"prefill_mode"` // the prefill pool's picker; "": router.mode
	DecodeMode  pickers.Mode `yaml:"decode_mode"`  // the decode pool's picker; "": router.mode
	// MinPrefillTokens sends prompts shorter than this (estimated at 4
	// body bytes a token) whole to a decode worker.
	MinPrefillTokens int `yaml:"min_prefill_tokens"`
	// MaxPrefillQueue sends a request whole to its decode worker while its
	// prefill pick's engine reports this many requests waiting or more
	// (NVIDIA Dynamo's max_prefill_queue_size); 0: never.
	MaxPrefillQueue int `yaml:"max_prefill_queue"`
	// Fallback is what a request gets while no prefill worker is routable
	// (or, with vLLM's protocol, free): aggregated (whole, to a decode
	// worker, counted) or error (503, or 429 while they are all busy).
	Fallback string `yaml:"fallback"`
}

// Affinity holds the session-affinity settings.
type Affinity struct {
	Mode        string        `yaml:"mode"` // off|soft|hard
	Header      string        `yaml:"header"`
	TTL         time.Duration `yaml:"ttl"`
	MaxSessions int           `yaml:"max_sessions"`
}

// Telemetry selects the collectors and their poll period.
type Telemetry struct {
	NVML     bool          `yaml:"nvml"`
	CPU      bool          `yaml:"cpu"`
	Interval time.Duration `yaml:"interval"`
	Engine   Engine        `yaml:"engine"`
}

// Engine configures the polling of each worker's engine metrics
// (vLLM/SGLang queue, batch and KV cache) at its metrics_path.
type Engine struct {
	Enabled  bool          `yaml:"enabled"`
	Interval time.Duration `yaml:"interval"`
	Timeout  time.Duration `yaml:"timeout"`
	// StallAfter takes a worker out of rotation once its engine has had
	// requests running for that long without generating a token (hung);
	// 0: never.
	StallAfter time.Duration `yaml:"stall_after"`
}

// Health configures worker health checks: active probes, and the passive
// check that ejects a worker after EjectAfter consecutive 5xx answers or
// transport failures for EjectTime, doubled while it keeps failing, up to
// EjectMax (0 turns ejection off).
type Health struct {
	Interval time.Duration `yaml:"interval"`
	// Timeout bounds one probe; 0: the interval. SGLang's /health runs a
	// generation and answers a second later at the earliest.
	Timeout        time.Duration `yaml:"timeout"`
	Path           string        `yaml:"path"`
	UnhealthyAfter int           `yaml:"unhealthy_after"`
	EjectAfter     int           `yaml:"eject_after"`
	EjectTime      time.Duration `yaml:"eject_time"`
	EjectMax       time.Duration `yaml:"eject_max"`
}

// Log configures the router's logs (slog, on stderr).
type Log struct {
	Access string `yaml:"access"` // off|all|errors: one line per request (errors: 400 and above, or cut)
	Format string `yaml:"format"` // text|json
}

// Limits bounds what one request may cost.
type Limits struct {
	MaxBodyBytes Size `yaml:"max_body_bytes"`
	// MaxHeaderBytes bounds the request line and headers (431 beyond).
	MaxHeaderBytes Size          `yaml:"max_header_bytes"`
	ReadTimeout    time.Duration `yaml:"read_timeout"`
	// WriteTimeout bounds each write to a client (a whole answer, or one
	// batch of a stream's chunks), not a whole stream.
	WriteTimeout   time.Duration `yaml:"write_timeout"`
	IdleTimeout    time.Duration `yaml:"idle_timeout"`
	ConnectTimeout time.Duration `yaml:"connect_timeout"`
	// FirstByteTimeout bounds the wait for a worker's response headers
	// (a queued request included); StreamIdleTimeout the gap between two
	// reads of its answer once bytes flow. Neither bounds a long stream
	// that keeps sending.
	FirstByteTimeout  time.Duration `yaml:"first_byte_timeout"`
	StreamIdleTimeout time.Duration `yaml:"stream_idle_timeout"`
	// AnswerBufferBytes bounds what the router holds of one worker answer:
	// a non-streamed answer of known length up to it is read whole and
	// sent in one write; a larger one, or one of unknown length, passes
	// through as it comes, as a stream does. A prefill answer (read whole,
	// since the decode request is built from it) over it is a 502.
	AnswerBufferBytes Size `yaml:"answer_buffer_bytes"`
	// MaxConnections bounds the client connections open at once; beyond,
	// new ones wait in the listen queue until one closes (0: half the
	// open-files limit less 128, frontend.DefaultMaxConnections).
	MaxConnections int `yaml:"max_connections"`
	// MaxRequestsPerConnection is how many requests a client connection
	// carries: the last one's answer closes it (Connection: close), so that
	// kept-alive clients behind a layer-4 balancer spread again over the
	// router replicas, a new one included (nginx's keepalive_requests,
	// Envoy's max_requests_per_connection). 0: no limit.
	MaxRequestsPerConnection int `yaml:"max_requests_per_connection"`
}

// Default returns the configuration of DESIGN.md with no workers.
func Default() Config {
	return Config{
		Listen:          "127.0.0.1:8000",
		Log:             Log{Access: "off", Format: "text"},
		AdminListen:     "127.0.0.1:9090",
		ShutdownTimeout: 30 * time.Second,
		Router: Router{
			Mode: pickers.ModeWeighted, BusyThreshold: 64, Retries: 2,
			SessionAffinity:    Affinity{Mode: "soft", Header: "x-session-id", TTL: 10 * time.Minute, MaxSessions: 100000},
			EmbeddingCacheSize: 1 << 16, CPURatio: 8, LoRAPlacement: "off",
			PrefixAffinity: PrefixAffinity{TableSize: 1 << 18, BlockBytes: 256, MaxBlocks: 128, Slack: 4, ShareInterval: 10 * time.Millisecond},
			Disaggregation: Disaggregation{Protocol: DisaggOff, Fallback: FallbackAggr},
			Queue:          Queue{Timeout: 30 * time.Second},
			RetryBudget:    RetryBudget{MinRetries: 3},
		},
		Telemetry: Telemetry{NVML: true, CPU: true, Interval: 250 * time.Millisecond,
			Engine: Engine{Enabled: true, Interval: 50 * time.Millisecond, Timeout: time.Second}},
		Health: Health{Interval: 2 * time.Second, Path: "/health", UnhealthyAfter: 3,
			EjectAfter: 5, EjectTime: 5 * time.Second, EjectMax: 5 * time.Minute},
		Discovery: Discovery{Etcd: Etcd{Prefix: "/fastroute", DialTimeout: 2 * time.Second}, DNS: DNS{Interval: 5 * time.Second, Scheme: "http", Family: dns.PreferIPv4}},
		Tracing:   tracing.Config{SampleRatio: 1, ServiceName: "fastroute"},
		Limits: Limits{
			MaxBodyBytes: 16 << 20, MaxHeaderBytes: 64 << 10, ReadTimeout: 30 * time.Second, WriteTimeout: 10 * time.Minute,
			IdleTimeout: 2 * time.Minute, ConnectTimeout: 2 * time.Second,
			FirstByteTimeout: 10 * time.Minute, StreamIdleTimeout: 5 * time.Minute, AnswerBufferBytes: frontend.DefaultAnswerBufferBytes,
			MaxRequestsPerConnection: 1000,
		},
	}
}

// Load reads, decodes and validates a config file over the defaults.
// Unknown keys are refused. Errors name the file, the key and the reason.
func Load(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	return Parse(path, data)
}

// Parse decodes and validates config text; name labels errors.
func Parse(name string, data []byte) (Config, error) {
	cfg := Default()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) { // an empty file keeps the defaults
		return Config{}, fmt.Errorf("config %s: %s", name, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, fmt.Errorf("config %s: %w", name, err)
	}
	return cfg, nil
}

// AdminTokenEnv is the environment variable an admin token may come from.
const AdminTokenEnv = "FASTROUTE_ADMIN_TOKEN"

// WorkerAPIKeyEnv is the environment variable the workers' API key may
// come from.
const WorkerAPIKeyEnv = "FASTROUTE_WORKER_API_KEY"

// ResolveSecrets settles the admin token (admin_token, admin_token_file
// or the FASTROUTE_ADMIN_TOKEN variable, through getenv) and the workers'
// API key (worker_api_key, worker_api_key_file or
// FASTROUTE_WORKER_API_KEY), and refuses an admin listener reachable off
// this host with no token; it reads the clients' API keys
// (api_keys_file). It runs before the router starts and at each reload,
// after Validate.
func (c *Config) ResolveSecrets(getenv func(string) string) error {
	var err error
	if c.APIKeys = nil; c.APIKeysFile != "" {
		data, err := os.ReadFile(c.APIKeysFile)
		if err != nil {
			return keyErr("api_keys_file", "%v", err)
		}
		if c.APIKeys, err = apikeys.Parse(data); err != nil {
			return keyErr("api_keys_file", "%s: %v", c.APIKeysFile, err)
		}
		for _, e := range c.APIKeys {
			if e.Cert != "" && c.TLS.ClientCAFile == "" && len(c.ForwardedClientCert.From) == 0 {
				return keyErr("api_keys_file", "%s: %s names a client certificate, and neither tls.client_ca_file nor forwarded_client_cert.from is set: no client shows one",
					c.APIKeysFile, e.Name)
			}
		}
	}
	if c.AdminToken, err = resolveSecret("admin_token", c.AdminToken, c.AdminTokenFile, AdminTokenEnv, getenv); err != nil {
		return err
	}
	if c.WorkerAPIKey, err = resolveSecret("worker_api_key", c.WorkerAPIKey, c.WorkerAPIKeyFile, WorkerAPIKeyEnv, getenv); err != nil {
		return err
	}
	if c.Tracing.On() && len(c.Tracing.Headers) == 0 {
		if c.Tracing.Headers, err = tracing.HeadersFromEnv(getenv); err != nil {
			return keyErr("tracing.headers", "%v", err)
		}
	}
	if c.AdminToken == "" && OffHost(c.AdminListen) {
		return keyErr("admin_listen", "%s is reachable from other hosts and no admin token is set (admin_token, admin_token_file or %s)",
			c.AdminListen, AdminTokenEnv)
	}
	return nil
}

// OffHost reports whether a listener on address (host:port) is reachable
// from other hosts: its host is not localhost or a loopback address. The
// admin listener is not run there without a token.
func OffHost(address string) bool {
	host, _, _ := net.SplitHostPort(address)
	ip := net.ParseIP(host)
	return host != "localhost" && (ip == nil || !ip.IsLoopback())
}

// resolveSecret returns the secret of config key key: its value, else the
// first line of its file (key_file), else the environment variable env.
func resolveSecret(key, value, file, env string, getenv func(string) string) (string, error) {
	switch {
	case value != "" && file != "":
		return "", keyErr(key+"_file", "set %s or %s_file, not both", key, key)
	case file != "":
		data, err := os.ReadFile(file)
		if err != nil {
			return "", keyErr(key+"_file", "%v", err)
		}
		line, _, _ := strings.Cut(string(data), "\n")
		if value = strings.TrimSpace(line); value == "" {
			return "", keyErr(key+"_file", "%s holds nothing on its first line", file)
		}
		return value, nil
	case value == "":
		return strings.TrimSpace(getenv(env)), nil
	}
	return value, nil
}

// KeyError names the config key at fault.
type KeyError struct {
	Key    string
	Reason string
}

func (e *KeyError) Error() string { return "key " + e.Key + ": " + e.Reason }

func keyErr(key, format string, args ...any) error {
	return &KeyError{Key: key, Reason: fmt.Sprintf(format, args...)}
}

// Validate checks every key; it normalises the worker specs in place.
func (c *Config) Validate() error {
	for key, addr := range map[string]string{"listen": c.Listen, "admin_listen": c.AdminListen} {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return keyErr(key, "%q is not host:port", addr)
		}
	}
	if _, err := pickers.ParseMode(string(c.Router.Mode)); err != nil {
		return keyErr("router.mode", "%v", err)
	}
	if c.Router.BusyThreshold < 0 {
		return keyErr("router.busy_threshold", "%d is negative (0 means no limit)", c.Router.BusyThreshold)
	}
	if c.Router.Retries < 0 || c.Router.Retries >= dataplane.MaxAttempts {
		return keyErr("router.retries", "%d is outside 0..%d", c.Router.Retries, dataplane.MaxAttempts-1)
	}
	for _, st := range c.Router.RetryStatuses {
		if st != 408 && st != 429 && (st < 500 || st > 599) {
			return keyErr("router.retry_statuses", "%d is not 408, 429 or 5xx", st)
		}
	}
	if b := c.Router.RetryBudget; !(b.Percent >= 0 && b.Percent <= 100) {
		return keyErr("router.retry_budget.percent", "%v is outside 0..100 (0 turns the budget off)", b.Percent)
	} else if b.MinRetries < 0 {
		return keyErr("router.retry_budget.min_retries", "%d is negative", b.MinRetries)
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		return keyErr("tls", "set cert_file and key_file together")
	}
	if (c.AdminTLS.CertFile == "") != (c.AdminTLS.KeyFile == "") {
		return keyErr("admin_tls", "set cert_file and key_file together")
	}
	if err := checkTLSVersion("tls.min_version", c.TLS.MinVersion); err != nil {
		return err
	}
	if err := checkTLSVersion("admin_tls.min_version", c.AdminTLS.MinVersion); err != nil {
		return err
	}
	if c.AdminTLS.ClientCAFile != "" && !c.AdminTLS.On() {
		return keyErr("admin_tls.client_ca_file", "set, but admin_tls.cert_file is not: admin clients speak plain HTTP, with no certificate to show")
	}
	if c.TLS.ClientCAFile != "" && !c.TLS.On() {
		return keyErr("tls.client_ca_file", "set, but tls.cert_file is not: clients speak plain HTTP, with no certificate to show")
	}
	switch c.TLS.ClientAuth {
	case "", ClientAuthRequire, ClientAuthOptional:
		if c.TLS.ClientAuth != "" && c.TLS.ClientCAFile == "" {
			return keyErr("tls.client_auth", "set, but tls.client_ca_file is not: no CA to check a client's certificate against")
		}
	default:
		return keyErr("tls.client_auth", "%q is not require or optional", c.TLS.ClientAuth)
	}
	if c.TLS.ClientCRLFile != "" && c.TLS.ClientCAFile == "" {
		return keyErr("tls.client_crl_file", "set, but tls.client_ca_file is not: no client certificate is asked for")
	}
	if _, err := c.ProxyProtocol.Prefixes(); err != nil {
		return keyErr("proxy_protocol.from", "%v", err)
	} else if len(c.ProxyProtocol.From) > 0 && !c.ProxyProtocol.Enabled {
		return keyErr("proxy_protocol.from", "set, but proxy_protocol.enabled is false")
	}
	if _, err := c.ForwardedClientCert.Prefixes(); err != nil {
		return keyErr("forwarded_client_cert.from", "%v", err)
	}
	if err := c.RealIP.check(); err != nil {
		return err
	}
	if w := c.WorkerTLS; (w.CertFile == "") != (w.KeyFile == "") {
		return keyErr("worker_tls", "set cert_file and key_file together")
	} else if w.InsecureSkipVerify && (w.CAFile != "" || w.ServerName != "") {
		return keyErr("worker_tls.insecure_skip_verify", "checks no certificate, so ca_file and server_name would do nothing: set one or the other")
	}
	if q := c.Router.Queue; q.Size < 0 {
		return keyErr("router.queue.size", "%d is negative (0 turns the queue off)", q.Size)
	} else if q.Size > 0 && q.Timeout <= 0 {
		return keyErr("router.queue.timeout", "%v must be positive", q.Timeout)
	}
	a := &c.Router.SessionAffinity
	if _, err := affinity.ParseMode(a.Mode); err != nil {
		return keyErr("router.session_affinity.mode", "%v", err)
	}
	if a.Header == "" {
		return keyErr("router.session_affinity.header", "must not be empty")
	}
	if a.TTL <= 0 {
		return keyErr("router.session_affinity.ttl", "%v must be positive", a.TTL)
	}
	if a.MaxSessions <= 0 {
		return keyErr("router.session_affinity.max_sessions", "%d must be positive", a.MaxSessions)
	}
	if !(c.Router.CPURatio >= 0) || math.IsInf(c.Router.CPURatio, 0) {
		return keyErr("router.cpu_ratio", "%v must be a number, 0 or more (0 turns the CPU overflow rule off)", c.Router.CPURatio)
	}
	if c.Router.EmbeddingCacheSize < 0 || c.Router.EmbeddingCacheSize > 1<<26 {
		return keyErr("router.embedding_cache_size", "%d is outside 0..%d (0 turns the cache off)", c.Router.EmbeddingCacheSize, 1<<26)
	}
	if err := c.Router.PrefixAffinity.validate(); err != nil {
		return err
	}
	if c.Router.PrefixAffinity.Advertise != "" && len(c.Discovery.Etcd.Endpoints) == 0 {
		return keyErr("router.prefix_affinity.advertise", "needs discovery.etcd.endpoints, where replicas find each other")
	}
	if adv := c.Router.PrefixAffinity.Advertise; adv != "" && c.AdminTLS.On() != strings.HasPrefix(adv, "https://") {
		return keyErr("router.prefix_affinity.advertise", "%q does not say what the admin listener speaks: https:// with admin_tls set, http:// without", adv)
	}
	if p := c.Router.LoRAPlacement; p != "off" && p != "rendezvous" {
		return keyErr("router.lora_placement", "%q is not off or rendezvous", p)
	}
	if err := c.Router.Disaggregation.validate(); err != nil {
		return err
	}
	if c.Router.Disaggregation.MaxPrefillQueue > 0 && !c.Telemetry.Engine.Enabled {
		return keyErr("router.disaggregation.max_prefill_queue", "needs telemetry.engine.enabled: the queue is what the prefill engines report")
	}
	if e := c.Discovery.Etcd; len(e.Endpoints) > 0 {
		if !strings.HasPrefix(e.Prefix, "/") {
			return keyErr("discovery.etcd.prefix", "%q must start with /", e.Prefix)
		}
		if e.DialTimeout <= 0 {
			return keyErr("discovery.etcd.dial_timeout", "%v must be positive", e.DialTimeout)
		}
		if (e.CertFile == "") != (e.KeyFile == "") {
			return keyErr("discovery.etcd.cert_file", "cert_file and key_file go together")
		}
	}
	if c.Discovery.DNS.On() {
		if err := c.Discovery.DNS.Options(nil).Check(); err != nil {
			return keyErr("discovery.dns", "%v", err)
		}
	}
	if _, ok := frontend.ParseAccess(c.Log.Access); !ok {
		return keyErr("log.access", "%q is not off, all or errors", c.Log.Access)
	}
	if c.Log.Format != "text" && c.Log.Format != "json" {
		return keyErr("log.format", "%q is not text or json", c.Log.Format)
	}
	for i, r := range c.Routes {
		if !strings.HasPrefix(r, "/") || strings.ContainsAny(r, "?# ") {
			return keyErr(fmt.Sprintf("routes[%d]", i), "%q is not a path (it starts with / and has no query)", r)
		}
	}
	for i, o := range c.CORSAllowedOrigins {
		if !isOrigin(o) {
			return keyErr(fmt.Sprintf("cors_allowed_origins[%d]", i), "%q is not an origin (scheme://host[:port], as a browser sends it) or *", o)
		}
	}
	switch iv := c.APIKeysShareInterval; {
	case iv < 0:
		return keyErr("api_keys_share_interval", "%v is negative", iv)
	case iv > 0 && len(c.Discovery.Etcd.Endpoints) == 0:
		return keyErr("api_keys_share_interval", "needs discovery.etcd.endpoints, where replicas share their keys' use")
	case iv > 0 && c.APIKeysFile == "":
		return keyErr("api_keys_share_interval", "needs api_keys_file: no key, nothing to share")
	case iv > 0 && iv < 100*time.Millisecond:
		return keyErr("api_keys_share_interval", "%v is below 100ms (two etcd requests a replica each time)", iv)
	}
	_, aerr := aliases.New(c.ModelAliases)
	_, merr := mirrors.New(c.ModelMirrors)
	if err := cmp.Or(aerr, merr); err != nil {
		var fe *fielderr.Error
		if errors.As(err, &fe) {
			return keyErr(fe.Field, "%s", fe.Reason)
		}
		return err
	}
	for i, m := range c.ModelMirrors {
		if slices.ContainsFunc(c.ModelAliases, func(a aliases.Alias) bool { return a.Name == m.Model }) {
			return keyErr(fmt.Sprintf("model_mirrors[%d].model", i), "%q is a model alias: requests are mirrored by the model they are routed as, so name its targets", m.Model)
		}
	}
	if key, err := c.Tracing.Check(); err != nil {
		return keyErr("tracing."+key, "%v", err)
	}
	if c.ShutdownTimeout <= 0 {
		return keyErr("shutdown_timeout", "%v must be positive", c.ShutdownTimeout)
	}
	if c.ShutdownDelay < 0 {
		return keyErr("shutdown_delay", "%v is negative", c.ShutdownDelay)
	}
	if c.Telemetry.Interval <= 0 {
		return keyErr("telemetry.interval", "%v must be positive", c.Telemetry.Interval)
	}
	if c.Telemetry.Engine.Interval <= 0 {
		return keyErr("telemetry.engine.interval", "%v must be positive", c.Telemetry.Engine.Interval)
	}
	if c.Telemetry.Engine.Timeout <= 0 {
		return keyErr("telemetry.engine.timeout", "%v must be positive", c.Telemetry.Engine.Timeout)
	}
	if c.Telemetry.Engine.StallAfter < 0 {
		return keyErr("telemetry.engine.stall_after", "%v is negative (0: never)", c.Telemetry.Engine.StallAfter)
	}
	if c.Telemetry.Engine.StallAfter > 0 && !c.Telemetry.Engine.Enabled {
		return keyErr("telemetry.engine.stall_after", "needs telemetry.engine.enabled: a stall is read from the engine's metrics")
	}
	if c.Health.Interval <= 0 {
		return keyErr("health.interval", "%v must be positive", c.Health.Interval)
	}
	if c.Health.Timeout < 0 {
		return keyErr("health.timeout", "%v is negative (0: health.interval)", c.Health.Timeout)
	}
	if !strings.HasPrefix(c.Health.Path, "/") {
		return keyErr("health.path", "%q must start with /", c.Health.Path)
	}
	if c.Health.UnhealthyAfter < 1 {
		return keyErr("health.unhealthy_after", "%d must be at least 1", c.Health.UnhealthyAfter)
	}
	if c.Health.EjectAfter < 0 {
		return keyErr("health.eject_after", "%d is negative (0 turns ejection off)", c.Health.EjectAfter)
	}
	if c.Health.EjectTime <= 0 || c.Health.EjectMax < c.Health.EjectTime {
		return keyErr("health.eject_time", "%v must be positive and at most health.eject_max (%v)", c.Health.EjectTime, c.Health.EjectMax)
	}
	if c.Limits.MaxBodyBytes <= 0 {
		return keyErr("limits.max_body_bytes", "%d must be positive", c.Limits.MaxBodyBytes)
	}
	if c.Limits.MaxConnections < 0 {
		return keyErr("limits.max_connections", "%d is negative (0: half the open-files limit less 128)", c.Limits.MaxConnections)
	}
	if c.Limits.MaxRequestsPerConnection < 0 {
		return keyErr("limits.max_requests_per_connection", "%d is negative (0: no limit)", c.Limits.MaxRequestsPerConnection)
	}
	if c.Limits.AnswerBufferBytes < 4<<10 {
		return keyErr("limits.answer_buffer_bytes", "%d is under 4KiB", c.Limits.AnswerBufferBytes)
	}
	if c.Limits.MaxHeaderBytes < 1<<10 || c.Limits.MaxHeaderBytes > 16<<20 {
		return keyErr("limits.max_header_bytes", "%d is outside 1KiB..16MiB", c.Limits.MaxHeaderBytes)
	}
	for key, d := range map[string]time.Duration{
		"limits.read_timeout": c.Limits.ReadTimeout, "limits.write_timeout": c.Limits.WriteTimeout,
		"limits.idle_timeout": c.Limits.IdleTimeout, "limits.connect_timeout": c.Limits.ConnectTimeout,
		"limits.first_byte_timeout": c.Limits.FirstByteTimeout, "limits.stream_idle_timeout": c.Limits.StreamIdleTimeout,
	} {
		if d <= 0 {
			return keyErr(key, "%v must be positive", d)
		}
	}
	seen := map[uint64]bool{}
	for i := range c.Workers {
		w := &c.Workers[i]
		if err := w.Normalize(); err != nil {
			var fe *dataplane.FieldError
			if errors.As(err, &fe) {
				return keyErr(fmt.Sprintf("workers[%d].%s", i, fe.Field), "%s", fe.Reason)
			}
			return keyErr(fmt.Sprintf("workers[%d]", i), "%v", err)
		}
		if seen[w.ID] {
			return keyErr(fmt.Sprintf("workers[%d].id", i), "duplicate id %d", w.ID)
		}
		seen[w.ID] = true
		if c.Router.Disaggregation.Protocol == DisaggSGLang && w.Role != dataplane.RoleDecode && w.BootstrapPort == 0 {
			return keyErr(fmt.Sprintf("workers[%d].bootstrap_port", i),
				"required: worker %d serves the prefill phase (role %s) under router.disaggregation.protocol %s", w.ID, w.Role, DisaggSGLang)
		}
	}
	return nil
}

func (d *Disaggregation) validate() error {
	switch d.Protocol {
	case DisaggOff, DisaggVLLM, DisaggSGLang:
	default:
		return keyErr("router.disaggregation.protocol", "%q is not off, %s or %s", d.Protocol, DisaggVLLM, DisaggSGLang)
	}
	for key, m := range map[string]pickers.Mode{"prefill_mode": d.PrefillMode, "decode_mode": d.DecodeMode} {
		if m == "" {
			continue
		}
		if _, err := pickers.ParseMode(string(m)); err != nil || m == pickers.ModeDirect {
			return keyErr("router.disaggregation."+key, "%q is not a mode that picks a worker (one of %v but direct)", m, pickers.Modes)
		}
	}
	if d.MinPrefillTokens < 0 {
		return keyErr("router.disaggregation.min_prefill_tokens", "%d is negative", d.MinPrefillTokens)
	}
	if d.MaxPrefillQueue < 0 {
		return keyErr("router.disaggregation.max_prefill_queue", "%d is negative", d.MaxPrefillQueue)
	}
	if d.MaxPrefillQueue > 0 && d.Protocol == DisaggSGLang {
		return keyErr("router.disaggregation.max_prefill_queue", "does not apply to %s: SGLang's decode servers take a prefill's transfer and cannot prefill a request themselves", DisaggSGLang)
	}
	if d.Fallback != FallbackAggr && d.Fallback != FallbackError {
		return keyErr("router.disaggregation.fallback", "%q is not %s or %s", d.Fallback, FallbackAggr, FallbackError)
	}
	return nil
}

// IsBaseURL reports an origin's form, http(s)://host[:port], and nothing
// else: what a replica's admin listener is named by.
func IsBaseURL(u string) bool { return u != "*" && isOrigin(u) }

// isOrigin reports "*" or an origin as a browser's Origin header names it:
// http or https, a host, maybe a port, and nothing else.
func isOrigin(o string) bool {
	if o == "*" {
		return true
	}
	u, err := url.Parse(o)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && u.User == nil &&
		u.Path == "" && u.RawQuery == "" && u.Fragment == "" && !u.ForceQuery && u.Scheme+"://"+u.Host == o
}
