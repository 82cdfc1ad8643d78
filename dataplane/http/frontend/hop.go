package frontend

import (
	"bytes"
	"slices"

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

// headerFields is a request's or a response's headers.
type headerFields interface {
	PeekKeys() [][]byte
	Peek(key string) []byte
	DelBytes(key []byte)
	ConnectionClose() bool
	SetConnectionClose()
}

// dropHops removes h's hop-by-hop headers, those its Connection header
// names and Expect, keeping its Connection: close. Headers without any cost one pass
// over their names.
func dropHops[H headerFields](h H) {
	if !slices.ContainsFunc(h.PeekKeys(), isHop) {
		return // no Connection header either: nothing else is named
	}
	var room [128]byte
	listed := append(room[:0], h.Peek(fasthttp.HeaderConnection)...)
	closing := h.ConnectionClose()
	keys := h.PeekKeys()
	for i := 0; i < len(keys); {
		if k := keys[i]; isHop(k) || connectionNames(listed, k) {
			n := len(keys)
			h.DelBytes(k) // copies k before it edits the headers
			if keys = h.PeekKeys(); len(keys) < n {
				continue // the next key is at i now
			}
		}
		i++ // kept, or a default fasthttp shows, which stays (a response's Content-Type)
	}
	if closing {
		h.SetConnectionClose()
	}
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
		name := listed
		if i := bytes.IndexByte(listed, ','); i >= 0 {
			name, listed = listed[:i], listed[i+1:]
		} else {
			listed = nil
		}
		if bytes.EqualFold(bytes.TrimSpace(name), key) {
			return true
		}
	}
	return false
}
