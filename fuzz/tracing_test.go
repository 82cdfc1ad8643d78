package fuzz

import (
	"regexp"
	"testing"

	"github.com/fastroute/fastroute/dataplane/tracing"
)

// traceparentForm is the W3C Trace Context's traceparent: version, trace
// id, parent id and flags in lowercase hex; a version other than 00 may
// carry more after a dash.
var traceparentForm = regexp.MustCompile(`(?s)^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$`)

// FuzzTraceparent: Parse takes a value only when it has the traceparent's
// form, a version other than ff (00 with nothing after), and ids that are
// not all zero; what it takes, Append writes back as version 00 with the
// same ids and sampled flag, which Parse reads as it was.
func FuzzTraceparent(f *testing.F) {
	f.Add("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	f.Add("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
	f.Add("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03-later")
	f.Add("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	f.Add("00-00000000000000000000000000000000-00f067aa0ba902b7-01")
	f.Fuzz(func(t *testing.T, v string) {
		c, ok := tracing.Parse([]byte(v))
		m := traceparentForm.FindStringSubmatch(v)
		want := m != nil && m[1] != "ff" && !(m[1] == "00" && m[5] != "") &&
			m[2] != "00000000000000000000000000000000" && m[3] != "0000000000000000"
		if ok != want {
			t.Fatalf("Parse(%q) ok=%v, want %v", v, ok, want)
		}
		if !ok {
			return
		}
		out := c.Append(nil)
		back, ok := tracing.Parse(out)
		if !ok || back != c || string(out[3:52]) != v[3:52] {
			t.Fatalf("Parse(%q) = %+v, written back as %q, read as %+v", v, c, out, back)
		}
	})
}
