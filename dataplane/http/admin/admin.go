// Package admin serves fastroute's admin listener: Prometheus metrics,
// pprof, and the worker registry (list, register, put down, drain). With a
// token set every route needs it (GET /metrics may be left open to
// scrapers); every write is logged. It runs on net/http, off the request
// path.
package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/apikeys"
	"github.com/fastroute/fastroute/dataplane/loops/prefixshare"
	"github.com/fastroute/fastroute/dataplane/metrics"
	"github.com/fastroute/fastroute/internal/bearer"
)

// WorkerInfo is how GET /workers shows one worker.
type WorkerInfo struct {
	dataplane.WorkerSpec
	Healthy  bool `json:"healthy"`
	Draining bool `json:"draining"`
	// Down is set while the worker is out of rotation by hand (PATCH
	// /workers/{id} {"down":true}) until put back.
	Down      bool  `json:"down"`
	Occupancy int64 `json:"occupancy"`
	// RankOccupancy is the requests in flight on each data-parallel rank
	// (dp_size > 1).
	RankOccupancy []int64 `json:"rank_occupancy,omitempty"`
	Served        uint64  `json:"served"`
	Weight        float64 `json:"weight"`
	// Ejected is set while the passive health check keeps the worker out
	// of rotation, for EjectedForSeconds more; Ejections counts its
	// ejections since its last good answer.
	Ejected           bool    `json:"ejected"`
	EjectedForSeconds float64 `json:"ejected_for_seconds,omitempty"`
	Ejections         int     `json:"ejections"`
	// Asleep is set while the worker's engine says it sleeps (vLLM's sleep
	// mode), which keeps it out of rotation until it says it is awake.
	Asleep bool `json:"asleep"`
	// Stalled is set while the worker's engine shows requests running and
	// no token generated for telemetry.engine.stall_after, which keeps it
	// out of rotation until it generates again or runs nothing.
	Stalled bool `json:"stalled"`
	// ContextLength is the context routing takes the worker to have: its
	// spec's max_model_len, else the one it lists (0, absent: unknown).
	ContextLength int `json:"context_length,omitempty"`
	// Listed is what the worker's /v1/models lists: base models and
	// adapters (the spec's models and loras are the declared ones).
	Listed dataplane.Advertised `json:"listed"`
	// ServedModels is every base model the worker serves: declared and
	// listed.
	ServedModels []string `json:"served_models"`
	// ResidentLoRAs is every adapter the worker holds: declared, listed
	// and run by its engine.
	ResidentLoRAs []string `json:"resident_loras"`
}

// ErrPrefixAffinityOff is what Options.LearnPrefixes returns while prefix
// affinity is off: POST /prefixes answers 409.
var ErrPrefixAffinityOff = errors.New("prefix affinity is off on this router")

// Options configures the admin handler.
type Options struct {
	Registry *dataplane.Registry
	Metrics  *metrics.Set
	Token    *bearer.Token // bearer token every route needs (a reload may change it); nil or empty: open
	// MetricsPublic, while set, leaves GET /metrics open when a token is
	// set (a reload may change it); nil: never.
	MetricsPublic *atomic.Bool
	Logger        *slog.Logger // admin writes are logged here (default slog.Default)
	// Describe adds fields to a worker's JSON (telemetry age, say); may be nil.
	Describe func(w *dataplane.Worker, info map[string]any)
	// Reload reads and applies the config again (POST /config/reload);
	// may be nil.
	Reload func() (applied, needRestart []string, err error)
	// Config writes the running config, its secrets redacted, as YAML
	// (GET /config); may be nil.
	Config func() ([]byte, error)
	// Probe starts a health probe of a worker just added (a registered
	// worker is routable once one passes); may be nil.
	Probe func(id uint64)
	// Changed is called after each write that changed the workers: one
	// added, one drained, adapters declared; may be nil.
	Changed func()
	// Drain drains a worker (DELETE /workers/{id}); nil: Registry.Drain.
	// An error for a registered worker answers 503.
	Drain func(id uint64) error
	// SetDown puts a worker down or back (PATCH /workers/{id} "down") and
	// says whether that changed it; nil: Registry.SetDown. An
	// UnavailableError answers 503.
	SetDown func(id uint64, down bool) (changed bool, err error)
	// LearnPrefixes takes in a peer replica's prefix records (POST
	// /prefixes, affinity.AppendPrefixRecord's format) and says how many
	// it read; nil, or ErrPrefixAffinityOff, while prefix affinity is off
	// (409).
	LearnPrefixes func(records []byte) (int, error)
	// APIKeys are the clients' keys GET /api_keys describes (their names,
	// options and counts, never a key); nil or off: an empty list.
	APIKeys *apikeys.Keys
	// WritesRefused, while it says why (not empty), has the routes that
	// change the router (every method but GET and HEAD, a peer's POST
	// /prefixes aside) answer 503 with Retry-After and that reason: an
	// upgrade's old process, whose changes the new one would not have;
	// may be nil.
	WritesRefused func() string
}

// Handler returns the admin handler: the routes behind the token check and
// the write log.
func Handler(o Options) http.Handler {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o.logWrites(o.guard(o.refuseWrites(jsonRefusals(routes(o)))))
}

// refuseWrites answers a write 503 while WritesRefused says why.
func (o Options) refuseWrites(h http.Handler) http.Handler {
	if o.WritesRefused == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead && r.URL.Path != prefixshare.Path {
			if why := o.WritesRefused(); why != "" {
				w.Header().Set("Retry-After", "1")
				writeError(w, http.StatusServiceUnavailable, why)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// jsonRefusals answers the mux's own refusals (no route for the path: 404;
// a route for other methods: 405, with its Allow header) as every other
// admin error is answered, in JSON, instead of net/http's plain text: a
// script reading the admin API parses every error the same way.
func jsonRefusals(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := mux.Handler(r); pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(&refusal{ResponseWriter: w, r: r}, r)
	})
}

// refusal writes a 404 or 405 of the mux in JSON and drops the mux's text;
// any other answer (a redirect to a path with its trailing slash) passes.
type refusal struct {
	http.ResponseWriter
	r       *http.Request
	refused bool
}

func (f *refusal) WriteHeader(code int) {
	var msg string
	switch code {
	case http.StatusNotFound: // the path is not quoted back
		msg = "no admin route has this path"
	case http.StatusMethodNotAllowed:
		msg = fmt.Sprintf("method %s is not allowed on this path; allowed: %s", f.r.Method, f.Header().Get("Allow"))
	default:
		f.ResponseWriter.WriteHeader(code)
		return
	}
	f.refused = true
	writeError(f.ResponseWriter, code, msg)
}

func (f *refusal) Write(p []byte) (int, error) {
	if f.refused {
		return len(p), nil // the mux's text, answered in JSON instead
	}
	return f.ResponseWriter.Write(p)
}

func routes(o Options) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = o.Metrics.WriteTo(w)
	})
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("GET /workers", func(w http.ResponseWriter, _ *http.Request) {
		out := []byte{'['}
		for i, wk := range o.Registry.All() {
			if i > 0 {
				out = append(out, ',')
			}
			out = append(out, o.workerJSON(wk)...)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(append(out, "]\n"...))
	})
	mux.HandleFunc("GET /api_keys", o.serveAPIKeys)
	mux.HandleFunc("GET /workers/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, ok := pathID(w, r)
		if !ok {
			return
		}
		wk, ok := o.Registry.Get(id)
		if !ok {
			writeError(w, http.StatusNotFound, fmt.Sprintf("unknown worker id %d", id))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(append(o.workerJSON(wk), '\n'))
	})
	mux.HandleFunc("POST /workers", func(w http.ResponseWriter, r *http.Request) {
		var spec dataplane.WorkerSpec
		if status, err := decodeBody(w, r, &spec); err != nil {
			writeError(w, status, "invalid worker JSON: "+err.Error())
			return
		}
		wk, err := o.Registry.AddUnprobed(spec)
		if err != nil {
			status := http.StatusBadRequest
			var dup *dataplane.DuplicateError
			if errors.As(err, &dup) {
				status = http.StatusConflict
			}
			writeError(w, status, err.Error())
			return
		}
		if o.Probe != nil {
			o.Probe(wk.ID())
		}
		o.changed()
		writeJSON(w, http.StatusCreated, wk.Spec())
	})
	mux.HandleFunc("PUT /workers/{id}/loras", func(w http.ResponseWriter, r *http.Request) {
		id, ok := pathID(w, r)
		if !ok {
			return
		}
		var body struct {
			LoRAs []string `json:"loras"`
		}
		status, err := decodeBody(w, r, &body)
		if err == nil && body.LoRAs == nil {
			status, err = http.StatusBadRequest, errors.New(`no "loras"`)
		}
		if err != nil {
			writeError(w, status, `want {"loras":["adapter",...]} (`+err.Error()+")")
			return
		}
		if err := o.Registry.SetAdapters(id, body.LoRAs); err != nil {
			status := http.StatusBadRequest
			if errors.Is(err, dataplane.ErrNotFound) {
				status = http.StatusNotFound
			}
			writeError(w, status, err.Error())
			return
		}
		o.changed()
		writeJSON(w, http.StatusOK, map[string]any{"id": id, "loras": body.LoRAs})
	})
	mux.HandleFunc("PATCH /workers/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, ok := pathID(w, r)
		if !ok {
			return
		}
		var patch workerPatch
		status, err := decodeBody(w, r, &patch)
		if err == nil && patch == (workerPatch{}) {
			status, err = http.StatusBadRequest, errors.New("nothing to change")
		}
		if err != nil {
			writeError(w, status, "want an object of one or more of "+patchable+" ("+err.Error()+")")
			return
		}
		changed, err := o.Registry.Update(id, patch.apply)
		if err == nil && patch.Down != nil {
			setDown := o.Registry.SetDown
			if o.SetDown != nil {
				setDown = o.SetDown
			}
			var down bool
			down, err = setDown(id, *patch.Down)
			changed = changed || down
		}
		if changed {
			o.changed()
		}
		if err != nil {
			status := http.StatusBadRequest
			if errors.Is(err, dataplane.ErrNotFound) {
				status = http.StatusNotFound
			} else if _, draining := errors.AsType[*dataplane.DrainingError](err); draining {
				status = http.StatusConflict
			} else if _, unavailable := errors.AsType[*UnavailableError](err); unavailable {
				status = http.StatusServiceUnavailable
			}
			writeError(w, status, err.Error())
			return
		}
		wk, ok := o.Registry.Get(id)
		if !ok { // drained and swept meanwhile
			writeError(w, http.StatusNotFound, fmt.Sprintf("unknown worker id %d", id))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(append(o.workerJSON(wk), '\n'))
	})
	mux.HandleFunc("GET /config", func(w http.ResponseWriter, _ *http.Request) {
		if o.Config == nil {
			writeError(w, http.StatusNotImplemented, "the running config is not available")
			return
		}
		b, err := o.Config()
		if err != nil {
			writeError(w, http.StatusInternalServerError, "the running config: "+err.Error())
			return
		}
		w.Header().Set("Content-Type", "application/yaml")
		_, _ = w.Write(b)
	})
	mux.HandleFunc("POST /config/reload", func(w http.ResponseWriter, _ *http.Request) {
		if o.Reload == nil {
			writeError(w, http.StatusNotImplemented, "config reload is not available")
			return
		}
		applied, needRestart, err := o.Reload()
		if err != nil {
			writeError(w, http.StatusBadRequest, "config reload refused, the running config stays: "+err.Error())
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"applied": nonNil(applied), "need_restart": nonNil(needRestart)})
	})
	mux.HandleFunc("POST "+prefixshare.Path, func(w http.ResponseWriter, r *http.Request) {
		if o.LearnPrefixes == nil {
			writeError(w, http.StatusConflict, ErrPrefixAffinityOff.Error())
			return
		}
		records, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxWriteBody))
		if _, tooLarge := errors.AsType[*http.MaxBytesError](err); tooLarge {
			writeError(w, http.StatusRequestEntityTooLarge, "prefix records larger than 1 MiB")
			return
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, "reading the prefix records: "+err.Error())
			return
		}
		if _, err := o.LearnPrefixes(records); errors.Is(err, ErrPrefixAffinityOff) {
			writeError(w, http.StatusConflict, err.Error())
			return
		} else if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("DELETE /workers/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, ok := pathID(w, r)
		if !ok {
			return
		}
		drain := o.Registry.Drain
		if o.Drain != nil {
			drain = o.Drain
		}
		if err := drain(id); err != nil {
			status := http.StatusNotFound
			if _, ok := o.Registry.Get(id); ok {
				status = http.StatusServiceUnavailable
			}
			writeError(w, status, err.Error())
			return
		}
		o.changed()
		writeJSON(w, http.StatusAccepted, map[string]any{"id": id, "draining": true})
	})
	return mux
}

// UnavailableError is a change made on this router only, where it should
// have reached every router (etcd did not answer): a 503 saying so.
type UnavailableError struct{ Msg string }

func (e *UnavailableError) Error() string { return e.Msg }

// workerPatch is a PATCH /workers/{id} body: a worker put down or back,
// and the settings of its spec that change how it is routed to, not which
// engine it is (its URL, device, dp_size or ports make another worker:
// DELETE, then POST /workers).
type workerPatch struct {
	Down        *bool           `json:"down"`
	MaxInflight *int            `json:"max_inflight"`
	Capacity    *float64        `json:"capacity"`
	Backup      *bool           `json:"backup"`
	MaxModelLen *int            `json:"max_model_len"`
	Role        *dataplane.Role `json:"role"`
}

// patchable names workerPatch's fields for its refusals.
const patchable = "down, max_inflight, capacity, backup, max_model_len, role"

// apply sets the spec fields the patch names.
func (p workerPatch) apply(s *dataplane.WorkerSpec) {
	set(&s.MaxInflight, p.MaxInflight)
	set(&s.Capacity, p.Capacity)
	set(&s.Backup, p.Backup)
	set(&s.MaxModelLen, p.MaxModelLen)
	set(&s.Role, p.Role)
}

// set sets *field to *v when v is not nil.
func set[T any](field *T, v *T) {
	if v != nil {
		*field = *v
	}
}

// changed tells of a write that changed the workers (Options.Changed).
func (o Options) changed() {
	if o.Changed != nil {
		o.Changed()
	}
}

// maxWriteBody bounds the body of an admin write.
const maxWriteBody = 1 << 20

// decodeBody reads r's body, at most maxWriteBody bytes, as one JSON
// object into v, refusing fields v does not have; only blanks may follow
// the object (a second one is not dropped unread). status answers a body it
// refused: 413 past the bound, else 400.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) (status int, err error) {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxWriteBody))
	dec.DisallowUnknownFields()
	trailing := false
	if err = dec.Decode(v); err == nil {
		if _, err = dec.Token(); err == io.EOF {
			return 0, nil
		}
		trailing = true
	}
	switch _, tooLarge := errors.AsType[*http.MaxBytesError](err); {
	case tooLarge:
		return http.StatusRequestEntityTooLarge, errors.New("body larger than 1 MiB")
	case trailing:
		return http.StatusBadRequest, errors.New("want one JSON object, and nothing after it but blanks")
	}
	return http.StatusBadRequest, err
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// pathID reads the {id} of a path, answering 400 when it is not a number.
func pathID(w http.ResponseWriter, r *http.Request) (uint64, bool) {
	id, err := strconv.ParseUint(r.PathValue("id"), 10, 64)
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("worker id %q is not an unsigned integer", r.PathValue("id")))
		return 0, false
	}
	return id, true
}

// guard refuses every request without the bearer token while one is set
// (GET /metrics too, unless MetricsPublic). The comparison takes constant
// time.
func (o Options) guard(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		open := !o.Token.IsSet() || o.MetricsPublic != nil && o.MetricsPublic.Load() && r.URL.Path == "/metrics" && (r.Method == http.MethodGet || r.Method == http.MethodHead)
		if !open && !o.Token.Matches([]byte(r.Header.Get("Authorization"))) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="fastroute-admin"`)
			writeError(w, http.StatusUnauthorized, "the admin listener needs Authorization: Bearer <admin token>")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// statusWriter remembers the status a handler wrote.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

// logWrites logs every request that may change state (any method but GET
// and HEAD), refused ones included: who, what and the answer.
func (o Options) logWrites(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			h.ServeHTTP(w, r)
			return
		}
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(sw, r)
		if r.URL.Path == prefixshare.Path && sw.status == http.StatusNoContent {
			return // a peer's records, every few milliseconds: counted, not logged
		}
		o.Logger.Info("admin write", "method", r.Method, "path", r.URL.Path, "status", sw.status, "remote", r.RemoteAddr)
	})
}

// workerJSON is one worker of GET /workers: its WorkerInfo and the fields
// Describe adds, one object, each part marshalled once.
func (o Options) workerJSON(wk *dataplane.Worker) []byte {
	until, ejections := wk.Ejected()
	b, _ := json.Marshal(WorkerInfo{
		WorkerSpec: *wk.Spec(), Healthy: wk.Healthy(), Draining: wk.Draining(), Down: wk.Down(),
		Occupancy: wk.Occupancy(), RankOccupancy: wk.RankOccupancy(), Served: wk.Served(), Weight: wk.Weight(),
		Ejected: !until.IsZero(), EjectedForSeconds: max(time.Until(until).Seconds(), 0), Ejections: ejections,
		Asleep: wk.Asleep(), Stalled: wk.Stalled(), ContextLength: wk.ContextLen(), Listed: wk.Advertised(), ServedModels: wk.Models(), ResidentLoRAs: wk.Adapters(),
	})
	if o.Describe == nil {
		return b
	}
	extra := map[string]any{}
	o.Describe(wk, extra)
	e, err := json.Marshal(extra)
	if err != nil { // a value JSON cannot hold (NaN, say): left out, the others kept
		for k, v := range extra {
			if _, err := json.Marshal(v); err != nil {
				delete(extra, k)
			}
		}
		e, _ = json.Marshal(extra)
	}
	if len(extra) == 0 {
		return b
	}
	return append(append(b[:len(b)-1], ','), e[1:]...)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": "admin_error", "code": status}})
}
