package frontend

import (
	"bytes"
	"strconv"

	"github.com/fastroute/fastroute/dataplane/aliases"
	"github.com/fastroute/fastroute/dataplane/metrics"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
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

// aliasBodyKept bounds the buffer of a rewritten body an exchange keeps
// for its next request: a larger one is let go.
const aliasBodyKept = 64 << 10

// applyAlias sends a request whose model is an alias to one of its
// targets (aliases.Table.Resolve): the model routing reads becomes the
// target's, and so does the body's model field, rewritten into the
// exchange's buffer (the body the worker gets, both legs of a split
// request included). False: the request was answered, a form that names
// an alias (its fields are not rewritten).
func (ex *exchange) applyAlias(ctx *fasthttp.RequestCtx) bool {
	t := ex.s.aliases.Load()
	if t == nil || len(ex.req.Model) == 0 {
		return true
	}
	to, quoted, ok := t.Resolve(ex.req.Model, ex.req.Session, ex.s.serves)
	if !ok {
		return true
	}
	body := ctx.PostBody()
	start, end, found := memberSpan(body, "model")
	if !found {
		writeError(ctx, fasthttp.StatusBadRequest, "invalid_request_error",
			"model "+strconv.Quote(string(ex.req.Model))+" is an alias, which only a JSON body may name")
		return false
	}
	if cap(ex.aliased) > aliasBodyKept {
		ex.aliased = nil
	}
	ex.aliased = append(append(append(ex.aliased[:0], body[:start]...), quoted...), body[end:]...)
	ctx.Request.SetBodyRaw(ex.aliased)
	if ex.s.access != nil {
		ex.alias = append(ex.alias[:0], ex.req.Model...)
	}
	ex.req.Model = append(ex.req.Model[:0], to...)
	return true
}

// memberSpan returns where the value of the top-level member name of the
// JSON object body lies: body[start:end], a string's quotes included (of
// the last such member, its name escaped or not; onlyMember lets only
// one through). found is false when body is no JSON object, or has no
// such member.
func memberSpan(body []byte, name string) (start, end int, found bool) {
	i := spaceEnd(body, 0)
	if i >= len(body) || body[i] != '{' {
		return 0, 0, false
	}
	for i++; ; {
		i = spaceEnd(body, i)
		switch {
		case i >= len(body):
			return 0, 0, false
		case body[i] == '}':
			return start, end, found
		case body[i] == ',':
			i++
			continue
		case body[i] != '"':
			return 0, 0, false
		}
		keyStart, keyEnd := i, stringEnd(body, i)
		if keyEnd < 0 {
			return 0, 0, false
		}
		i = spaceEnd(body, keyEnd)
		if i >= len(body) || body[i] != ':' {
			return 0, 0, false
		}
		i = spaceEnd(body, i+1)
		valueEnd := valueEnd(body, i)
		if valueEnd < 0 {
			return 0, 0, false
		}
		if keyIs(body[keyStart:keyEnd], name) {
			start, end, found = i, valueEnd, true
		}
		i = valueEnd
	}
}

// spaceEnd returns the index of the first byte at or after i of b that is
// not JSON white space.
func spaceEnd(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index past the closing quote of the JSON string
// whose opening quote is b[i], or -1 when it does not close.
func stringEnd(b []byte, i int) int {
	for j := i + 1; ; {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return -1
		}
		q := j + k
		if !escaped(b, q) {
			return q + 1
		}
		j = q + 1
	}
}

// valueEnd returns the index past the JSON value that begins at b[i], or
// -1 when it does not end.
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				e := stringEnd(b, j)
				if e < 0 {
					return -1
				}
				j = e - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(b) && !delimits(b[j]) {
		j++
	}
	if j == i {
		return -1
	}
	return j
}

// delimits says whether c ends a JSON number or literal.
func delimits(c byte) bool {
	switch c {
	case ',', '}', ']', ' ', '\t', '\r', '\n':
		return true
	}
	return false
}

// keyIs says whether the JSON string quoted (quotes included) is name,
// its escapes undone.
func keyIs(quoted []byte, name string) bool {
	raw := quoted[1 : len(quoted)-1]
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw) == name
	}
	v, err := fastjson.ParseBytes(quoted)
	if err != nil {
		return false
	}
	s, err := v.StringBytes()
	return err == nil && string(s) == name
}
