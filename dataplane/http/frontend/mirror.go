package frontend

import (
	"io"
	"sync/atomic"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/metrics"
	"github.com/fastroute/fastroute/dataplane/mirrors"
	"github.com/valyala/fasthttp"
)

// SetMirrors has the requests that arrive from now on copied by t (nil:
// none is).
func (s *Server) SetMirrors(t *mirrors.Table) { s.mirrors.Store(t) }

// Mirrors returns the mirrors requests are copied by now (nil: none).
func (s *Server) Mirrors() *mirrors.Table { return s.mirrors.Load() }

// mirrorCopy is a copy of a client's request on its way to a worker of a
// mirror's shadow model, from a goroutine of its own (sendCopy).
type mirrorCopy struct {
	upCall
	own     fasthttp.Request // up: the client's request as the client sent it
	req     dataplane.Request
	res     dataplane.Reservation
	rule    *mirrors.Rule
	pol     *policy // the policy in force as its request began
	uri     []byte
	body    []byte // the client's body naming the shadow model
	rankBuf []byte
	stop    atomic.Uint32 // Shutdown cut it
}

// copyToken owns a copy's connection: only Shutdown cuts a copy, so every
// copy may have the same.
const copyToken = 1

// mirror copies the exchange's request to the shadow model of its model's
// mirror when the draw says so (mirrors.Table.Draw): the body's model is
// rewritten, and the copy goes from a goroutine of its own while the
// request goes on as it would have. It is called once the request has its
// worker, so a request refused is not copied; nor is one naming a stored
// response (its shadow does not hold it), nor one that arrives once
// Shutdown began.
func (ex *exchange) mirror(ctx *fasthttp.RequestCtx, t *mirrors.Table) {
	s := ex.s
	if len(ex.req.Model) == 0 || len(ex.req.Response) > 0 || s.closing.Load() {
		return
	}
	r := t.Draw(ex.req.Model)
	if r == nil {
		return
	}
	c := s.copies.Get().(*mirrorCopy)
	var found bool
	if c.body, found = withModel(c.body, ctx.PostBody(), r.Quoted()); !found { // a form: its model is not rewritten
		s.copies.Put(c)
		r.Done(mirrors.Skipped)
		return
	}
	c.rule, c.pol = r, ex.pol
	c.stop.Store(0)
	c.own.Reset()
	ctx.Request.Header.CopyTo(&c.own.Header) // without the client's API key (authenticate)
	c.uri = append(c.uri[:0], ctx.RequestURI()...)
	s.copying.Store(c, struct{}{})
	ex.copied = r
	go s.sendCopy(c)
}

// sendCopy sends a copy, drops its answer and counts how it ended.
func (s *Server) sendCopy(c *mirrorCopy) {
	c.rule.Done(s.runCopy(c))
	c.rule, c.pol = nil, nil
	s.copying.Delete(c)
	if cap(c.body) > rewrittenBodyKept {
		c.body = nil
	}
	s.copies.Put(c)
}

// runCopy sends a copy to a worker that names its shadow model
// (Selector.Lists: a copy never goes to a worker of unknown models),
// reserved as any
// request is (its occupancy counts, its release wakes the wait queue),
// and reads its answer to the end, a stream's included, as a client
// would. It is not retried: a failure is the shadow's to show. Its
// worker's statistics and passive health count it as any request.
func (s *Server) runCopy(c *mirrorCopy) mirrors.Outcome {
	c.req.Reset()
	c.req.Model = append(c.req.Model[:0], c.rule.To()...)
	c.req.Phase = dataplane.PhaseDecode
	if !s.sel.Lists(c.req.Model) || s.sel.Select(&c.req, &c.res) != nil {
		return mirrors.Unserved
	}
	defer func() {
		c.res.Release()
		s.queue.ended()
	}()
	w := c.res.Worker()
	u := s.upstreamOf(w)
	c.up = &c.own
	c.upCall.prepare(u, w, c.uri, c.body, nil, c.res.Rank(), &c.rankBuf)
	c.res.Dispatched()
	t := time.Now()
	err := c.send(u, copyToken, t, &c.pol.Limits, &c.stop)
	if err != nil {
		if c.stop.Load() == 0 {
			u.stats.failed(failureOf(err))
			s.reportAnswer(w, false)
		}
		return mirrors.Failed
	}
	status := c.resp.StatusCode()
	u.stats.answered(status, time.Since(t))
	err = c.drop()
	c.endConn(copyToken)
	switch {
	case err != nil && c.stop.Load() != 0:
		return mirrors.Failed
	case err != nil:
		u.stats.failed(failCut)
		s.reportAnswer(w, false)
		return mirrors.Failed
	}
	s.reportAnswer(w, status < fasthttp.StatusInternalServerError)
	if status >= fasthttp.StatusInternalServerError {
		return mirrors.Failed
	}
	return mirrors.OK
}

// drop reads the rest of a sent call's answer and drops it, holding no
// read buffer while the next bytes are awaited (awaitStream).
func (c *upCall) drop() error {
	body := c.resp.BodyStream()
	if body == nil {
		c.bodyDone = true
		return nil
	}
	bp := lentBufs.Get().(*[]byte)
	defer lentBufs.Put(bp)
	for {
		c.awaitStream()
		_, err := body.Read(*bp)
		if err == io.EOF {
			c.bodyDone = true
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// cutCopies cuts the copies still in flight, whose answers are for
// nobody, and waits up to copiesCutWait for them to end (their
// reservations released). Shutdown calls it once no request is left to
// start another.
func (s *Server) cutCopies() {
	s.copying.Range(func(c *mirrorCopy, _ struct{}) bool {
		c.stop.Store(stopHungUp)
		c.cut(copyToken)
		return true
	})
	for deadline := time.Now().Add(copiesCutWait); s.copying.Size() > 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
}

// copiesCutWait bounds Shutdown's wait for the copies it cut.
const copiesCutWait = 5 * time.Second

// writeMirrorMetrics writes the families of the model mirrors.
func writeMirrorMetrics(w *metrics.Writer, t *mirrors.Table) {
	var list []mirrors.Stats
	t.Each(func(st mirrors.Stats) { list = append(list, st) })
	w.Header("fastroute_model_mirror_requests_total", "counter", "Copies of requests for a mirrored model sent to its shadow model, by outcome: ok (answered below 500, read to the end), failed (a 5xx, no answer or a broken one), skipped (max_inflight copies in flight, or a body that is no JSON), unserved (no routable worker of the shadow model took it).")
	for _, st := range list {
		for o, n := range st.Outcomes {
			w.Sample("fastroute_model_mirror_requests_total", float64(n), "model", st.Model, "to", st.To, "outcome", mirrors.Outcome(o).String())
		}
	}
	w.Header("fastroute_model_mirror_inflight", "gauge", "Copies of a mirrored model's requests in flight to its shadow model.")
	for _, st := range list {
		w.Sample("fastroute_model_mirror_inflight", float64(st.Inflight), "model", st.Model, "to", st.To)
	}
	w.Header("fastroute_model_mirror_percent", "gauge", "The share of a mirrored model's requests copied to its shadow model, in percent.")
	for _, st := range list {
		w.Sample("fastroute_model_mirror_percent", st.Percent, "model", st.Model, "to", st.To)
	}
}
