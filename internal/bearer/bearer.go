// Package bearer holds a bearer token that a reload may change while
// requests read it: the admin token (checked on every admin request, sent
// to peer replicas) and the workers' API key (sent on the router's own
// requests to workers, and on clients' requests in place of their keys).
// Reading it takes an atomic load: no lock, no allocation.
package bearer

import (
	"crypto/subtle"
	"sync/atomic"
)

// Token is a bearer token, or none. The zero value, and a nil *Token,
// hold none.
type Token struct {
	header atomic.Pointer[[]byte] // "Bearer <token>"; nil: none
}

// New returns a Token holding token ("": none).
func New(token string) *Token {
	t := &Token{}
	t.Set(token)
	return t
}

// Set replaces the token ("": none). A request that read the old one
// goes on with it.
func (t *Token) Set(token string) {
	if token == "" {
		t.header.Store(nil)
		return
	}
	h := []byte("Bearer " + token)
	t.header.Store(&h)
}

// Header returns the Authorization value, "Bearer <token>", or nil when
// there is no token. The caller must not modify it.
func (t *Token) Header() []byte {
	if t == nil {
		return nil
	}
	if h := t.header.Load(); h != nil {
		return *h
	}
	return nil
}

// IsSet reports whether there is a token.
func (t *Token) IsSet() bool { return t.Header() != nil }

// Matches reports whether authorization (a request's Authorization
// value) is "Bearer <token>", comparing in constant time; false when
// there is no token.
func (t *Token) Matches(authorization []byte) bool {
	want := t.Header()
	return want != nil && subtle.ConstantTimeCompare(authorization, want) == 1
}
