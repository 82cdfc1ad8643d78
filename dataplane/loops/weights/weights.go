// Package weights turns device telemetry into the worker weights of the
// device-aware-weighted mode. One goroutine refreshes every Source (GPU,
// CPU) each interval, asks the source that measures each worker for its
// weight, stores it on the worker and republishes the registry snapshot
// once; the request path only reads the published weights.
package weights

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/metrics"
	"github.com/fastroute/fastroute/internal/every"
)

// StaleAfter is how many poll periods a reading stays valid; an older one
// decays the weight to the worker's static capacity.
const StaleAfter = 3

// MinShare is the smallest share of its capacity a worker's weight falls to,
// so a saturated device still gets a trickle and the total never reaches 0.
const MinShare = 0.01

// Source is one kind of telemetry that weighs workers. The loop refreshes
// every source on its tick, then asks the source that measures each worker
// for its weight; a worker no source measures keeps its static capacity. A
// new kind of telemetry is one Source and the config key that adds it.
type Source interface {
	// Name labels the source in logs ("gpu", "cpu").
	Name() string
	// Measures reports whether the source weighs a worker of spec s.
	Measures(s *dataplane.WorkerSpec) bool
	// Refresh takes one reading as of now: of the devices, and of the
	// workers it measures among workers.
	Refresh(now time.Time, workers []*dataplane.Worker) error
	// Weigh returns the weight of a worker the source measures and the
	// time of the reading it comes from, or why there is no usable
	// reading (the worker keeps its static capacity). A reading from
	// before staleBefore is not usable.
	Weigh(s *dataplane.WorkerSpec, staleBefore time.Time) (weight float64, at time.Time, static string)
	// Collect writes the last reading as metrics.
	Collect(w *metrics.Writer)
}

// Options configures a Loop.
type Options struct {
	Registry *dataplane.Registry
	Sources  []Source
	Interval time.Duration
	Logger   *slog.Logger
	// Fallbacks counts the workers' falls back to static capacity (the
	// zero Counter: one of the Loop's own), so that a count can go on
	// across the loops a process runs one after another.
	Fallbacks metrics.Counter
}

// Origin says where a worker's weight came from.
type Origin struct {
	Static bool      // true: static capacity (no usable reading)
	Reason string    // why it is static ("" when from telemetry)
	At     time.Time // time of the reading used (zero when static)
}

func clamp01(v float64) float64 { return min(max(v, 0), 1) }

// Loop owns the weight computation. Tick and Run are meant for one goroutine;
// Describe and the metrics collector may run concurrently with them.
type Loop struct {
	opts  Options
	every *every.Period // Options.Interval as it is now (SetInterval)

	mu        sync.Mutex // guards origins; never taken on the request path
	origins   map[uint64]Origin
	fallbacks metrics.Counter // transitions of a worker to its static capacity (Options.Fallbacks)
	errs      []string        // each source's last refresh error, logged once per change; Tick's alone
}

// New returns a Loop; Run (or Tick) starts the refreshing.
func New(o Options) *Loop {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Interval <= 0 {
		o.Interval = 250 * time.Millisecond
	}
	if o.Fallbacks == (metrics.Counter{}) {
		o.Fallbacks = metrics.NewCounter()
	}
	return &Loop{opts: o, every: every.NewPeriod(o.Interval), origins: map[uint64]Origin{}, errs: make([]string, len(o.Sources)), fallbacks: o.Fallbacks}
}

// Run ticks every Interval until ctx ends.
func (l *Loop) Run(ctx context.Context) {
	l.every.Loop(ctx, func() { l.Tick(time.Now()) })
}

// SetInterval changes Options.Interval (a reload): the next tick comes d
// from now (every.Period), and a reading goes stale after StaleAfter new
// intervals.
func (l *Loop) SetInterval(d time.Duration) { l.every.Set(d) }

// Tick refreshes the sources, recomputes every worker's weight as of now
// and republishes the registry snapshot.
func (l *Loop) Tick(now time.Time) {
	workers := l.opts.Registry.All()
	for i, src := range l.opts.Sources {
		l.noteErr(&l.errs[i], src.Name(), src.Refresh(now, workers))
	}
	staleBefore := now.Add(-StaleAfter * l.every.Get())
	l.mu.Lock()
	// A fresh map: workers that left the registry drop out of it.
	next := make(map[uint64]Origin, len(workers))
	for _, w := range workers {
		weight, origin := l.weigh(w.Spec(), staleBefore)
		w.SetWeight(weight)
		next[w.ID()] = origin
		l.transition(w.ID(), origin)
	}
	l.origins = next
	l.mu.Unlock()
	l.opts.Registry.Republish()
}

// weigh computes one worker's weight and says where it came from.
func (l *Loop) weigh(s *dataplane.WorkerSpec, staleBefore time.Time) (float64, Origin) {
	for _, src := range l.opts.Sources {
		if !src.Measures(s) {
			continue
		}
		weight, at, static := src.Weigh(s, staleBefore)
		if static != "" {
			return s.Capacity, Origin{Static: true, Reason: static}
		}
		return weight, Origin{At: at}
	}
	return s.Capacity, Origin{Static: true, Reason: string(s.Device) + " telemetry is off"}
}

// transition counts and logs, once, each change of a worker's source to or
// between static reasons, comparing with the previous tick's sources.
func (l *Loop) transition(id uint64, src Origin) {
	prev, known := l.origins[id]
	if known && prev.Static == src.Static && prev.Reason == src.Reason {
		return
	}
	if src.Static {
		l.fallbacks.Inc()
		l.opts.Logger.Warn("worker weight falls back to static capacity", "worker", id, "reason", src.Reason)
	} else if known {
		l.opts.Logger.Info("worker weight follows telemetry again", "worker", id)
	}
}

func (l *Loop) noteErr(last *string, what string, err error) {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if msg != *last && msg != "" {
		l.opts.Logger.Warn("telemetry refresh failed", "collector", what, "err", msg)
	}
	*last = msg
}

// Origin returns where worker id's weight came from at the last Tick.
func (l *Loop) Origin(id uint64) (Origin, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	o, ok := l.origins[id]
	return o, ok
}

// Describe adds the weight source and telemetry age to GET /workers.
func (l *Loop) Describe(w *dataplane.Worker, info map[string]any) {
	src, ok := l.Origin(w.ID())
	if !ok {
		return
	}
	if src.Static {
		info["weight_source"] = "static"
		info["weight_static_reason"] = src.Reason
		return
	}
	info["weight_source"] = "telemetry"
	info["telemetry_age_seconds"] = time.Since(src.At).Seconds()
}

// Collector exports every source's readings and the fallback counts.
func (l *Loop) Collector() metrics.Collector {
	return func(w *metrics.Writer) {
		for _, src := range l.opts.Sources {
			src.Collect(w)
		}
		l.mu.Lock()
		static := 0
		for _, o := range l.origins {
			if o.Static {
				static++
			}
		}
		l.mu.Unlock()
		w.Header("fastroute_telemetry_static_workers", "gauge", "Workers whose weight is their static capacity for want of a fresh reading.")
		w.Sample("fastroute_telemetry_static_workers", float64(static))
		w.Header("fastroute_telemetry_fallbacks_total", "counter", "Times a worker's weight fell back to its static capacity.")
		w.Sample("fastroute_telemetry_fallbacks_total", float64(l.fallbacks.Value()))
	}
}
