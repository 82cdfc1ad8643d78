package frontend

import (
	"bytes"
	"strconv"
	"strings"
	"time"

	"github.com/fastroute/fastroute/dataplane/apikeys"
	"github.com/fastroute/fastroute/dataplane/metrics"
	"github.com/valyala/fasthttp"
)

// Request headers that carry a client's API key.
const (
	headerAuthorization = "Authorization"
	headerXAPIKey       = "X-Api-Key" // as fasthttp normalizes x-api-key
)

// authenticate finds the client whose API key the request presents
// (Options.APIKeys), else, when it presents none, the client whose entry
// names the certificate its connection's client showed (mutual TLS), and
// answers 401 when no client has it or the key expired. The key goes
// no further: the request reaches its worker without it, and with the
// workers' own key (Options.WorkerAPIKey) when one is set, so a client
// never holds a key an engine takes and an engine's logs never show a
// client's.
func (s *Server) authenticate(ctx *fasthttp.RequestCtx) *apikeys.Client {
	h := &ctx.Request.Header
	key := apikeys.FromHeaders(h.Peek(headerAuthorization), h.Peek(headerXAPIKey))
	var protocols []byte // a WebSocket request's subprotocols less the one that named its key
	if key == nil && isWebSocket(h) {
		key, protocols = subprotocolKey(h.Peek(headerWebSocketProtocol))
	}
	var c *apikeys.Client
	if key == nil {
		var buf [certNameBytes]byte
		c = s.keys.LookupCert(s.policy.Load().certName(ctx, buf[:0]))
	}
	if c == nil {
		c = s.keys.Lookup(key)
	}
	if c == nil {
		ctx.Response.Header.Set(fasthttp.HeaderWWWAuthenticate, `Bearer realm="fastroute"`)
		writeError(ctx, fasthttp.StatusUnauthorized, "authentication_error",
			"a valid API key is required: send it as Authorization: Bearer <key> (or x-api-key: <key>), or show a client certificate the keys file names")
		return nil
	}
	if c.Expired(time.Now) {
		ctx.Response.Header.Set(fasthttp.HeaderWWWAuthenticate, `Bearer realm="fastroute", error="invalid_token"`)
		writeError(ctx, fasthttp.StatusUnauthorized, "authentication_error",
			"API key "+strconv.Quote(c.Name())+" expired at "+c.Expires().UTC().Format(time.RFC3339))
		return nil
	}
	h.Del(headerAuthorization)
	h.Del(headerXAPIKey)
	switch {
	case protocols == nil:
	case len(protocols) == 0:
		h.Del(headerWebSocketProtocol)
	default:
		h.SetBytesV(headerWebSocketProtocol, protocols)
	}
	if auth := s.opts.WorkerAPIKey.Header(); auth != nil {
		h.SetCanonical(authorizationKey, auth)
	}
	return c
}

var authorizationKey = []byte(headerAuthorization)

// certNameBytes is the room a request's check keeps for a certificate's
// name with escapes (certName): a longer one costs an allocation.
const certNameBytes = 256

// headerWebSocketProtocol lists the subprotocols a WebSocket client offers.
const headerWebSocketProtocol = "Sec-WebSocket-Protocol"

// subprotocolKeyPrefix names an API key among a WebSocket request's
// subprotocols, as OpenAI's realtime API takes one from a browser, which
// cannot set Authorization on a WebSocket: "Sec-WebSocket-Protocol:
// realtime, openai-insecure-api-key.<key>".
const subprotocolKeyPrefix = "openai-insecure-api-key."

// subprotocolKey returns the API key offered, a comma-separated list of
// subprotocols, names (nil: none), and the list without that entry (empty,
// not nil, when it was the only one), which is what the worker is offered:
// the key goes no further, as a key in a header does not.
func subprotocolKey(offered []byte) (key, rest []byte) {
	rest = []byte{}
	for entry := range bytes.SplitSeq(offered, []byte(",")) {
		token := bytes.TrimSpace(entry)
		if k, ok := bytes.CutPrefix(token, []byte(subprotocolKeyPrefix)); ok && key == nil {
			key = k
			continue
		}
		if len(token) > 0 {
			if len(rest) > 0 {
				rest = append(rest, ", "...)
			}
			rest = append(rest, token...)
		}
	}
	if key == nil {
		return nil, nil
	}
	return key, rest
}

// admit takes a slot of the request's client (nil: none) for the
// exchange, which gives it back when it ends (releaseClient); false: the
// client has max_inflight requests in flight, or its answers reported
// tokens_per_minute tokens over the last minute, and the request is
// answered 429. The exchange names the client either way, for the access
// log. A client's priority orders its requests in the wait queue in place
// of their bodies'.
func (ex *exchange) admit(ctx *fasthttp.RequestCtx, c *apikeys.Client) bool {
	if ex.key = c; c == nil {
		return true
	}
	switch r := c.Admit(ex.start); r {
	case apikeys.Admitted:
	case apikeys.OverInflight:
		ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, "1")
		writeError(ctx, fasthttp.StatusTooManyRequests, "rate_limit_error", "API key "+strconv.Quote(c.Name())+" has "+
			strconv.FormatInt(c.MaxInflight(), 10)+" requests in flight, its max_inflight")
		return false
	default:
		wait := strconv.FormatInt(int64(c.RetryAfter(ex.start, r)/time.Second), 10)
		ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, wait)
		used := strconv.FormatUint(c.RecentTokens(ex.start), 10) + " tokens over the last minute, its tokens_per_minute is " +
			strconv.FormatInt(c.TokensPerMinute(), 10)
		if r == apikeys.OverRequests {
			used = strconv.FormatUint(c.RecentRequests(ex.start), 10) + " requests over the last minute, its requests_per_minute is " +
				strconv.FormatInt(c.RequestsPerMinute(), 10)
		}
		writeError(ctx, fasthttp.StatusTooManyRequests, "rate_limit_error", "API key "+strconv.Quote(c.Name())+" used "+used+"; retry in "+wait+" s")
		return false
	}
	ex.keyHeld = true
	ex.priority, ex.keyPriority = c.Priority()
	return true
}

// modelAllowed reports whether the request's API key may use the model
// its body names, and answers 403 when not. A key limited to some models
// must name one of them; only a request about a stored response, which
// names none, goes without.
func (ex *exchange) modelAllowed(ctx *fasthttp.RequestCtx, aboutStored bool) bool {
	c := ex.key
	if c == nil || c.Allows(ex.req.Model) || (aboutStored && len(ex.req.Model) == 0) {
		return true
	}
	msg := "API key " + strconv.Quote(c.Name()) + " may use only the models " + strings.Join(c.Models(), ", ")
	if len(ex.req.Model) > 0 {
		msg += ", not " + strconv.Quote(string(ex.req.Model))
	} else {
		msg += ": the request must name one"
	}
	writeError(ctx, fasthttp.StatusForbidden, "permission_error", msg)
	return false
}

// releaseClient charges the client what the answer said it used and
// gives back the slot admit took, once.
func (ex *exchange) releaseClient() {
	if !ex.keyHeld {
		return
	}
	if prompt, completion := ex.usage.charged(); prompt+completion > 0 {
		ex.key.AddTokens(time.Now(), prompt, completion)
	}
	ex.key.Release()
	ex.keyHeld = false
}

// writeKeyMetrics writes the families of the clients' API keys.
func writeKeyMetrics(w *metrics.Writer, keys *apikeys.Keys) {
	clients := keys.Clients()
	w.Header("fastroute_api_key_requests_total", "counter",
		"Requests by API key (the name api_keys_file gives it) and outcome: admitted, answered 429 for the key's max_inflight, tokens_per_minute or requests_per_minute, or 401 for its expiry.")
	for _, c := range clients {
		w.Sample("fastroute_api_key_requests_total", float64(c.Admitted()), "api_key", c.Name(), "outcome", "admitted")
		w.Sample("fastroute_api_key_requests_total", float64(c.Limited(apikeys.OverInflight)), "api_key", c.Name(), "outcome", "max_inflight")
		w.Sample("fastroute_api_key_requests_total", float64(c.Limited(apikeys.OverTokens)), "api_key", c.Name(), "outcome", "tokens_per_minute")
		w.Sample("fastroute_api_key_requests_total", float64(c.Limited(apikeys.OverRequests)), "api_key", c.Name(), "outcome", "requests_per_minute")
		w.Sample("fastroute_api_key_requests_total", float64(c.Limited(apikeys.Expired)), "api_key", c.Name(), "outcome", "expired")
	}
	w.Header("fastroute_api_key_expiry_timestamp_seconds", "gauge", "When the API key expires (its expires=), for alerts before it does; absent for a key that does not.")
	for _, c := range clients {
		if t := c.Expires(); !t.IsZero() {
			w.Sample("fastroute_api_key_expiry_timestamp_seconds", float64(t.Unix()), "api_key", c.Name())
		}
	}
	w.Header("fastroute_api_key_tokens_total", "counter",
		"Tokens the answers to the API key's requests reported in their usage (prompt: prompt_tokens or input_tokens; completion: completion_tokens or output_tokens; a stream's when it reports them, as with stream_options.include_usage).")
	for _, c := range clients {
		prompt, completion := c.Tokens()
		w.Sample("fastroute_api_key_tokens_total", float64(prompt), "api_key", c.Name(), "kind", "prompt")
		w.Sample("fastroute_api_key_tokens_total", float64(completion), "api_key", c.Name(), "kind", "completion")
	}
	now := time.Now()
	for _, g := range []struct {
		name, help string
		value      func(c *apikeys.Client) float64
	}{
		{"fastroute_api_key_inflight", "Requests of the API key admitted and not yet ended.",
			func(c *apikeys.Client) float64 { return float64(c.Inflight()) }},
		{"fastroute_api_key_max_inflight", "The API key's max_inflight (0: no cap).",
			func(c *apikeys.Client) float64 { return float64(c.MaxInflight()) }},
		{"fastroute_api_key_recent_tokens", "Tokens the API key's answers reported over the last minute, which its tokens_per_minute caps.",
			func(c *apikeys.Client) float64 { return float64(c.RecentTokens(now)) }},
		{"fastroute_api_key_peer_recent_tokens", "Tokens the API key's answers reported over the last minute on the other replicas, as they last shared them (api_keys_share_interval), counted toward its tokens_per_minute here.",
			func(c *apikeys.Client) float64 { return float64(c.PeerTokens()) }},
		{"fastroute_api_key_peer_inflight", "The API key's requests in flight on the other replicas, as they last shared them, counted toward its max_inflight here.",
			func(c *apikeys.Client) float64 { return float64(c.PeerInflight()) }},
		{"fastroute_api_key_tokens_per_minute", "The API key's tokens_per_minute (0: no cap).",
			func(c *apikeys.Client) float64 { return float64(c.TokensPerMinute()) }},
		{"fastroute_api_key_recent_requests", "The API key's requests admitted over the last minute, which its requests_per_minute caps (counted while it has one).",
			func(c *apikeys.Client) float64 { return float64(c.RecentRequests(now)) }},
		{"fastroute_api_key_peer_recent_requests", "The API key's requests admitted over the last minute on the other replicas, as they last shared them, counted toward its requests_per_minute here.",
			func(c *apikeys.Client) float64 { return float64(c.PeerRequests()) }},
		{"fastroute_api_key_requests_per_minute", "The API key's requests_per_minute (0: no cap).",
			func(c *apikeys.Client) float64 { return float64(c.RequestsPerMinute()) }},
	} {
		w.Header(g.name, "gauge", g.help)
		for _, c := range clients {
			w.Sample(g.name, g.value(c), "api_key", c.Name())
		}
	}
	w.Single("fastroute_api_key_refused_total", "counter", "Requests answered 401 for want of a key some client has.", float64(keys.Refused()))
}
