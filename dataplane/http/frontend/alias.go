package frontend

import (
	"strconv"

	"github.com/fastroute/fastroute/dataplane/aliases"
	"github.com/fastroute/fastroute/dataplane/metrics"
	"github.com/valyala/fasthttp"
)

// SetAliases has the requests that arrive from now on read their model
// names through t (nil: none is an alias).
func (s *Server) SetAliases(t *aliases.Table) { s.aliases.Store(t) }

// writeAliasMetrics writes the families of the model aliases: each
// target's weight and the requests it got.
func writeAliasMetrics(w *metrics.Writer, t *aliases.Table) {
	type row struct {
		alias, model     string
		weight, requests uint64
	}
	var rows []row
	t.Each(func(alias, model string, weight, requests uint64) {
		rows = append(rows, row{alias, model, weight, requests})
	})
	w.Header("fastroute_model_alias_requests_total", "counter", "Requests that named a model alias, by the target they went to (a reload keeps the counts of the targets it keeps).")
	for _, r := range rows {
		w.Sample("fastroute_model_alias_requests_total", float64(r.requests), "alias", r.alias, "model", r.model)
	}
	w.Header("fastroute_model_alias_weight", "gauge", "Each target's weight in its alias's split of requests.")
	for _, r := range rows {
		w.Sample("fastroute_model_alias_weight", float64(r.weight), "alias", r.alias, "model", r.model)
	}
}

// Aliases returns the model aliases requests read their model names
// through now (nil: none).
func (s *Server) Aliases() *aliases.Table { return s.aliases.Load() }

// applyAlias sends a request whose model is an alias to one of its
// targets (aliases.Table.Resolve): the model routing reads becomes the
// target's, and so does the body's model field, rewritten into the
// exchange's buffer (the body the worker gets, both legs of a split
// request included); a WebSocket session's, named in the query, in the
// query. False: the request was answered, a form that names an alias (its
// fields are not rewritten).
func (ex *exchange) applyAlias(ctx *fasthttp.RequestCtx) bool {
	t := ex.s.aliases.Load()
	if t == nil || len(ex.req.Model) == 0 {
		return true
	}
	to, quoted, ok := t.Resolve(ex.req.Model, ex.req.Session, ex.s.serves)
	if !ok {
		return true
	}
	if ex.rt == routeWebSocket {
		ctx.QueryArgs().SetBytesV("model", to)
		ctx.Request.SetRequestURIBytes(ctx.URI().RequestURI())
	} else {
		var found bool
		if ex.aliased, found = withModel(ex.aliased, ctx.PostBody(), quoted); !found {
			writeError(ctx, fasthttp.StatusBadRequest, "invalid_request_error",
				"model "+strconv.Quote(string(ex.req.Model))+" is an alias, which only a JSON body may name")
			return false
		}
		ctx.Request.SetBodyRaw(ex.aliased)
	}
	if ex.pol.Access != AccessOff {
		ex.alias = append(ex.alias[:0], ex.req.Model...)
	}
	ex.req.Model = append(ex.req.Model[:0], to...)
	return true
}
