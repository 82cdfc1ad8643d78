package frontend

import (
	"bytes"

	"github.com/valyala/fasthttp"
)

// cors is the front end's CORS policy (Options.CORSOrigins): browsers on
// the allowed origins may call the router, as they may call vLLM, whose
// --allowed-origins lets every origin by default. The router answers their
// preflight requests itself (a worker is not asked, and none need be up)
// and marks every answer to an allowed origin, its own and the workers'
// alike; a worker's own Access-Control-* headers are dropped, so that an
// answer carries one policy, the router's.
type cors struct {
	any     bool                // "*": every origin
	origins map[string]struct{} // else the origins allowed, as browsers send them
}

// newCORS returns the policy allowing origins ("*": any); nil for none:
// CORS off.
func newCORS(origins []string) *cors {
	if len(origins) == 0 {
		return nil
	}
	c := &cors{origins: make(map[string]struct{}, len(origins))}
	for _, o := range origins {
		c.any = c.any || o == "*"
		c.origins[o] = struct{}{}
	}
	return c
}

// The headers of CORS.
const (
	headerOrigin            = "Origin"
	headerRequestMethod     = "Access-Control-Request-Method"
	headerRequestHeaders    = "Access-Control-Request-Headers"
	headerAllowOrigin       = "Access-Control-Allow-Origin"
	corsAllowedMethods      = "GET, POST, DELETE, OPTIONS"
	corsMaxAge              = "600" // seconds a browser may keep a preflight's answer (Starlette's default, under vLLM)
	accessControlNamePrefix = "access-control-"
)

var anyOrigin = []byte("*")

// allowOrigin is the Access-Control-Allow-Origin of an answer to a request
// from origin: "*" when every origin may call, the origin itself when it is
// allowed, nil when it is not (or the request named none).
func (c *cors) allowOrigin(origin []byte) []byte {
	switch {
	case len(origin) == 0:
		return nil
	case c.any:
		return anyOrigin
	}
	if _, ok := c.origins[string(origin)]; ok {
		return origin
	}
	return nil
}

// preflight answers a browser's CORS preflight request (OPTIONS, with
// Origin and Access-Control-Request-Method), whatever its path: 204 with
// the methods and the headers asked for allowed, to an allowed origin; a
// 403 naming the key to any other. False: ctx is no preflight.
func (c *cors) preflight(ctx *fasthttp.RequestCtx) bool {
	h := &ctx.Request.Header
	if !ctx.IsOptions() || len(h.Peek(headerRequestMethod)) == 0 {
		return false
	}
	allow := c.allowOrigin(h.Peek(headerOrigin))
	if allow == nil {
		writeError(ctx, fasthttp.StatusForbidden, "permission_error", "origin not allowed by cors_allowed_origins")
		return true
	}
	rh := &ctx.Response.Header
	rh.Set("Access-Control-Allow-Methods", corsAllowedMethods)
	if asked := h.Peek(headerRequestHeaders); len(asked) > 0 {
		rh.SetBytesV("Access-Control-Allow-Headers", asked)
	}
	rh.Set("Access-Control-Max-Age", corsMaxAge)
	c.mark(h, rh)
	ctx.SetStatusCode(fasthttp.StatusNoContent)
	return true
}

// mark gives the answer h to the request req the router's CORS headers,
// when it comes from an allowed origin. Marking twice changes nothing.
func (c *cors) mark(req *fasthttp.RequestHeader, h *fasthttp.ResponseHeader) {
	allow := c.allowOrigin(req.Peek(headerOrigin))
	if allow == nil {
		return
	}
	h.SetBytesV(headerAllowOrigin, allow)
	if !c.any && !bytes.Contains(h.Peek(fasthttp.HeaderVary), []byte(headerOrigin)) {
		h.Add(fasthttp.HeaderVary, headerOrigin) // the answer depends on the origin: caches keep one per origin
	}
}

// dropAccessControl removes a worker answer's Access-Control-* headers,
// whatever the case of their names (they are not normalized:
// upCall.prepare), so that the answer carries the router's policy alone.
func dropAccessControl(h *fasthttp.ResponseHeader) {
	dropWhere(h, func(k []byte) bool {
		return len(k) > len(accessControlNamePrefix) && bytes.EqualFold(k[:len(accessControlNamePrefix)], []byte(accessControlNamePrefix))
	})
}

// markCORS gives ctx's answer its CORS headers, when the policy is on.
func (s *Server) markCORS(ctx *fasthttp.RequestCtx) {
	if c := s.policy.Load().cors; c != nil {
		c.mark(&ctx.Request.Header, &ctx.Response.Header)
	}
}
