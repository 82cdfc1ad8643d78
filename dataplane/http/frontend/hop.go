package frontend

import (
	"bytes"

	"github.com/valyala/fasthttp"
)

// Hop-by-hop headers (RFC 9110 section 7.6.1) describe one connection, not
// the request or its answer. The router's connections to its clients and
// to its workers are its own, so these headers of one side are not passed
// to the other, as Go's httputil.ReverseProxy does: a client's Keep-Alive,
// TE or Proxy-Authorization (a credential for a proxy, not for an
// engine) never reaches a worker, and a worker's Keep-Alive timeout never
// reaches a client, which would take it for the router's. fasthttp frames
// each connection itself (Transfer-Encoding, Content-Length) and keeps a
// client's "Connection: close" apart, for its own connection. A client's
// Expect: 100-continue is met by the router (fasthttp answers it before it
// reads the body), so it goes no further either: the worker would answer
// 100 Continue to a request it already has whole.

// dropRequestHops removes a client request's hop-by-hop headers, those its
// Connection header names and Expect, keeping its Connection: close. It
// finds them in the head as received (RawHeaders): fasthttp's list of the
// headers would have it parse the Cookie headers, which are then sent
// rewritten ("a=1;b=2" as "a=1; b=2", two as one). A request without any
// costs one pass over its head's names.
func dropRequestHops(h *fasthttp.RequestHeader) {
	raw := h.RawHeaders()
	found := false
	for k, rest := nextFieldName(raw); k != nil && !found; k, rest = nextFieldName(rest) {
		found = isHop(k)
	}
	if !found {
		return // no Connection header either: nothing else is named
	}
	var room [128]byte
	listed := append(room[:0], h.Peek(fasthttp.HeaderConnection)...)
	closing := h.ConnectionClose()
	for k, rest := nextFieldName(raw); k != nil; k, rest = nextFieldName(rest) {
		if isHop(k) || connectionNames(listed, k) {
			h.DelBytes(k) // copies k: the raw head is not edited
		}
	}
	if closing {
		h.SetConnectionClose()
	}
}

// dropAnswerHops removes a worker answer's hop-by-hop headers and those its
// Connection headers name, whatever the case of their names (the answer's
// are not normalized: upCall.prepare). An answer without any costs one
// pass over its headers.
func dropAnswerHops(h *fasthttp.ResponseHeader) {
	var room [128]byte
	listed, found := room[:0], false
	for k, v := range h.All() {
		if isHop(k) {
			found = true
			if bytes.EqualFold(k, []byte(fasthttp.HeaderConnection)) {
				listed = append(append(listed, v...), ',')
			}
		}
	}
	if !found {
		return
	}
	keys := h.PeekKeys()
	for i := 0; i < len(keys); {
		if k := keys[i]; isHop(k) || connectionNames(listed, k) {
			n := len(keys)
			h.DelBytes(k) // copies k before it edits the headers
			if keys = h.PeekKeys(); len(keys) < n {
				continue // the next key is at i now
			}
		}
		i++ // kept, or a header fasthttp shows whatever is deleted
	}
}

// dropWorkerDate removes the worker's Date headers that fasthttp would send
// beside its own: fasthttp writes its Date on every answer and leaves out a
// worker's only when its name is written "Date", and an answer's names are
// not normalized (upCall.prepare; uvicorn, under vLLM and SGLang, writes
// "date"). The client gets the router's Date, as nginx sends it.
func dropWorkerDate(h *fasthttp.ResponseHeader) {
	dropWhere(h, func(k []byte) bool {
		return len(k) == len(fasthttp.HeaderDate) && bytes.EqualFold(k, []byte(fasthttp.HeaderDate)) && string(k) != fasthttp.HeaderDate
	})
}

// dropWhere removes every header of h whose name matches.
func dropWhere(h *fasthttp.ResponseHeader, match func(name []byte) bool) {
	for {
		var found []byte
		for k := range h.All() {
			if match(k) {
				found = k
				break
			}
		}
		if found == nil {
			return
		}
		h.DelBytes(found) // copies found before it edits the headers
	}
}

// nextFieldName returns the name of the first field of a raw header block
// ("Name: value" lines up to an empty one; continuation lines and lines
// without a colon are skipped) and the block after that field's line; name
// is nil at the block's end.
func nextFieldName(raw []byte) (name, rest []byte) {
	for len(raw) > 0 {
		var line []byte
		line, raw, _ = bytes.Cut(raw, []byte{'\n'})
		if len(line) == 0 || line[0] == '\r' {
			return nil, nil
		}
		if line[0] == ' ' || line[0] == '\t' {
			continue
		}
		if i := bytes.IndexByte(line, ':'); i > 0 {
			for i > 0 && (line[i-1] == ' ' || line[i-1] == '\t') {
				i--
			}
			return line[:i], raw
		}
	}
	return nil, nil
}

// spacedFieldName returns the first field name of a raw header block that
// holds a space ("X Id: 1"), or nil. fasthttp takes such a name (it
// refuses every other byte a token may not hold, and a space before the
// colon), but a field name is a token (RFC 9110 §5.1): passed on, the
// worker's HTTP server refuses it or reads it as it likes, so the router
// answers 400 itself, as HAProxy does.
func spacedFieldName(raw []byte) []byte {
	for k, rest := nextFieldName(raw); k != nil; k, rest = nextFieldName(rest) {
		if bytes.IndexByte(k, ' ') >= 0 {
			return k
		}
	}
	return nil
}

// isHop reports whether key is a hop-by-hop header, or Expect.
func isHop(key []byte) bool {
	var names []string
	switch len(key) {
	case 2:
		names = []string{fasthttp.HeaderTE}
	case 6:
		names = []string{fasthttp.HeaderExpect}
	case 7:
		names = []string{fasthttp.HeaderTrailer, fasthttp.HeaderUpgrade}
	case 10:
		names = []string{fasthttp.HeaderConnection, fasthttp.HeaderKeepAlive}
	case 16:
		names = []string{fasthttp.HeaderProxyConnection}
	case 18:
		names = []string{fasthttp.HeaderProxyAuthenticate}
	case 19:
		names = []string{fasthttp.HeaderProxyAuthorization}
	}
	for _, n := range names {
		if bytes.EqualFold(key, []byte(n)) {
			return true
		}
	}
	return false
}

// connectionNames reports whether the value of a Connection header,
// listed, names key, a header the router may drop: never the framing
// fields (Content-Length, Transfer-Encoding), Host or Content-Type, which
// fasthttp keeps apart and writes for each message itself (a response
// without a Content-Type would get its default).
func connectionNames(listed, key []byte) bool {
	if len(listed) == 0 {
		return false
	}
	for _, kept := range []string{fasthttp.HeaderContentLength, fasthttp.HeaderTransferEncoding, fasthttp.HeaderHost, fasthttp.HeaderContentType} {
		if bytes.EqualFold(key, []byte(kept)) {
			return false
		}
	}
	for len(listed) > 0 {
		var name []byte
		name, listed, _ = bytes.Cut(listed, []byte{','})
		if bytes.EqualFold(bytes.TrimSpace(name), key) {
			return true
		}
	}
	return false
}
