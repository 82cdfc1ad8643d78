package frontend

import (
	"bytes"

	"github.com/valyala/fasthttp"
)

// headerForwardedClientCert is Envoy's header of the client certificates
// the proxies a request came through saw (XFCC): a mesh sidecar that
// terminates mutual TLS in front of the router names its client there.
const headerForwardedClientCert = "X-Forwarded-Client-Cert"

// certName names a request's client by its certificate (empty: none):
// the one its connection's TLS handshake showed (clientCertName), else, on
// a connection from a proxy of Policy.ForwardedCertFrom, the one that
// proxy's x-forwarded-client-cert names (forwardedCertName, with buf for
// an escaped name). A client elsewhere cannot name a certificate there.
func (p *policy) certName(ctx *fasthttp.RequestCtx, buf []byte) []byte {
	if name := clientCertName(ctx.Conn()); len(name) > 0 || p.ForwardedCertFrom == nil {
		return name
	}
	if peer, ok := peerOf(ctx.RemoteAddr()); !ok || !within(p.ForwardedCertFrom, peer.Addr()) {
		return nil
	}
	return forwardedCertName(ctx.Request.Header.Peek(headerForwardedClientCert), buf)
}

// forwardedCertName returns the name of the client certificate an
// x-forwarded-client-cert value gives, as clientCertName names a
// certificate: the common name of its Subject, else its first URI, else
// its first DNS name; nil for none. The certificate is the last element's
// (elements are comma-separated; each proxy appends the one of the client
// it saw, so the last is the nearest proxy's client). An element is
// semicolon-separated key=value pairs, the keys in any case; a value that
// holds ',', ';' or '=' is double-quoted, a quote in it escaped with a
// backslash. A Subject is RFC 2253's (CN=client,O=org, as Envoy writes
// it) or OpenSSL's one-line form (/O=org/CN=client). A name with escapes
// is unescaped into buf, which the result may share; it allocates nothing
// while buf has room.
func forwardedCertName(v, buf []byte) []byte {
	var subject, uri, dns []byte
	last := lastElement(v)
	for len(last) > 0 {
		var pair []byte
		pair, last = cutUnquoted(last, ';')
		key, value, ok := bytes.Cut(bytes.TrimSpace(pair), []byte("="))
		if !ok {
			continue
		}
		switch {
		case bytes.EqualFold(key, []byte("Subject")) && subject == nil:
			subject = value
		case bytes.EqualFold(key, []byte("URI")) && uri == nil:
			uri = value
		case bytes.EqualFold(key, []byte("DNS")) && dns == nil:
			dns = value
		}
	}
	if cn := commonName(unquote(subject, buf)); len(cn) > 0 {
		return unescapeDN(cn, buf)
	}
	if len(uri) > 0 {
		return unquote(uri, buf)
	}
	if len(dns) > 0 {
		return unquote(dns, buf)
	}
	return nil
}

// lastElement is v's last comma-separated element outside quotes.
func lastElement(v []byte) []byte {
	for {
		elem, rest := cutUnquoted(v, ',')
		if rest == nil {
			return elem
		}
		v = rest
	}
}

// cutUnquoted cuts b at its first sep outside double quotes (a quote
// escaped with a backslash stays inside); rest is nil when there is none.
func cutUnquoted(b []byte, sep byte) (before, rest []byte) {
	quoted := false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '\\' && quoted:
			i++
		case c == '"':
			quoted = !quoted
		case c == sep && !quoted:
			return b[:i], b[i+1:]
		}
	}
	return b, nil
}

// unquote returns a value without its double quotes, a quote escaped in
// it (\") unescaped into buf. Other backslashes stay: they are the value's
// own (RFC 2253's in a Subject).
func unquote(v, buf []byte) []byte {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return v
	}
	v = v[1 : len(v)-1]
	if !bytes.Contains(v, []byte(`\"`)) {
		return v
	}
	out := buf[:0]
	for i := 0; i < len(v); i++ {
		if v[i] == '\\' && i+1 < len(v) && v[i+1] == '"' {
			i++
		}
		out = append(out, v[i])
	}
	return out
}

// commonName is the value of the CN attribute of a distinguished name in
// RFC 2253's form (CN=a\,b,O=org: attributes split at unescaped commas or
// pluses, most specific first) or OpenSSL's one-line form (/O=org/CN=a),
// as written (escapes kept: unescapeDN); nil when it has none.
func commonName(dn []byte) []byte {
	sep := byte(',')
	if len(dn) > 0 && dn[0] == '/' {
		sep, dn = '/', dn[1:]
	}
	for len(dn) > 0 {
		var attr []byte
		attr, dn = cutAttribute(dn, sep)
		key, value, ok := bytes.Cut(bytes.TrimSpace(attr), []byte("="))
		if ok && bytes.EqualFold(bytes.TrimSpace(key), []byte("CN")) {
			return bytes.TrimSpace(value)
		}
	}
	return nil
}

// cutAttribute cuts a distinguished name at its first attribute
// separator: sep ('/' of the one-line form), or an unescaped ',' or '+'
// of RFC 2253's.
func cutAttribute(dn []byte, sep byte) (attr, rest []byte) {
	for i := 0; i < len(dn); i++ {
		switch c := dn[i]; {
		case c == '\\' && sep == ',':
			i++
		case c == sep, c == '+' && sep == ',':
			return dn[:i], dn[i+1:]
		}
	}
	return dn, nil
}

// unescapeDN undoes the escapes of an RFC 2253 attribute value (\, and
// the like, or two hex digits: \2C) into buf, which may hold v itself: it
// writes no further along buf than it has read.
func unescapeDN(v, buf []byte) []byte {
	if bytes.IndexByte(v, '\\') < 0 {
		return v
	}
	out := buf[:0]
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c == '\\' && i+1 < len(v) {
			hi, okHi := unhex(v[i+1])
			if i+2 < len(v) {
				if lo, okLo := unhex(v[i+2]); okHi && okLo {
					out, i = append(out, hi<<4|lo), i+2
					continue
				}
			}
			c, i = v[i+1], i+1
		}
		out = append(out, c)
	}
	return out
}
