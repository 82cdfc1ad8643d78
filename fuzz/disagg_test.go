package fuzz

import (
	"encoding/json"
	"testing"

	"github.com/fastroute/fastroute/dataplane/http/disagg"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FuzzDisaggRewrites: the body rewriting of prefill/decode disaggregation: any JSON object in gives a JSON object out, with every
// field the protocol does not name unchanged.
func FuzzDisaggRewrites(f *testing.F) {
	for _, seed := range []string{`{"a":1}`, `{"stream":true,"max_tokens":3,"x":"\u00e9\n"}`, `{"messages":[{"content":"\u0000"}],"min_tokens":1}`, `{}`, `[]`, `{"a":{"b":[1,2,{"c":null}]}}`} {
		f.Add([]byte(seed))
	}
	named := map[string]bool{"stream": true, "max_tokens": true, "max_completion_tokens": true, "stream_options": true,
		"min_tokens": true, "min_completion_tokens": true, "kv_transfer_params": true,
		"bootstrap_host": true, "bootstrap_port": true, "bootstrap_room": true}
	f.Fuzz(func(t *testing.T, body []byte) {
		var in map[string]json.RawMessage
		if json.Unmarshal(body, &in) != nil || in == nil {
			_, err := disagg.PrefillBody(body)
			assert.Error(t, err)
			return
		}
		outs := [][]byte{}
		for _, rewrite := range []func([]byte) ([]byte, error){
			disagg.PrefillBody,
			func(b []byte) ([]byte, error) { return disagg.DecodeBody(b, json.RawMessage(`{"k":1}`)) },
			func(b []byte) ([]byte, error) { return disagg.BootstrapBody(b, "h", 1, 2) },
		} {
			out, err := rewrite(body)
			require.NoError(t, err)
			outs = append(outs, out)
		}
		for _, out := range outs {
			var got map[string]json.RawMessage
			require.NoError(t, json.Unmarshal(out, &got), "%s", out)
			for k, v := range in {
				if named[k] {
					continue
				}
				var a, b any
				require.NoError(t, json.Unmarshal(v, &a))
				require.NoError(t, json.Unmarshal(got[k], &b))
				assert.Equal(t, a, b, "field %q", k)
			}
		}
	})
}
