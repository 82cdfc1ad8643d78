package frontend

import (
	"bytes"

	"github.com/valyala/fastjson"
)

// The scanning of JSON text without parsing it, where the router needs
// where something is rather than what: a usage object in an answer's
// bytes (tokenUsage.scan) and the model field of a body it rewrites
// (applyAlias).

// escaped reports whether the quote at data[i] follows an odd number of
// backslashes: it is inside a JSON string.
func escaped(data []byte, i int) bool {
	n := 0
	for i > n && data[i-1-n] == '\\' {
		n++
	}
	return n%2 == 1
}

// rewrittenBodyKept bounds the buffer of a rewritten body (withModel)
// kept for its next use, an exchange's or a pooled copy's: a larger one is
// let go.
const rewrittenBodyKept = 64 << 10

// withModel writes the JSON object body into buf, its top-level model
// field's value replaced by quoted (a JSON string, quotes included), the
// rest byte for byte. False: body names no model so (a form, say), and buf
// is returned as it was. A buf grown past rewrittenBodyKept is let go.
func withModel(buf, body, quoted []byte) ([]byte, bool) {
	start, end, found := memberSpan(body, "model")
	if !found {
		return buf, false
	}
	if cap(buf) > rewrittenBodyKept {
		buf = nil
	}
	return append(append(append(buf[:0], body[:start]...), quoted...), body[end:]...), true
}

// memberSpan returns where the value of the top-level member name of the
// JSON object body lies: body[start:end], a string's quotes included (of
// the last such member, its name escaped or not; onlyMember lets only
// one through). found is false when body is no JSON object, or has no
// such member.
func memberSpan(body []byte, name string) (start, end int, found bool) {
	i := spaceEnd(body, 0)
	if i >= len(body) || body[i] != '{' {
		return 0, 0, false
	}
	for i++; ; {
		i = spaceEnd(body, i)
		switch {
		case i >= len(body):
			return 0, 0, false
		case body[i] == '}':
			return start, end, found
		case body[i] == ',':
			i++
			continue
		case body[i] != '"':
			return 0, 0, false
		}
		keyStart, keyEnd := i, stringEnd(body, i)
		if keyEnd < 0 {
			return 0, 0, false
		}
		i = spaceEnd(body, keyEnd)
		if i >= len(body) || body[i] != ':' {
			return 0, 0, false
		}
		i = spaceEnd(body, i+1)
		valueEnd := valueEnd(body, i)
		if valueEnd < 0 {
			return 0, 0, false
		}
		if keyIs(body[keyStart:keyEnd], name) {
			start, end, found = i, valueEnd, true
		}
		i = valueEnd
	}
}

// spaceEnd returns the index of the first byte at or after i of b that is
// not JSON white space.
func spaceEnd(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index past the closing quote of the JSON string
// whose opening quote is b[i], or -1 when it does not close.
func stringEnd(b []byte, i int) int {
	for j := i + 1; ; {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return -1
		}
		q := j + k
		if !escaped(b, q) {
			return q + 1
		}
		j = q + 1
	}
}

// valueEnd returns the index past the JSON value that begins at b[i], or
// -1 when it does not end.
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				e := stringEnd(b, j)
				if e < 0 {
					return -1
				}
				j = e - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(b) && !delimits(b[j]) {
		j++
	}
	if j == i {
		return -1
	}
	return j
}

// delimits says whether c ends a JSON number or literal.
func delimits(c byte) bool {
	switch c {
	case ',', '}', ']', ' ', '\t', '\r', '\n':
		return true
	}
	return false
}

// keyIs says whether the JSON string quoted (quotes included) is name,
// its escapes undone.
func keyIs(quoted []byte, name string) bool {
	raw := quoted[1 : len(quoted)-1]
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw) == name
	}
	v, err := fastjson.ParseBytes(quoted)
	if err != nil {
		return false
	}
	s, err := v.StringBytes()
	return err == nil && string(s) == name
}
