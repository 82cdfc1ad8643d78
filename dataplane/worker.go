package dataplane

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"path"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/fastroute/fastroute/lora"
	"github.com/fastroute/fastroute/telemetry/engine"
	"golang.org/x/sys/cpu"
)

// Device is the kind of hardware a worker runs on.
type Device string

// The device kinds of the config.
const (
	DeviceGPU Device = "gpu"
	DeviceCPU Device = "cpu"
)

// Role is the phases of a split (disaggregated) request a worker serves.
type Role string

// The roles of the config.
const (
	RoleBoth    Role = "both" // the default: either phase, or a whole request
	RolePrefill Role = "prefill"
	RoleDecode  Role = "decode"
)

// Phase is the part of a request one selection is for.
type Phase uint8

// The phases. PhaseAny is every request while disaggregation is off;
// PhaseDecode is also a whole (aggregated) request while it is on.
const (
	PhaseAny Phase = iota
	PhasePrefill
	PhaseDecode
)

func (p Phase) String() string { return [...]string{"any", "prefill", "decode"}[p] }

// serves reports whether a worker of role r may take phase p.
func (r Role) serves(p Phase) bool {
	switch p {
	case PhasePrefill:
		return r != RoleDecode
	case PhaseDecode:
		return r != RolePrefill
	}
	return true
}

// WorkerSpec is the static description of a worker, as configured.
type WorkerSpec struct {
	ID       uint64   `json:"id" yaml:"id"`
	URL      string   `json:"url" yaml:"url"`
	Device   Device   `json:"device" yaml:"device"`
	GPUIndex int      `json:"gpu_index" yaml:"gpu_index"`
	GPUUUID  string   `json:"gpu_uuid,omitempty" yaml:"gpu_uuid"`
	DPSize   int      `json:"dp_size" yaml:"dp_size"`
	Capacity float64  `json:"capacity" yaml:"capacity"`
	LoRAs    []string `json:"loras,omitempty" yaml:"loras"`
	// Models are base models the worker serves besides those its
	// /v1/models lists: known before its first probe, and for a worker
	// that lists none.
	Models []string `json:"models,omitempty" yaml:"models"`
	// MetricsPath is the engine's Prometheus endpoint (default /metrics).
	MetricsPath string `json:"metrics_path" yaml:"metrics_path"`
	// HealthPath is the path its health probes GET ("": the config's
	// health.path): engines of one fleet may answer on different ones
	// (Ollama has no /health; it answers on /api/version).
	HealthPath string `json:"health_path,omitempty" yaml:"health_path"`
	// MaxInflight caps the requests in flight on this worker, replacing
	// router.busy_threshold for it, and is the engine's batch size for the
	// load-aware cost (0: the threshold applies and the size is learned).
	MaxInflight int `json:"max_inflight,omitempty" yaml:"max_inflight"`
	// CgroupPath is a co-located CPU worker's cgroup v2 directory: its CPU
	// use there weighs it in device-aware-weighted mode.
	CgroupPath string `json:"cgroup_path,omitempty" yaml:"cgroup_path"`
	// Role is the phases of a disaggregated request the worker serves
	// (default both).
	Role Role `json:"role" yaml:"role"`
	// BootstrapPort is the KV bootstrap port of an SGLang prefill worker.
	BootstrapPort int `json:"bootstrap_port,omitempty" yaml:"bootstrap_port"`
	// Backup marks a worker that takes a request only when no other
	// candidate can (none routable, or every one at its in-flight cap), as
	// nginx's and HAProxy's backup servers: a CPU engine kept for when the
	// GPUs are full or down, a hosted endpoint for overflow. A request
	// that names it takes it, and a hard session pin stays on it.
	Backup bool `json:"backup,omitempty" yaml:"backup"`
	// MaxModelLen is the engine's context length in tokens (vLLM's
	// --max-model-len, SGLang's --context-length, llama.cpp's slot size):
	// a request it refuses as longer moves to a worker with a longer one.
	// 0: the context its /v1/models lists (Advertised.MaxModelLen), else
	// unknown.
	MaxModelLen int `json:"max_model_len,omitempty" yaml:"max_model_len"`
}

// Normalize fills defaults (cpu device, dp_size 1, capacity 1) and validates
// the spec. The error names the offending field.
func (s *WorkerSpec) Normalize() error {
	if s.ID == 0 {
		return fieldErr("id", "must be a positive integer")
	}
	if sock, ok := strings.CutPrefix(s.URL, "unix:"); ok {
		if !path.IsAbs(sock) || path.Clean(sock) != sock {
			return fieldErr("url", "%q is not unix:/absolute/path of a socket", s.URL)
		}
	} else if u, err := url.Parse(s.URL); err != nil {
		return fieldErr("url", "is not an http://host:port, https://host:port or unix:/path address: %v", errors.Unwrap(err))
	} else if shown := u.Redacted(); u.User != nil {
		return fieldErr("url", "%q holds credentials, which the router would not send (an engine's --api-key goes as worker_api_key)", shown)
	} else if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fieldErr("url", "%q is not an http://host:port, https://host:port or unix:/path address", shown)
	} else if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return fieldErr("url", "%q has more than %s://host:port; requests keep their own path (/v1/...), so a base path would be dropped", shown, u.Scheme)
	}
	switch s.Device {
	case "":
		s.Device = DeviceCPU
	case DeviceGPU, DeviceCPU:
	default:
		return fieldErr("device", "%q is not gpu or cpu", s.Device)
	}
	if s.GPUIndex < 0 {
		return fieldErr("gpu_index", "%d is negative", s.GPUIndex)
	}
	if s.DPSize == 0 {
		s.DPSize = 1
	}
	if s.DPSize < 0 || s.DPSize > 1024 {
		return fieldErr("dp_size", "%d is outside 1..1024", s.DPSize)
	}
	if s.Capacity == 0 {
		s.Capacity = 1
	}
	if !(s.Capacity > 0) || math.IsInf(s.Capacity, 0) {
		return fieldErr("capacity", "%v must be a positive number", s.Capacity)
	}
	if s.MetricsPath == "" {
		s.MetricsPath = "/metrics"
	}
	if !strings.HasPrefix(s.MetricsPath, "/") {
		return fieldErr("metrics_path", "%q must start with /", s.MetricsPath)
	}
	if s.HealthPath != "" && !strings.HasPrefix(s.HealthPath, "/") {
		return fieldErr("health_path", "%q must start with /", s.HealthPath)
	}
	if s.CgroupPath != "" && !strings.HasPrefix(s.CgroupPath, "/") {
		return fieldErr("cgroup_path", "%q must be an absolute directory", s.CgroupPath)
	}
	if s.MaxInflight < 0 {
		return fieldErr("max_inflight", "%d is negative (0: router.busy_threshold applies)", s.MaxInflight)
	}
	switch s.Role {
	case "":
		s.Role = RoleBoth
	case RoleBoth, RolePrefill, RoleDecode:
	default:
		return fieldErr("role", "%q is not prefill, decode or both", s.Role)
	}
	if s.BootstrapPort < 0 || s.BootstrapPort > 65535 {
		return fieldErr("bootstrap_port", "%d is outside 1..65535", s.BootstrapPort)
	}
	if s.MaxModelLen < 0 {
		return fieldErr("max_model_len", "%d is negative (0: the max_model_len the worker's /v1/models lists)", s.MaxModelLen)
	}
	if err := checkNames("models", "model", s.Models); err != nil {
		return err
	}
	return checkNames("loras", "adapter", s.LoRAs)
}

// checkNames checks the model or adapter names of a spec's field (or
// those the admin API declares): none empty, none with a control
// character, which the metrics page (a label value) and the logs would
// carry as it is.
func checkNames(field, what string, names []string) error {
	for i, n := range names {
		if n == "" {
			return fieldErr(fmt.Sprintf("%s[%d]", field, i), "an empty %s name", what)
		}
		if strings.ContainsFunc(n, unicode.IsControl) {
			return fieldErr(fmt.Sprintf("%s[%d]", field, i), "%s name %q holds a control character", what, n)
		}
	}
	return nil
}

// FieldError names the spec field at fault, so callers (the config's
// workers[i].<field>, the admin API) need not cut the message apart.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Host returns the host[:port] part of the worker URL as written, the
// Host header of its requests; localhost for a unix socket.
func (s *WorkerSpec) Host() string {
	if s.Socket() != "" {
		return "localhost"
	}
	u, _ := url.Parse(s.URL)
	return u.Host
}

// Address is the host:port a TCP worker's connections go to, the port its
// scheme's (80, 443) when the URL names none.
func (s *WorkerSpec) Address() string {
	u, _ := url.Parse(s.URL)
	if u.Port() != "" {
		return u.Host
	}
	if u.Scheme == "https" {
		return net.JoinHostPort(u.Hostname(), "443")
	}
	return net.JoinHostPort(u.Hostname(), "80")
}

// NameCacheTime is how long the addresses a worker URL's host name
// resolved to are used before the name is looked up again, by the proxy's
// connects and the health prober's: a worker that moved (a container or a
// pod restarted elsewhere) is reached at its new address within it, and
// its old one, which another engine may have taken, is left. fasthttp's
// own cache holds a name for a minute; Envoy refreshes its DNS every 5 s.
const NameCacheTime = 5 * time.Second

// Hostname is Host without its port.
func (s *WorkerSpec) Hostname() string {
	if s.Socket() != "" {
		return "localhost"
	}
	u, _ := url.Parse(s.URL)
	return u.Hostname()
}

// Socket is the path of the unix socket the worker listens on (its url
// is unix:/path), or "" for one reached over TCP.
func (s *WorkerSpec) Socket() string {
	if sock, ok := strings.CutPrefix(s.URL, "unix:"); ok {
		return sock
	}
	return ""
}

// BaseURL is where the router's own requests to the worker go (probes,
// model listings, engine metrics): its url, or http://localhost for a
// unix socket's, whose connections the clients dial to the socket.
func (s *WorkerSpec) BaseURL() string {
	if s.Socket() != "" {
		return "http://localhost"
	}
	return strings.TrimSuffix(s.URL, "/")
}

// TLS reports a worker spoken to over TLS: its url is https://.
func (s *WorkerSpec) TLS() bool {
	u, _ := url.Parse(s.URL)
	return u.Scheme == "https"
}

// occupancy holds a worker's hot counters, what the router itself sees of
// its engine, on a cache line of their own, so counters of different
// workers never share a line (no false sharing).
type occupancy struct {
	_      cpu.CacheLinePad
	n      atomic.Int64  // in flight
	served atomic.Uint64 // requests dispatched to it
	// relayed is the tokens of the answers relayed from it while its
	// engine gives no metrics and the router reads it itself
	// (Worker.CountsTokens).
	relayed atomic.Uint64
	// gaps and gapNanos are the gaps between two tokens of the streams
	// relayed from it meanwhile, and their time in all.
	gaps     atomic.Uint64
	gapNanos atomic.Int64
	_        cpu.CacheLinePad
}

// Worker is one inference server as the data plane sees it. Spec never
// changes after registration; the rest is live state read with atomics.
type Worker struct {
	// occ is shared with the worker a Replace of the same URL puts in
	// its place: the old spec's requests in flight run on the same engine
	// and count against the new one's cap until they end, and the tokens
	// relayed from it go on counting.
	occ     *occupancy
	spec    WorkerSpec
	healthy atomic.Bool
	// probation: it took the place of a worker at another URL (another
	// engine, Registry.Replace) and no probe has judged it yet.
	probation atomic.Bool
	draining  atomic.Bool
	down      atomic.Bool                // put out of rotation by hand (Registry.SetDown) until put back
	asleep    atomic.Bool                // its engine says it sleeps (vLLM's sleep mode)
	stalled   atomic.Bool                // its engine runs requests and generates nothing (engine.Stats.Stalled)
	weight    atomic.Uint64              // float64 bits of the telemetry weight
	dpNext    atomic.Uint64              // the next turn among tied ranks (leastLoadedRank)
	ranks     []atomic.Int64             // the requests in flight on each data-parallel rank (dp_size > 1; nil: none)
	adv       atomic.Pointer[Advertised] // what its /v1/models lists
	declared  atomic.Pointer[[]string]   // adapters set through the admin API; nil: the spec's
	engine    atomic.Pointer[engine.Stats]
	// countsTokens: its engine gives no metrics and the router reads it
	// itself (its last reading is engine.DialectRouter), counting the
	// tokens relayed from it in occ.relayed.
	countsTokens atomic.Bool
	// Passive health (outlier ejection), written as answers end.
	failStreak   atomic.Int32 // consecutive 5xx or transport failures
	ejections    atomic.Int32 // ejections since the last good answer
	ejectedUntil atomic.Int64 // unix nanoseconds; 0: in rotation
}

// Advertised is what a worker's /v1/models answer lists: base models, and
// LoRA adapters (the entries that name a parent model).
type Advertised struct {
	Models   []string `json:"models"`
	Adapters []string `json:"adapters"`
	// Entries are the worker's own /v1/models entries by id, as it wrote
	// them (created, max_model_len, root, parent...), passed through by the
	// router's /v1/models.
	Entries map[string]json.RawMessage `json:"-"`
	// Contexts are the context lengths its entries list by id (vLLM's and
	// SGLang's max_model_len, llama.cpp's per-slot meta.n_ctx); an entry
	// that lists none is absent.
	Contexts map[string]int `json:"-"`
	// MaxModelLen is the longest context its base models' entries list;
	// 0: none listed.
	MaxModelLen int `json:"max_model_len,omitempty"`
}

func newWorker(spec WorkerSpec) *Worker {
	w := &Worker{spec: spec, occ: new(occupancy)}
	if spec.DPSize > 1 {
		w.ranks = make([]atomic.Int64, spec.DPSize)
	}
	w.spec.LoRAs = slices.Clone(spec.LoRAs)
	w.healthy.Store(true)
	w.SetWeight(spec.Capacity)
	return w
}

// ID returns the worker id.
func (w *Worker) ID() uint64 { return w.spec.ID }

// Spec returns the static description (callers must not modify its slices).
func (w *Worker) Spec() *WorkerSpec { return &w.spec }

// Occupancy returns the number of requests holding a reservation on w.
func (w *Worker) Occupancy() int64 { return w.occ.n.Load() }

// Healthy reports the last health verdict.
func (w *Worker) Healthy() bool { return w.healthy.Load() }

// OnProbation reports that w names another engine than the worker whose
// place it took (another URL), which no probe has judged yet: it keeps
// that worker's verdict until its first probe, and a failed one takes it
// out of rotation at once (health.Checker).
func (w *Worker) OnProbation() bool { return w.probation.Load() }

// Draining reports whether w takes no new requests.
func (w *Worker) Draining() bool { return w.draining.Load() }

// Down reports whether w was put out of rotation by hand (Registry.SetDown):
// it keeps its requests in flight, its probes and its engine's readings,
// and takes no new request until it is put back.
func (w *Worker) Down() bool { return w.down.Load() }

// Asleep reports whether w's engine last said it sleeps (vLLM's sleep
// mode: its weights or KV cache off the GPU until it is woken up).
func (w *Worker) Asleep() bool { return w.asleep.Load() }

// Stalled reports whether w's engine last showed requests running and no
// token generated for telemetry.engine.stall_after: taken to be hung.
func (w *Worker) Stalled() bool { return w.stalled.Load() }

// Routable reports healthy, not draining, not down, not ejected, not
// asleep and not stalled.
func (w *Worker) Routable() bool {
	return w.healthy.Load() && !w.draining.Load() && !w.down.Load() && w.ejectedUntil.Load() == 0 && !w.asleep.Load() && !w.stalled.Load()
}

// unroutable names why w is out of rotation: the first of "unhealthy",
// "draining", "down", "ejected", "asleep" and "stalled" that holds, ""
// when none does.
func (w *Worker) unroutable() string {
	switch {
	case !w.healthy.Load():
		return "unhealthy"
	case w.draining.Load():
		return "draining"
	case w.down.Load():
		return "down"
	case w.ejectedUntil.Load() != 0:
		return "ejected"
	case w.asleep.Load():
		return "asleep"
	case w.stalled.Load():
		return "stalled"
	}
	return ""
}

// Ejected returns when an ejected worker returns to rotation (zero: it is
// not ejected), and how many times in a row it was ejected.
func (w *Worker) Ejected() (until time.Time, ejections int) {
	if u := w.ejectedUntil.Load(); u != 0 {
		until = time.Unix(0, u)
	}
	return until, int(w.ejections.Load())
}

// Weight returns the telemetry weight (static capacity until telemetry runs).
func (w *Worker) Weight() float64 { return math.Float64frombits(w.weight.Load()) }

// SetWeight stores a new telemetry weight; it reaches pickers with the next
// snapshot the registry publishes.
func (w *Worker) SetWeight(v float64) {
	if !(v >= 0) {
		v = 0
	}
	w.weight.Store(math.Float64bits(v))
}

// ContextLen returns w's context length in tokens: its spec's
// max_model_len, else the one its /v1/models lists; 0: unknown.
func (w *Worker) ContextLen() int {
	if w.spec.MaxModelLen > 0 {
		return w.spec.MaxModelLen
	}
	if a := w.adv.Load(); a != nil {
		return a.MaxModelLen
	}
	return 0
}

// Served returns how many requests were dispatched to w since it
// registered (query-only picks are not).
func (w *Worker) Served() uint64 { return w.occ.served.Load() }

// Advertised returns what w last listed in /v1/models (zero before the first probe).
func (w *Worker) Advertised() Advertised {
	if p := w.adv.Load(); p != nil {
		return *p
	}
	return Advertised{}
}

// SetAdvertised records what w lists and reports whether it changed.
func (w *Worker) SetAdvertised(a Advertised) bool {
	if old := w.adv.Load(); old != nil && slices.Equal(old.Models, a.Models) && slices.Equal(old.Adapters, a.Adapters) {
		if a.Entries != nil {
			w.adv.Store(&a) // same routing, fresher fields
		}
		return false
	}
	w.adv.Store(&a)
	return true
}

// Engine returns what the worker's engine last said of its load, or nil
// when there is no fresh reading.
func (w *Worker) Engine() *engine.Stats { return w.engine.Load() }

// SetEngine stores a copy of the engine's latest Stats (nil: none fresh),
// stamped with the worker's occupancy now (or as its scrape left, when
// larger: Stats.Occupancy) so later dispatches count on top.
// It reports whether the worker's routing changed: the adapters the engine
// runs, or whether it sleeps or stalled (the registry must republish for
// its LoRA groups and its candidates to follow). A worker without a fresh
// reading is taken neither to sleep nor to have stalled: its health
// probes judge it then.
func (w *Worker) SetEngine(st *engine.Stats) (routingChanged bool) {
	var before []string
	if old := w.engine.Load(); old != nil {
		before = old.Adapters
	}
	asleep, stalled := st != nil && st.Asleep, st != nil && st.Stalled
	changed := w.asleep.Swap(asleep) != asleep
	changed = w.stalled.Swap(stalled) != stalled || changed
	if st == nil {
		w.engine.Store(nil)
		return changed || len(before) > 0
	}
	w.countsTokens.Store(st.Dialect == engine.DialectRouter)
	cp := *st
	cp.Prepare(w.occ.n.Load())
	w.engine.Store(&cp)
	return changed || !slices.Equal(before, st.Adapters)
}

// CountsTokens reports whether the router reads w's load itself, its
// engine giving no metrics: the front end then counts the tokens of the
// answers it relays from w (AddRelayedTokens).
func (w *Worker) CountsTokens() bool { return w.countsTokens.Load() }

// AddRelayedTokens counts n more tokens relayed from w (CountsTokens).
func (w *Worker) AddRelayedTokens(n int64) {
	if n > 0 {
		w.occ.relayed.Add(uint64(n))
	}
}

// AddRelayedGaps counts n more gaps between two tokens of a stream relayed
// from w (CountsTokens), spanning d in all.
func (w *Worker) AddRelayedGaps(n int64, d time.Duration) {
	if n > 0 && d >= 0 {
		w.occ.gaps.Add(uint64(n))
		w.occ.gapNanos.Add(int64(d))
	}
}

// Relayed returns what the router sees of w: its requests in flight, the
// tokens relayed from it while it CountsTokens, and the gaps between two
// tokens of those streams and their time in all (counters): the router's
// own reading of an engine that gives no metrics, whose speed the gaps
// give at once (engine.Target.Relayed).
func (w *Worker) Relayed() engine.RelayedCounts {
	return engine.RelayedCounts{InFlight: w.occ.n.Load(), Tokens: w.occ.relayed.Load(),
		Gaps: w.occ.gaps.Load(), Spanned: time.Duration(w.occ.gapNanos.Load())}
}

// Adapters returns the LoRA adapters w holds, each once, sorted: those
// declared for it (the admin API's list, else its spec's), those it lists
// in /v1/models and those its engine runs.
func (w *Worker) Adapters() []string {
	declared := w.DeclaredAdapters()
	var running []string
	if st := w.engine.Load(); st != nil {
		running = st.Adapters
	}
	return lora.Held(declared, w.Advertised().Adapters, running)
}

// DeclaredAdapters returns the LoRA adapters declared for w: the admin
// API's list (Registry.SetAdapters), else its spec's.
func (w *Worker) DeclaredAdapters() []string {
	if d := w.declared.Load(); d != nil {
		return *d
	}
	return w.spec.LoRAs
}

// Models returns the base models the worker serves, each once, sorted:
// those declared for it and those it lists.
func (w *Worker) Models() []string {
	return lora.Held(w.spec.Models, w.Advertised().Models, nil)
}

// leastLoadedRank returns the data-parallel rank for a request that names
// none: one with the fewest of the router's requests in flight, ties taken
// in turn (each call draws the next turn, so calls at the same moment
// spread over the tied ranks, and the idle ranks beside a busy one share
// its overflow evenly: a search that started one rank further each time
// took the rank after the busy one twice as often as the others). The
// engine gets it in its rank header, which overrides the balancing of its
// own front end (vLLM's, SGLang's), so it had better weigh the ranks' load.
func (w *Worker) leastLoadedRank() int {
	n := len(w.ranks)
	if n == 0 {
		return 0
	}
	turn := w.dpNext.Add(1) - 1
	least, ties := int64(math.MaxInt64), uint64(0)
	for i := range w.ranks {
		switch v := w.ranks[i].Load(); {
		case v < least:
			least, ties = v, 1
		case v == least:
			ties++
		}
	}
	k := turn % ties
	for i := range w.ranks {
		if w.ranks[i].Load() == least {
			if k == 0 {
				return i
			}
			k--
		}
	}
	return int(turn % uint64(n)) // the counts moved between the two passes
}

// RankOccupancy returns the requests in flight on each data-parallel
// rank of w (nil without ranks).
func (w *Worker) RankOccupancy() []int64 {
	if len(w.ranks) == 0 {
		return nil
	}
	out := make([]int64, len(w.ranks))
	for i := range w.ranks {
		out[i] = w.ranks[i].Load()
	}
	return out
}

// tryAcquire takes one in-flight slot unless that would pass limit (0 = none).
func (w *Worker) tryAcquire(limit int64) bool {
	n := w.occ.n.Add(1)
	if limit > 0 && n > limit {
		w.occ.n.Add(-1)
		return false
	}
	return true
}

// free reports whether w can take one more request under limit.
func (w *Worker) free(limit int64) bool {
	return limit <= 0 || w.occ.n.Load() < limit
}
