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
)

// Alias is a model name clients may ask for and the models it stands for.
type Alias struct {
	Name    string   `yaml:"name"`
	Targets []Target `yaml:"targets"`
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
	name    string
	targets []*target
	total   uint64 // the weights' sum
}

type target struct {
	model    []byte
	quoted   []byte // model as a JSON string, quotes included
	weight   uint64
	requests atomic.Uint64
}

// Error is what is wrong with an alias list: the field
// (model_aliases[1].targets[0].weight) and why.
type Error struct{ Field, Reason string }

func (e *Error) Error() string { return e.Field + ": " + e.Reason }

func fieldErr(field, format string, args ...any) error {
	return &Error{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// New checks list and returns its table (nil for an empty list). Its
// errors are *Error.
func New(list []Alias) (*Table, error) {
	if len(list) == 0 {
		return nil, nil
	}
	t := &Table{byName: make(map[string]*alias, len(list))}
	for i, a := range list {
		at := fmt.Sprintf("model_aliases[%d]", i)
		switch {
		case a.Name == "":
			return nil, fieldErr(at+".name", "empty")
		case t.byName[a.Name] != nil:
			return nil, fieldErr(at+".name", "%q is an alias already", a.Name)
		case len(a.Targets) == 0:
			return nil, fieldErr(at+".targets", "alias %q has none", a.Name)
		case len(a.Targets) > MaxTargets:
			return nil, fieldErr(at+".targets", "alias %q has %d, more than %d", a.Name, len(a.Targets), MaxTargets)
		}
		al := &alias{name: a.Name}
		seen := map[string]bool{}
		for j, tg := range a.Targets {
			w := tg.Weight
			switch {
			case tg.Model == "":
				return nil, fieldErr(fmt.Sprintf("%s.targets[%d].model", at, j), "empty")
			case seen[tg.Model]:
				return nil, fieldErr(fmt.Sprintf("%s.targets[%d].model", at, j), "%q is a target of alias %q already", tg.Model, a.Name)
			case w < 0:
				return nil, fieldErr(fmt.Sprintf("%s.targets[%d].weight", at, j), "%d is negative", w)
			case len(a.Targets) == 1:
				w = 1
			}
			seen[tg.Model] = true
			quoted, _ := json.Marshal(tg.Model) // a string always marshals
			al.targets = append(al.targets, &target{model: []byte(tg.Model), quoted: quoted, weight: uint64(w)})
			al.total += uint64(w)
		}
		if al.total == 0 {
			return nil, fieldErr(at+".targets", "every weight of alias %q is 0", a.Name)
		}
		t.byName[a.Name] = al
		t.list = append(t.list, al)
	}
	return t, nil
}

// Resolve returns the model a request for model goes to, and its JSON
// string (quotes included), when model is an alias: a target chosen by
// weight, by the hash of session when there is one (every request of a
// session gets the same target while the weights stay), at random
// otherwise. ok is false for a model that is no alias. It counts the
// request on its target, and allocates nothing.
func (t *Table) Resolve(model, session []byte) (to, quoted []byte, ok bool) {
	if t == nil {
		return nil, nil, false
	}
	a := t.byName[string(model)]
	if a == nil {
		return nil, nil, false
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

// Each calls f with every alias's every target, its weight and the
// requests it got, in the order configured.
func (t *Table) Each(f func(alias, model string, weight, requests uint64)) {
	if t == nil {
		return
	}
	for _, a := range t.list {
		for _, tg := range a.targets {
			f(a.name, string(tg.model), tg.weight, tg.requests.Load())
		}
	}
}
