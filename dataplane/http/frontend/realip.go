package frontend

import (
	"bytes"
	"net/netip"

	"github.com/valyala/fasthttp"
)

// RealIP has the front end take a request's client address from a header
// that an HTTP load balancer in front of it sets (X-Forwarded-For, or a
// header of one address such as X-Real-IP), for the access log and the
// request's span, when the request's connection comes from one of the
// balancer's addresses: nginx's realip module with real_ip_recursive on.
// A request from elsewhere keeps its connection's address, so no client
// that reaches the router past the balancer names an address of its
// choosing.
type RealIP struct {
	Header string         // its name
	From   []netip.Prefix // the proxies trusted to set it
}

// trusts says whether a is one of the proxies.
func (r *RealIP) trusts(a netip.Addr) bool { return within(r.From, a) }

// client returns the client address of a request whose connection's peer
// is peer and whose header is h: the last address of the header's (of all
// its lines, in order) that is not a trusted proxy's, walking from the
// nearest hop back, while every hop walked is trusted. A value that is no
// address stops the walk at the last address it trusted; a peer it does
// not trust is the client.
func (r *RealIP) client(h *fasthttp.RequestHeader, peer netip.AddrPort) netip.AddrPort {
	client := peer
	lines := h.PeekAll(r.Header)
	for i := len(lines) - 1; i >= 0; i-- {
		list := lines[i]
		for len(list) > 0 {
			if !r.trusts(client.Addr()) {
				return client
			}
			var item []byte
			if k := bytes.LastIndexByte(list, ','); k >= 0 {
				list, item = list[:k], list[k+1:]
			} else {
				list, item = nil, list
			}
			item = bytes.TrimSpace(item)
			if len(item) == 0 {
				continue // "a, , b" and a trailing comma: no address, nothing claimed
			}
			hop, ok := parseHop(item)
			if !ok {
				return client
			}
			client = hop
		}
	}
	return client
}

// parseHop reads one hop of a forwarding header: an IP, maybe with a port
// ("192.0.2.1:51234", "[2001:db8::1]:443"), or a bracketed IPv6 address.
func parseHop(b []byte) (netip.AddrPort, bool) {
	s := string(b)
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.AddrPortFrom(a.Unmap(), 0), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), true
	}
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil && a.Is6() {
			return netip.AddrPortFrom(a, 0), true
		}
	}
	return netip.AddrPort{}, false
}

// clientOf returns a request's client address: its connection's (or the
// one that connection's PROXY protocol header named), or the one a trusted
// balancer's header names (RealIP). False: the connection has no IP
// address.
func (p *policy) clientOf(ctx *fasthttp.RequestCtx) (netip.AddrPort, bool) {
	peer, ok := peerOf(ctx.RemoteAddr())
	if !ok {
		return netip.AddrPort{}, false
	}
	if p.RealIP == nil {
		return peer, true
	}
	return p.RealIP.client(&ctx.Request.Header, peer), true
}

// appendClient appends a client address as the access log shows it: the
// IP and port, or the IP alone where a header named none.
func appendClient(b []byte, a netip.AddrPort) []byte {
	if a.Port() == 0 {
		return a.Addr().AppendTo(b)
	}
	return a.AppendTo(b)
}
