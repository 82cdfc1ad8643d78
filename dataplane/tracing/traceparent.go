package tracing

import (
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
)

// Header is the W3C Trace Context header a request's trace travels in
// (https://www.w3.org/TR/trace-context/): version, trace id, the id of the
// span the request comes from, flags.
const Header = "traceparent"

// TraceID names a trace; SpanID a span in it. The zero ids are invalid.
type (
	TraceID [16]byte
	SpanID  [8]byte
)

// Context is a span's place in its trace, as a traceparent carries it.
type Context struct {
	Trace   TraceID
	Span    SpanID
	Sampled bool // the trace-flags' sampled bit
}

// headerLen is the length of a version-00 traceparent:
// "00-" 32 hex "-" 16 hex "-" 2 hex.
const headerLen = 55

// Parse reads a traceparent value as the W3C Trace Context (level 1)
// defines it: lowercase hex fields, a version other than ff (a later
// version's value may go on after a dash, and its first four fields are
// read as version 00's), neither id all zero. ok is false for any other
// value, which a participant treats as absent.
func Parse(v []byte) (c Context, ok bool) {
	if len(v) < headerLen || v[2] != '-' || v[35] != '-' || v[52] != '-' {
		return Context{}, false
	}
	var version, flags [1]byte
	if !decodeLower(version[:], v[0:2]) || version[0] == 0xff ||
		(version[0] == 0 && len(v) != headerLen) || (len(v) > headerLen && v[headerLen] != '-') ||
		!decodeLower(c.Trace[:], v[3:35]) || !decodeLower(c.Span[:], v[36:52]) || !decodeLower(flags[:], v[53:55]) ||
		c.Trace == (TraceID{}) || c.Span == (SpanID{}) {
		return Context{}, false
	}
	c.Sampled = flags[0]&1 != 0
	return c, true
}

// decodeLower decodes src, lowercase hex only, into dst (len(src)/2 bytes).
func decodeLower(dst, src []byte) bool {
	for _, b := range src {
		if b >= 'A' && b <= 'F' {
			return false
		}
	}
	n, err := hex.Decode(dst, src)
	return err == nil && n == len(dst)
}

// Append appends c as a version-00 traceparent value.
func (c Context) Append(dst []byte) []byte {
	dst = append(dst, "00-"...)
	dst = hex.AppendEncode(dst, c.Trace[:])
	dst = append(dst, '-')
	dst = hex.AppendEncode(dst, c.Span[:])
	if c.Sampled {
		return append(dst, "-01"...)
	}
	return append(dst, "-00"...)
}

// newTraceID and newSpanID draw random non-zero ids (math/rand/v2's
// generator: per thread, no lock).
func newTraceID() (t TraceID) {
	for t == (TraceID{}) {
		binary.BigEndian.PutUint64(t[:8], rand.Uint64())
		binary.BigEndian.PutUint64(t[8:], rand.Uint64())
	}
	return t
}

func newSpanID() (s SpanID) {
	for s == (SpanID{}) {
		binary.BigEndian.PutUint64(s[:], rand.Uint64())
	}
	return s
}
