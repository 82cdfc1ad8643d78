// Package lora tracks LoRA residency (adapter → workers holding it) and maps
// a request's model onto the adapter's worker group.
//
// A worker holds the adapters configured for it (or set later through the
// admin API, which replaces the configured list), those it lists in its
// /v1/models answer (entries with a parent model, refreshed with the health
// checks) and those its engine reports running or waiting
// (vllm:lora_requests_info, refreshed with the engine metrics). The registry asks the Residency for each worker's adapters when it
// publishes a snapshot, and builds one candidate group per adapter there, so
// the request path finds its candidates with one map lookup and picks among
// them as it would among all workers.
package lora

import (
	"slices"
	"strconv"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/puzpuzpuz/xsync/v3"
)

// Residency is the adapter → workers map of one registry.
type Residency struct {
	reg *dataplane.Registry
	set *xsync.MapOf[uint64, []string] // admin-set adapters, replacing the configured ones
}

// New returns the residency of reg and makes reg group workers by adapter.
func New(reg *dataplane.Registry) *Residency {
	r := &Residency{reg: reg, set: xsync.NewMapOf[uint64, []string]()}
	reg.SetGrouper(r)
	reg.Subscribe(func(w *dataplane.Worker, c dataplane.Change) {
		if c == dataplane.Removed {
			r.forget(w)
		}
	})
	return r
}

// Groups returns the adapters w holds, each once, sorted.
func (r *Residency) Groups(w *dataplane.Worker) []string {
	declared, ok := r.set.Load(w.ID())
	if !ok {
		declared = w.Spec().LoRAs
	}
	out := append(slices.Clone(declared), w.Advertised().Adapters...)
	if st := w.Engine(); st != nil {
		out = append(out, st.Adapters...) // running or waiting there (vllm:lora_requests_info)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Set replaces the adapters declared for worker id (admin API) and
// republishes, so new requests see the change at once.
func (r *Residency) Set(id uint64, adapters []string) error {
	if _, ok := r.reg.Get(id); !ok {
		return dataplane.Errorf(dataplane.NotFound, "unknown worker id %d", id)
	}
	for i, a := range adapters {
		if a == "" {
			return dataplane.Errorf(dataplane.InvalidArgument, "loras[%d]: empty adapter name", i)
		}
	}
	r.set.Store(id, slices.Clone(adapters))
	r.reg.Republish()
	return nil
}

// forget drops what was declared for a worker that left the registry.
func (r *Residency) forget(w *dataplane.Worker) { r.set.Delete(w.ID()) }

// Resolve maps a request's model onto its adapter group. It returns nil and
// no error when the model names no adapter: empty, a base model some worker
// lists, or any name while no worker has listed its base models yet
// (configured adapters alone do not tell which base models exist). A model no
// worker lists as a base model or adapter is a NotFound error naming it.
// It does not allocate unless it fails.
func (r *Residency) Resolve(snap *dataplane.Snapshot, model []byte) (*dataplane.Group, error) {
	if len(model) == 0 {
		return nil, nil
	}
	if g := snap.Group(model); g != nil {
		return g, nil
	}
	if snap.HasModel(model) || !snap.ListsModels() {
		return nil, nil
	}
	return nil, dataplane.Errorf(dataplane.NotFound,
		"model %s is neither a base model nor a LoRA adapter of any worker", strconv.Quote(string(model)))
}
