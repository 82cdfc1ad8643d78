// Package lora holds the rules of LoRA routing, apart from any worker or
// snapshot type: which adapters a worker holds, and what a request's model
// names — an adapter of the fleet, a base model, or nothing any worker
// serves.
//
// A worker holds the adapters declared for it (configured, or set through
// the admin API, which replaces the configured list), those its /v1/models
// answer lists (entries with a parent model) and those its engine reports
// running or waiting (vllm:lora_requests_info). The registry publishes a
// Catalog with every snapshot and builds one candidate group per adapter
// beside it, so the request path resolves a model with one map lookup and
// picks among the adapter's holders as it would among all workers.
package lora

import (
	"slices"
	"strconv"
)

// Held returns the adapters a worker holds, each once, sorted: those
// declared for it, those it lists and those its engine runs.
func Held(declared, listed, running []string) []string {
	out := make([]string, 0, len(declared)+len(listed)+len(running))
	out = append(append(append(out, declared...), listed...), running...)
	slices.Sort(out)
	return slices.Compact(out)
}

// Catalog is what a fleet serves by name: its adapters and its base
// models, each numbered in the order they were added (the registry keeps
// its groups in that order). It is built off the request path and only
// read once published.
type Catalog struct {
	adapters map[string]int
	names    []string
	models   map[string]int
}

// AddAdapter adds an adapter and returns its number (the one it already
// had when added before).
func (c *Catalog) AddAdapter(name string) int {
	if i, ok := c.adapters[name]; ok {
		return i
	}
	if c.adapters == nil {
		c.adapters = map[string]int{}
	}
	c.adapters[name] = len(c.names)
	c.names = append(c.names, name)
	return len(c.names) - 1
}

// AddModel adds a base model some worker lists and returns its number (the
// one it already had when added before).
func (c *Catalog) AddModel(name string) int {
	if i, ok := c.models[name]; ok {
		return i
	}
	if c.models == nil {
		c.models = map[string]int{}
	}
	i := len(c.models)
	c.models[name] = i
	return i
}

// Model returns the number of the named base model. It does not allocate.
func (c *Catalog) Model(name []byte) (int, bool) {
	i, ok := c.models[string(name)]
	return i, ok
}

// Adapter returns the number of the named adapter. It does not allocate.
func (c *Catalog) Adapter(name []byte) (int, bool) {
	i, ok := c.adapters[string(name)]
	return i, ok
}

// Adapters returns the adapter names by number (do not modify).
func (c *Catalog) Adapters() []string { return c.names }

// HasModel reports whether some worker lists the base model.
func (c *Catalog) HasModel(name []byte) bool {
	_, ok := c.models[string(name)]
	return ok
}

// ListsModels reports whether any worker has listed its base models.
func (c *Catalog) ListsModels() bool { return len(c.models) > 0 }

// UnknownModelError is a model no worker lists as a base model or holds as
// an adapter.
type UnknownModelError struct{ Model string }

func (e *UnknownModelError) Error() string {
	return "model " + strconv.Quote(e.Model) + " is neither a base model nor a LoRA adapter of any worker"
}

// Resolve maps a request's model onto the number of its adapter. It
// returns -1 and no error when the model names no adapter: empty, a base
// model some worker lists, or any name while no worker has listed its base
// models yet (declared adapters alone do not tell which base models
// exist). Any other model is an *UnknownModelError. It does not allocate
// unless it fails.
func (c *Catalog) Resolve(model []byte) (int, error) {
	if len(model) == 0 {
		return -1, nil
	}
	if i, ok := c.Adapter(model); ok {
		return i, nil
	}
	if c.HasModel(model) || !c.ListsModels() {
		return -1, nil
	}
	return -1, &UnknownModelError{Model: string(model)}
}
