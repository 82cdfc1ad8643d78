package frontend

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fastjson"
)

// memberSpan finds the top-level model field's value, whatever the
// spacing, the escapes of its name or of the strings around it, and
// never a model field nested deeper.
func TestTheModelFieldIsFoundAtTheTopLevelOnly(t *testing.T) {
	for body, want := range map[string]string{
		`{"model":"a"}`: `"a"`,
		` { "messages" : [ {"model":"nested","content":"\"model\": \"x\""} ] , "model"  :  "a\"b" , "n":1 }`: `"a\"b"`,
		`{"tools":{"model":{"model":1}},"mod\u0065l":"a","x":[[{}],"]"]}`:                                    `"a"`,
		`{"model":null}`:                               `null`,
		`{"model":12.5e3,"y":true}`:                    `12.5e3`,
		"{\"x\":\"\\\\\",\"model\":{\"a\":[1,\"}\"]}}": `{"a":[1,"}"]}`,
		`{"messages":[{"model":"nested"}]}`:            "",
		`["model","a"]`:                                "",
		`"model"`:                                      "",
		`{"model":"a"`:                                 "",
		`{"model" "a"}`:                                "",
		``:                                             "",
	} {
		start, end, found := memberSpan([]byte(body), "model")
		if want == "" {
			assert.False(t, found, body)
			continue
		}
		require.True(t, found, body)
		assert.Equal(t, want, body[start:end], body)
	}
}

// FuzzTheModelFieldIsRewritten: in any JSON object with one model field
// (as onlyMember lets through), memberSpan finds that field's value, and
// putting another value there changes that field alone; on any other
// bytes it finds no field of a body that is no object, and never panics.
func FuzzTheModelFieldIsRewritten(f *testing.F) {
	for _, s := range []string{
		`{"model":"a","messages":[{"role":"user","content":"hi"}]}`,
		`{"mod\u0065l":"a"}`, ` {"x":{"model":1},"model" : [1,{"y":"]"}] } `, `{"a":"\\","model":"b\"c"}`,
		`{"model":"a","model":"b"}`, `{}`, `[]`, `"x"`, `{"model"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		start, end, found := memberSpan(body, "model")
		v, err := fastjson.ParseBytes(body)
		if err != nil {
			return // not JSON: memberSpan only has not to panic
		}
		if v.Type() != fastjson.TypeObject {
			if found {
				t.Fatalf("found a model field in %q, no object", body)
			}
			return
		}
		m, err := onlyMember(v, "model")
		if err != nil {
			return // refused before any rewrite
		}
		if m == nil {
			if found {
				t.Fatalf("found a model field in %q, which has none", body)
			}
			return
		}
		if !found {
			t.Fatalf("no model field found in %q", body)
		}
		got, err := fastjson.ParseBytes(body[start:end])
		if err != nil || string(got.MarshalTo(nil)) != string(m.MarshalTo(nil)) {
			t.Fatalf("%q: found %q, the field is %s", body, body[start:end], m.MarshalTo(nil))
		}
		rewritten, ok := withModel(nil, body, []byte(`"target"`))
		if !ok {
			t.Fatalf("withModel found no model field in %q", body)
		}
		w, err := fastjson.ParseBytes(rewritten)
		if err != nil {
			t.Fatalf("%q rewritten is no JSON: %q: %v", body, rewritten, err)
		}
		members := func(v *fastjson.Value) (out []string) {
			o, _ := v.Object()
			o.Visit(func(k []byte, val *fastjson.Value) { out = append(out, string(k)+"="+string(val.MarshalTo(nil))) })
			return out
		}
		before, after := members(v), members(w)
		if len(before) != len(after) {
			t.Fatalf("%q rewritten lost or gained fields: %q", body, rewritten)
		}
		for i := range before {
			want := before[i]
			if want == "model="+string(m.MarshalTo(nil)) {
				want = `model="target"`
			}
			if after[i] != want {
				t.Fatalf("%q rewritten: field %d is %s, want %s", body, i, after[i], want)
			}
		}
	})
}
