package frontend

import (
	"bytes"
	"net"

	"github.com/valyala/fasthttp"
)

// headerForwardedFor lists the addresses a request came from and through,
// the client's first.
const headerForwardedFor = "X-Forwarded-For"

// addForwardedFor, with AddXForwardedFor on, appends the request's peer
// (its connection's address, or the one the connection's PROXY protocol
// header named; "unknown" for a peer without an IP address) to the
// request's X-Forwarded-For, as nginx's $proxy_add_x_forwarded_for does:
// the client's own lines, in their order, then the peer, in one line that
// its worker (every leg, retry and mirror copy of the request) gets. An
// engine's server that trusts the header from the router (uvicorn, under
// vLLM and SGLang, trusts it from 127.0.0.1 by default) then names the
// client, not the router; and the address it names is the router's peer,
// whatever a client wrote in the header itself. buf is the exchange's
// scratch, returned grown for its next request.
func addForwardedFor(h *fasthttp.RequestHeader, peer net.Addr, buf []byte) []byte {
	b := buf[:0]
	for _, v := range h.PeekAll(headerForwardedFor) {
		if v = bytes.TrimSpace(v); len(v) > 0 {
			b = append(append(b, v...), ", "...)
		}
	}
	if ap, ok := peerOf(peer); ok {
		b = ap.Addr().AppendTo(b)
	} else {
		b = append(b, "unknown"...)
	}
	h.Del(headerForwardedFor)
	h.SetBytesV(headerForwardedFor, b)
	return b
}
