// Package aliases maps the model names clients ask for to the models the
// engines serve (a base model or a LoRA adapter), splitting an alias's
// requests between its targets by weight: the canary of a new model
// version or adapter, as the Gateway API Inference Extension's
// InferenceModel targetModels do, with every request of one session going
// to the same target. A Table is built once and read without locks.
package aliases

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
	"github.com/fastroute/fastroute/internal/fielderr"
)

// Alias is a model name clients may ask for and the models it stands for.
// A fallback alias sends its requests to the first of its targets, in
// order, that a routable worker serves, instead of splitting them by
// weight: a smaller model while the larger one's workers are all down.
type Alias struct {
	Name     string   `yaml:"name"`
	Targets  []Target `yaml:"targets"`
	Fallback bool     `yaml:"fallback"`
}

// Target is a model an alias's requests go to and its share of them.
// With one target the weight is not read; with several, each target gets
// weight / (the weights' sum) of the requests, a target at 0 none.
type Target struct {
	Model  string `yaml:"model"`
	Weight int    `yaml:"weight"`
}

// MaxTargets bounds an alias's targets.
const MaxTargets = 16

// Table is a set of aliases. The nil Table has none.
type Table struct {
	byName map[string]*alias
	list   []*alias // in the order configured
}

type alias struct {
	name     string
	targets  []*target
	total    uint64 // the weights' sum
	fallback bool
}

type target struct {
	model    []byte
	quoted   []byte // model as a JSON string, quotes included
	weight   uint64
	requests atomic.Uint64
}

// New checks list and returns its table (nil for an empty list). Its
// errors are *fielderr.Error.
func New(list []Alias) (*Table, error) {
	if len(list) == 0 {
		return nil, nil
	}
	t := &Table{byName: make(map[string]*alias, len(list))}
	for i, a := range list {
		at := fmt.Sprintf("model_aliases[%d]", i)
		switch {
		case a.Name == "":
			return nil, fielderr.New(at+".name", "empty")
		case t.byName[a.Name] != nil:
			return nil, fielderr.New(at+".name", "%q is an alias already", a.Name)
		case len(a.Targets) == 0:
			return nil, fielderr.New(at+".targets", "alias %q has none", a.Name)
		case len(a.Targets) > MaxTargets:
			return nil, fielderr.New(at+".targets", "alias %q has %d, more than %d", a.Name, len(a.Targets), MaxTargets)
		}
		al := &alias{name: a.Name, fallback: a.Fallback}
		seen := map[string]bool{}
		for j, tg := range a.Targets {
			w := tg.Weight
			switch {
			case tg.Model == "":
				return nil, fielderr.New(fmt.Sprintf("%s.targets[%d].model", at, j), "empty")
			case seen[tg.Model]:
				return nil, fielderr.New(fmt.Sprintf("%s.targets[%d].model", at, j), "%q is a target of alias %q already", tg.Model, a.Name)
			case w < 0:
				return nil, fielderr.New(fmt.Sprintf("%s.targets[%d].weight", at, j), "%d is negative", w)
			case a.Fallback && w != 0:
				return nil, fielderr.New(fmt.Sprintf("%s.targets[%d].weight", at, j), "a fallback alias's targets take no weight: their order says which comes first")
			case len(a.Targets) == 1 || a.Fallback:
				w = 1
			}
			seen[tg.Model] = true
			quoted, _ := json.Marshal(tg.Model) // a string always marshals
			al.targets = append(al.targets, &target{model: []byte(tg.Model), quoted: quoted, weight: uint64(w)})
			al.total += uint64(w)
		}
		if al.total == 0 {
			return nil, fielderr.New(at+".targets", "every weight of alias %q is 0", a.Name)
		}
		t.byName[a.Name] = al
		t.list = append(t.list, al)
	}
	return t, nil
}

// Resolve returns the model a request for model goes to, and its JSON
// string (quotes included), when model is an alias: a fallback alias's
// first target that serves says a routable worker serves (the first
// target when none does, whose error the request then gets); another's
// target chosen by weight, by the hash of session when there is one
// (every request of a session gets the same target while the weights
// stay), at random otherwise. ok is false for a model that is no alias.
// It counts the request on its target, and allocates nothing.
func (t *Table) Resolve(model, session []byte, serves func(model []byte) bool) (to, quoted []byte, ok bool) {
	if t == nil {
		return nil, nil, false
	}
	a := t.byName[string(model)]
	if a == nil {
		return nil, nil, false
	}
	if a.fallback {
		tg := a.targets[0]
		for _, o := range a.targets {
			if serves(o.model) {
				tg = o
				break
			}
		}
		tg.requests.Add(1)
		return tg.model, tg.quoted, true
	}
	var n uint64
	if len(session) > 0 {
		n = xxhash.Sum64(session) % a.total
	} else {
		n = rand.Uint64N(a.total)
	}
	tg := a.targets[len(a.targets)-1] // n is at least the others' weights: below the last's
	for _, o := range a.targets[:len(a.targets)-1] {
		if n < o.weight {
			tg = o
			break
		}
		n -= o.weight
	}
	tg.requests.Add(1)
	return tg.model, tg.quoted, true
}

// KeepCounts carries the requests each target of prev got over to the
// same alias's same target in t, so that a reload does not set them back
// to zero; t must not be in use yet.
func (t *Table) KeepCounts(prev *Table) {
	if t == nil || prev == nil {
		return
	}
	for _, a := range t.list {
		if old := prev.byName[a.name]; old != nil {
			for _, tg := range a.targets {
				for _, o := range old.targets {
					if string(o.model) == string(tg.model) {
						tg.requests.Store(o.requests.Load())
					}
				}
			}
		}
	}
}

// Names returns the aliases' names, in the order configured.
func (t *Table) Names() []string {
	if t == nil {
		return nil
	}
	out := make([]string, len(t.list))
	for i, a := range t.list {
		out[i] = a.name
	}
	return out
}

// Each calls f with every alias's every target, its weight (0 for a
// fallback alias's) and the requests it got, in the order configured.
func (t *Table) Each(f func(alias, model string, weight, requests uint64)) {
	if t == nil {
		return
	}
	for _, a := range t.list {
		for _, tg := range a.targets {
			w := tg.weight
			if a.fallback {
				w = 0
			}
			f(a.name, string(tg.model), w, tg.requests.Load())
		}
	}
}
