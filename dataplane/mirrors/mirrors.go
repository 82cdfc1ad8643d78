// Package mirrors copies a share of the requests for a model to the
// workers of another, a shadow model, whose answers are dropped: a new
// engine version, build or quantization tried under the fleet's real
// traffic while the production model still answers every client. It is
// the Gateway API's RequestMirror filter (with its percent), Envoy's
// request mirror policy and nginx's mirror, keyed by the model a request
// is routed as. A Table is built once and read without locks.
package mirrors

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"sync/atomic"

	"github.com/fastroute/fastroute/internal/fielderr"
)

// Mirror copies Percent of the requests routed as Model to the workers
// serving To, at most MaxInflight copies at a time.
type Mirror struct {
	Model       string  `yaml:"model"`
	To          string  `yaml:"to"`
	Percent     float64 `yaml:"percent"`
	MaxInflight int     `yaml:"max_inflight"`
}

// DefaultMaxInflight bounds a mirror's copies in flight when its
// MaxInflight is 0: a shadow fleet slower than production (the point of
// trying it, often) then loses copies rather than piling them up in the
// router.
const DefaultMaxInflight = 64

// Outcome is how a copy ended.
type Outcome uint8

// The outcomes.
const (
	OK       Outcome = iota // answered below 500 and read to its end
	Failed                  // a 5xx, no answer, or an answer that broke
	Skipped                 // not sent: MaxInflight copies were in flight, or the body was no JSON body
	Unserved                // not sent: no routable worker serves To, or none had room for it
	NumOutcomes
)

var outcomeNames = [NumOutcomes]string{"ok", "failed", "skipped", "unserved"}

func (o Outcome) String() string { return outcomeNames[o] }

// Table is a set of mirrors. The nil Table has none.
type Table struct {
	byModel map[string]*Rule
	list    []*Rule // in the order configured
}

// Rule is one mirror of a Table.
type Rule struct {
	model, to   string
	quoted      []byte // to as a JSON string, quotes included
	percent     float64
	below       uint64 // a draw below it is copied
	all         bool   // percent is 100: every request is copied
	maxInflight int64
	inflight    atomic.Int64
	outcomes    [NumOutcomes]atomic.Uint64
}

// New checks list and returns its table (nil for an empty list). Its
// errors are *fielderr.Error.
func New(list []Mirror) (*Table, error) {
	if len(list) == 0 {
		return nil, nil
	}
	t := &Table{byModel: make(map[string]*Rule, len(list))}
	for i, m := range list {
		at := fmt.Sprintf("model_mirrors[%d]", i)
		switch {
		case m.Model == "":
			return nil, fielderr.New(at+".model", "empty")
		case t.byModel[m.Model] != nil:
			return nil, fielderr.New(at+".model", "%q is mirrored already", m.Model)
		case m.To == "":
			return nil, fielderr.New(at+".to", "empty")
		case m.To == m.Model:
			return nil, fielderr.New(at+".to", "%q is the model mirrored: its copies would go to the workers its requests go to", m.To)
		case !(m.Percent > 0 && m.Percent <= 100): // NaN too
			return nil, fielderr.New(at+".percent", "%v is not above 0 and at most 100", m.Percent)
		case m.MaxInflight < 0:
			return nil, fielderr.New(at+".max_inflight", "%d is negative", m.MaxInflight)
		}
		quoted, _ := json.Marshal(m.To) // a string always marshals
		r := &Rule{model: m.Model, to: m.To, quoted: quoted, percent: m.Percent, maxInflight: int64(m.MaxInflight)}
		if r.maxInflight == 0 {
			r.maxInflight = DefaultMaxInflight
		}
		if m.Percent == 100 {
			r.all = true
		} else {
			r.below = uint64(m.Percent / 100 * math.Exp2(64))
		}
		t.byModel[m.Model] = r
		t.list = append(t.list, r)
	}
	return t, nil
}

// Draw decides whether a request routed as model is copied: nil when it
// is not (no mirror for model, or the draw said no, or MaxInflight copies
// are in flight, counted Skipped). A rule returned holds a place among its
// copies in flight until its Done. It allocates nothing.
func (t *Table) Draw(model []byte) *Rule {
	if t == nil {
		return nil
	}
	r := t.byModel[string(model)]
	if r == nil || !r.all && rand.Uint64() >= r.below {
		return nil
	}
	if r.inflight.Add(1) > r.maxInflight {
		r.inflight.Add(-1)
		r.outcomes[Skipped].Add(1)
		return nil
	}
	return r
}

// To returns the shadow model, which a copy is routed as.
func (r *Rule) To() string { return r.to }

// Quoted returns the shadow model as a JSON string, quotes included: what
// a copy's body names.
func (r *Rule) Quoted() []byte { return r.quoted }

// Done ends a copy Draw allowed, counting how it ended.
func (r *Rule) Done(o Outcome) {
	r.inflight.Add(-1)
	r.outcomes[o].Add(1)
}

// KeepCounts carries the outcomes counted under each mirror of prev over
// to t's mirror of the same model and shadow model, so that a reload does
// not set them back to zero; t must not be in use yet. (Copies in flight
// end on the rule that let them go.)
func (t *Table) KeepCounts(prev *Table) {
	if t == nil || prev == nil {
		return
	}
	for _, r := range t.list {
		if old := prev.byModel[r.model]; old != nil && old.to == r.to {
			for o := range r.outcomes {
				r.outcomes[o].Store(old.outcomes[o].Load())
			}
		}
	}
}

// Stats is a mirror's state, for metrics.
type Stats struct {
	Model, To string
	Percent   float64
	Inflight  int64
	Outcomes  [NumOutcomes]uint64
}

// Each calls f with every mirror's state, in the order configured.
func (t *Table) Each(f func(Stats)) {
	if t == nil {
		return
	}
	for _, r := range t.list {
		st := Stats{Model: r.model, To: r.to, Percent: r.percent, Inflight: r.inflight.Load()}
		for o := range st.Outcomes {
			st.Outcomes[o] = r.outcomes[o].Load()
		}
		f(st)
	}
}
