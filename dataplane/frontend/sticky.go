package frontend

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/fastroute/fastroute/affinity"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/valyala/fastjson"
)

// maxSessionID bounds the session header; longer ids are refused.
const maxSessionID = 256

// maxCacheKeys bounds the embedding inputs one request is tracked by.
const maxCacheKeys = 64

// readSticky reads what routes a request besides its headers: the session
// id, the model (a LoRA adapter, maybe) and the embedding cache keys. It
// copies into the exchange's reused buffers, so it allocates nothing once
// they have grown.
func (ex *exchange) readSticky(session []byte, v *fastjson.Value) error {
	s := ex.s
	if s.opts.AffinityMode != affinity.Off && len(session) > 0 {
		if len(session) > maxSessionID {
			return fmt.Errorf("header %s: session id is longer than %d bytes", s.opts.SessionHeader, maxSessionID)
		}
		ex.session = append(ex.session[:0], session...)
	}
	if m := v.Get("model"); m != nil {
		b, err := m.StringBytes()
		if err != nil {
			return errors.New(`field "model" must be a string`)
		}
		ex.model = append(ex.model[:0], b...)
	}
	if ex.rt != routeEmbeddings || s.opts.EmbedCache == nil {
		return nil
	}
	in := v.Get("input")
	if in == nil {
		return nil
	}
	switch in.Type() {
	case fastjson.TypeString:
		ex.keys = append(ex.keys, affinity.Key(in.GetStringBytes()))
	case fastjson.TypeArray:
		arr, _ := in.Array()
		for _, e := range arr {
			if len(ex.keys) == maxCacheKeys {
				break
			}
			if b, err := e.StringBytes(); err == nil { // token-id inputs are not tracked
				ex.keys = append(ex.keys, affinity.Key(b))
			}
		}
	}
	return nil
}

// route applies LoRA residency, the session pin and embedding-cache hits to
// the selection request, on the snapshot the selection then picks from.
// The error is final for the request.
func (ex *exchange) route(snap *dataplane.Snapshot) error {
	s := ex.s
	req := &ex.req
	if s.opts.LoRA != nil {
		g, err := s.opts.LoRA.Resolve(snap, ex.model)
		if s.opts.PlaceAdapters && (errors.Is(err, dataplane.ErrNotFound) || (g != nil && g.Len() == 0)) {
			// No routable worker holds the adapter: the one its name hashes
			// to (the same on every replica) loads it.
			if id, ok := snap.Rendezvous(affinity.Key(ex.model), req.Phase, nil); ok {
				req.PreferID, req.HasPrefer = id, true
			}
			g, err = nil, nil
		}
		if err != nil {
			return err
		}
		req.Group = g
	}
	if len(ex.session) > 0 && !req.HasWorker {
		pin, st := s.opts.Affinity.Get(ex.session)
		switch {
		case st == affinity.Pinned && s.opts.AffinityMode == affinity.Hard:
			// x-dp-rank comes only with x-worker-id, so the pin's rank holds.
			req.WorkerID, req.HasWorker = pin.Worker, true
			req.DPRank, req.HasDPRank = pin.Rank, true
			ex.hard = true
		case st == affinity.Pinned:
			req.PreferID, req.HasPrefer = pin.Worker, true
			req.PreferRank, req.HasPreferRank = pin.Rank, true
		case st == affinity.Lost && s.opts.AffinityMode == affinity.Hard:
			s.opts.Affinity.Drop(ex.session)
			return dataplane.Errorf(dataplane.NoEndpoints,
				"session %s was pinned to worker %d, which left; the pin is dropped and the next request is pinned anew",
				strconv.Quote(string(ex.session)), pin.Worker)
		default: // no pin here: where every router places the session
			if id, ok := snap.Rendezvous(affinity.Key(ex.session), req.Phase, req.Group); ok {
				req.PreferID, req.HasPrefer = id, true
			}
		}
	}
	if len(ex.keys) > 0 && !req.HasWorker && !req.HasPrefer {
		if w, ok := ex.cacheHolder(); ok {
			req.PreferID, req.HasPrefer = w, true
		}
	}
	return nil
}

// cacheHolder returns the worker that served most of the request's inputs.
func (ex *exchange) cacheHolder() (uint64, bool) {
	var ids [8]uint64
	var hits [8]int
	n := 0
	for _, k := range ex.keys {
		w, ok := ex.s.opts.EmbedCache.Lookup(k)
		if !ok {
			continue
		}
		i := 0
		for i < n && ids[i] != w {
			i++
		}
		if i == n {
			if n == len(ids) {
				continue
			}
			ids[n] = w
			n++
		}
		hits[i]++
	}
	best := -1
	for i := 0; i < n; i++ {
		if best < 0 || hits[i] > hits[best] {
			best = i
		}
	}
	if best < 0 {
		return 0, false
	}
	return ids[best], true
}

// selectFailed drops a hard pin whose worker is gone, so the error is given
// once and the next request of the session is pinned anew.
func (ex *exchange) selectFailed(err error) error {
	var e *dataplane.Error
	if !ex.hard || !errors.As(err, &e) || e.Code == dataplane.ResourceExhausted {
		return err
	}
	ex.s.opts.Affinity.Drop(ex.session)
	return dataplane.Errorf(e.Code, "session %s is pinned to worker %d: %s; the pin is dropped",
		strconv.Quote(string(ex.session)), ex.req.WorkerID, e.Msg)
}

// served records where the request went once the worker has answered: the
// session (re-)pin and the embedding cache keys.
func (ex *exchange) served() {
	w := ex.res.Worker().ID()
	if len(ex.session) > 0 {
		ex.s.opts.Affinity.Put(ex.session, affinity.Pin{Worker: w, Rank: ex.res.Rank()})
	}
	for _, k := range ex.keys {
		ex.s.opts.EmbedCache.Record(k, w)
	}
}

// failedOnPin drops a hard session's pin when its worker failed to answer.
func (ex *exchange) failedOnPin() {
	if ex.hard {
		ex.s.opts.Affinity.Drop(ex.session)
	}
}
