package disagg

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func decode(t testing.TB, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m), "%s", b)
	return m
}

func TestPrefillBody(t *testing.T) {
	in := `{"model":"m","messages":[{"role":"user","content":"héllo \u0000"}],"stream":true,"stream_options":{"include_usage":true},
		"max_tokens":200,"max_completion_tokens":300,"min_tokens":5,"min_completion_tokens":6,"temperature":0.7,"seed":12345678901234567890}`
	out, err := PrefillBody([]byte(in))
	require.NoError(t, err)
	m := decode(t, out)
	assert.Equal(t, false, m["stream"])
	assert.EqualValues(t, 1, m["max_tokens"])
	assert.EqualValues(t, 1, m["max_completion_tokens"])
	for _, k := range []string{"stream_options", "min_tokens", "min_completion_tokens"} {
		assert.NotContains(t, m, k)
	}
	assert.Equal(t, map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
		"remote_block_ids": nil, "remote_host": nil, "remote_port": nil}, m["kv_transfer_params"])
	assert.Equal(t, "m", m["model"])
	assert.Equal(t, 0.7, m["temperature"])
	assert.Contains(t, string(out), `"seed":12345678901234567890`, "numbers pass byte for byte")
	assert.Contains(t, string(out), `"content":"héllo \u0000"`, "strings too")

	out, err = PrefillBody([]byte(`{"prompt":"x","max_tokens":9}`))
	require.NoError(t, err)
	assert.NotContains(t, decode(t, out), "max_completion_tokens", "only set when the client sent it")

	for _, bad := range []string{`[1]`, `"s"`, `null`, `{`, ``} {
		_, err := PrefillBody([]byte(bad))
		assert.Error(t, err, bad)
	}
}

func TestTransferParamsAndDecodeBody(t *testing.T) {
	params := `{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"e1","remote_block_ids":[1,2,3],"remote_host":"10.0.0.1","remote_port":5600,"x":{"y":1}}`
	p, err := TransferParams([]byte(`{"id":"cmpl-1","choices":[],"kv_transfer_params":` + params + `}`))
	require.NoError(t, err)
	assert.JSONEq(t, params, string(p))
	out, err := DecodeBody([]byte(`{"model":"m","stream":true,"max_tokens":200}`), p)
	require.NoError(t, err)
	assert.JSONEq(t, `{"model":"m","stream":true,"max_tokens":200,"kv_transfer_params":`+params+`}`, string(out))

	for _, answer := range []string{`{"choices":[]}`, `{"kv_transfer_params":null}`, `{"kv_transfer_params":[1]}`, `not json`} {
		_, err := TransferParams([]byte(answer))
		assert.Error(t, err, answer)
	}
}

func TestBootstrapBody(t *testing.T) {
	out, err := BootstrapBody([]byte(`{"model":"m","stream":true}`), "10.0.0.7", 8998, 1<<62+5)
	require.NoError(t, err)
	assert.JSONEq(t, `{"model":"m","stream":true,"bootstrap_host":"10.0.0.7","bootstrap_port":8998,"bootstrap_room":4611686018427387909}`, string(out))
	for host, sent := range map[string]string{"fd00::7": "[fd00::7]", "::1": "[::1]", "prefill-0.sglang": "prefill-0.sglang"} {
		out, err = BootstrapBody([]byte(`{}`), host, 8998, 3)
		require.NoError(t, err)
		assert.JSONEq(t, `{"bootstrap_host":"`+sent+`","bootstrap_port":8998,"bootstrap_room":3}`, string(out), "an IPv6 address in brackets")
	}
}

// A room's residue is the prefill's rank, whatever the random bits, and
// the room stays a non-negative int64.
func TestRoomNamesThePrefillRank(t *testing.T) {
	for _, random := range []uint64{0, 1, 12345678901234567, math.MaxUint64, math.MaxUint64 - 1, 1 << 63, 1<<63 - 1} {
		assert.Equal(t, random>>1, Room(random, 0, 1), "no ranks: 63 random bits")
		for _, dp := range []int{2, 3, 7, 8} {
			for rank := range dp {
				room := Room(random, rank, dp)
				assert.Equal(t, uint64(rank), room%uint64(dp), "random %d, rank %d of %d", random, rank, dp)
				assert.LessOrEqual(t, room, uint64(math.MaxInt64))
				assert.InDelta(t, float64(random>>1), float64(room), float64(dp), "the random bits kept but the residue")
			}
		}
	}
}
