package frontend

import (
	"net/netip"
	"slices"
	"time"
)

// Policy is what a reload may change of how the front end treats
// requests (SetPolicy). A request keeps the policy in force when it
// began; a CORS preflight, a route's lookup and the marks of an answer
// read the one in force then.
type Policy struct {
	// Routes are extra paths proxied like the OpenAI ones (beyond every
	// POST under /v1/ and the engines' own routes).
	Routes []string
	// CORSOrigins are the origins whose browsers may call the front end
	// ("*": any): the router answers their preflights and marks its
	// answers (cors). None: no CORS, a preflight is a 405, and answers
	// carry what their workers sent.
	CORSOrigins []string
	// RetryStatuses are worker answer statuses that move the request to
	// another worker (within Retries) when the answer, read whole first,
	// is at most AnswerBufferBytes; the last worker's answer goes to the
	// client as it is.
	RetryStatuses []int
	// GenerateRequestIDs gives each proxied request that came without an
	// X-Request-Id one made up, sent to its worker, and has every answer to
	// a proxied request carry the request's id (stampRequestID).
	GenerateRequestIDs bool
	// AddXForwardedFor appends each proxied request's peer address to the
	// X-Forwarded-For its worker gets (addForwardedFor).
	AddXForwardedFor bool
	// Access says which requests get an access line (none without
	// Options.AccessLog).
	Access Access
	// RealIP, when set, takes a request's client address from a header
	// that the HTTP load balancers it trusts set; nil: the connection's.
	RealIP *RealIP
	// ForwardedCertFrom, when set, are the proxies (a mesh sidecar that
	// terminates mutual TLS) whose x-forwarded-client-cert names their
	// client's certificate (certName); that header goes to no worker.
	ForwardedCertFrom []netip.Prefix
	// Disagg splits generation requests between prefill and decode
	// workers (a request split as it began finishes under its protocol).
	Disagg Disagg
	Limits
}

// Limits are the bounds of a request's exchange with its worker and of a
// client connection's requests that a reload may change (a connection to
// a worker dialed before keeps the connect timeout it was dialed with).
type Limits struct {
	ConnectTimeout    time.Duration // dial to a worker
	FirstByteTimeout  time.Duration // a worker's response headers
	StreamIdleTimeout time.Duration // gap between two reads of a worker's answer
	// AnswerBufferBytes is the largest non-streamed answer read whole
	// before it is sent (0: DefaultAnswerBufferBytes); a larger one, or one
	// of unknown length, is passed through as it comes. A prefill answer
	// over it fails the request.
	AnswerBufferBytes int
	// MaxRequestsPerConnection is how many requests a client connection
	// carries before its answer closes it (0: no limit).
	MaxRequestsPerConnection int
}

// policy is a Policy made ready for the request path.
type policy struct {
	Policy
	routes  map[string]struct{} // proxied paths outside /v1/: engineRoutes and Routes
	retryOn [600]bool           // RetryStatuses
	cors    *cors               // nil: off
}

// SetPolicy puts p in force for the requests that begin from now on.
func (s *Server) SetPolicy(p Policy) {
	if s.opts.AccessLog == nil {
		p.Access = AccessOff
	}
	if p.AnswerBufferBytes <= 0 {
		p.AnswerBufferBytes = DefaultAnswerBufferBytes
	}
	ready := &policy{Policy: p, routes: map[string]struct{}{}, cors: newCORS(p.CORSOrigins)}
	for _, r := range append(slices.Clone(engineRoutes), p.Routes...) {
		ready.routes[r] = struct{}{}
	}
	for _, st := range p.RetryStatuses {
		if st >= 0 && st < len(ready.retryOn) {
			ready.retryOn[st] = true
		}
	}
	s.policy.Store(ready)
}

// Access is which requests get an access line.
type Access int32

// The access log's settings (log.access).
const (
	AccessOff    Access = iota // none
	AccessAll                  // every request
	AccessErrors               // those answered 400 or above, or that did not end well
)

// ParseAccess reads a log.access value: off, all or errors (false for
// anything else).
func ParseAccess(s string) (Access, bool) {
	switch s {
	case "off":
		return AccessOff, true
	case "all":
		return AccessAll, true
	case "errors":
		return AccessErrors, true
	}
	return AccessOff, false
}
