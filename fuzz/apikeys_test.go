package fuzz

import (
	"strings"
	"testing"

	"github.com/fastroute/fastroute/dataplane/apikeys"
)

// FuzzKeysFile: any keys file either parses into entries whose keys are
// found by their digest and nothing else is, or fails with an error that
// quotes no field of the file but a model name (a key written in the
// wrong place is never shown).
func FuzzKeysFile(f *testing.F) {
	f.Add("team-a sk-team-a-0123456789abcdef max_inflight=4 priority=-1\nbatch sk-batch-0123456789abcdef tokens_per_minute=9000 models=a;b expires=2027-01-31\n")
	f.Add("# none\n\n")
	f.Add("team-a sk-old-0123456789abcd sk-new-0123456789abcd\n")
	f.Add("sk-team-a-0123456789abcdef short\nx y\n")
	f.Fuzz(func(t *testing.T, file string) {
		entries, err := apikeys.Parse([]byte(file))
		if err != nil {
			for _, field := range strings.Fields(file) {
				if len(field) >= 4 && !strings.HasPrefix(field, "models=") && !strings.HasPrefix(field, "#") &&
					strings.Contains(err.Error(), field) && !strings.Contains(errorWords, field) {
					t.Fatalf("error %q quotes field %q", err, field)
				}
			}
			return
		}
		var k apikeys.Keys
		k.Set(entries)
		owner := map[string]string{} // key -> name
		for _, e := range entries {
			owner[e.Key] = e.Name
		}
		for _, e := range entries {
			c := k.Lookup([]byte(e.Key))
			if c == nil || c.Name() != e.Name || c.MaxInflight() != int64(e.MaxInflight) || c.TokensPerMinute() != e.TokensPerMinute {
				t.Fatalf("entry %+v not found as itself", e)
			}
			for _, probe := range []string{e.Key + "x", e.Name, e.Key[:len(e.Key)-1]} {
				if c := k.Lookup([]byte(probe)); (c != nil) != (owner[probe] != "") || (c != nil && c.Name() != owner[probe]) {
					t.Fatalf("%q found %v, the owner of that key is %q", probe, c, owner[probe])
				}
			}
			for _, m := range e.Models {
				if !c.Allows([]byte(m)) {
					t.Fatalf("%q may not use its own model %q", e.Name, m)
				}
			}
		}
		if len(k.Clients()) != len(entries) {
			t.Fatalf("%d clients of %d entries", len(k.Clients()), len(entries))
		}
	})
}

// errorWords are the words Parse's errors are made of: a field equal to
// one of them is not quoted when the error holds it.
const errorWords = "line field fields want NAME KEY [max_inflight=N] [tokens_per_minute=N] [priority=P] [models=a;b], got " +
	"the name (field 1) is not letters, digits, '.', '_' or '-' key (field 2) shorter than characters holds a character that " +
	"printable ASCII none of max_inflight=N, tokens_per_minute=N (whole numbers of 0 or more), priority=P (a whole number) " +
	"and models=a;b given twice models= names an empty model its name line's too its key no key in it max_inflight " +
	"tokens_per_minute priority [expires=T], models=a;b and expires=T field expires= wants a date (2027-01-31, midnight UTC) " +
	"or an RFC 3339 time"
