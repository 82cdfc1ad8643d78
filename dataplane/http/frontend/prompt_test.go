package frontend

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fastjson"

	"github.com/fastroute/fastroute/affinity"
)

// promptKeys keys body's prompt as readPrompt does for the route.
func promptKeys(t *testing.T, rt route, body string) []uint64 {
	t.Helper()
	v, err := fastjson.Parse(body)
	require.NoError(t, err)
	var h affinity.PrefixHasher
	h.Reset(v.GetStringBytes("model"), 16, 64, nil)
	for _, f := range promptFields[rt] {
		writePrompt(&h, v.Get(f), 0)
	}
	return h.Keys()
}

// A prompt is keyed by its text, not by how its JSON is written: field
// order and spacing do not matter, each piece's end does, and the model
// seeds the keys.
func TestPromptKeysFollowTheText(t *testing.T) {
	base := promptKeys(t, routeChat, `{"model":"m","messages":[{"role":"system","content":"You answer in one short sentence."},{"role":"user","content":"Why is the sky blue?"}]}`)
	require.Len(t, base, 4)
	assert.Equal(t, base, promptKeys(t, routeChat, `{"messages": [ {"content": "You answer in one short sentence.", "role": "system"},
		{"content":"Why is the sky blue?","role":"user"} ], "model": "m", "temperature": 0.2}`))
	assert.Equal(t, base, promptKeys(t, routeChat, `{"model":"m","messages":[{"role":"system","content":[{"type":"text","text":"You answer in one short sentence."}]},{"role":"user","content":"Why is the sky blue?"}]}`),
		"a content part's text keys as a content string does")
	next := promptKeys(t, routeChat, `{"model":"m","messages":[{"role":"system","content":"You answer in one short sentence."},{"role":"user","content":"Why is the sky blue?"},{"role":"assistant","content":"Rayleigh scattering."}]}`)
	assert.Equal(t, base, next[:len(base)], "a later turn starts with the earlier one's keys")
	assert.NotEqual(t, base[0], promptKeys(t, routeChat, `{"model":"m2","messages":[{"role":"system","content":"You answer in one short sentence."},{"role":"user","content":"Why is the sky blue?"}]}`)[0])
	assert.NotEqual(t, base[1], promptKeys(t, routeChat, `{"model":"m","messages":[{"role":"system","content":"You answer in one short"},{"role":"system","content":" sentence."},{"role":"user","content":"Why is the sky blue?"}]}`)[1],
		"text cut into other pieces keys apart")

	assert.Len(t, promptKeys(t, routeCompletions, `{"model":"m","prompt":"Once upon a time, in a land far away"}`), 2)
	assert.Empty(t, promptKeys(t, routeCompletions, `{"model":"m","prompt":[101,2023,2003,1037,3231,1012,101,2023,2003,1037,3231,1012]}`), "token ids are not keyed")
	assert.Len(t, promptKeys(t, routeResponses, `{"model":"m","instructions":"Be brief and exact.","input":"What is 2+2?"}`), 2)
	assert.Len(t, promptKeys(t, routeMessages, `{"model":"m","system":"Be brief and exact.","messages":[{"role":"user","content":"What is 2+2?"}]}`), 2)
	assert.Empty(t, promptKeys(t, routeEmbeddings, `{"model":"m","input":"an embedding's input is not a prompt to cache"}`))
}

func TestKeyingAPromptDoesNotAllocate(t *testing.T) {
	v, err := fastjson.Parse(`{"model":"m","messages":[{"role":"system","content":"You answer in one short sentence."},{"role":"user","content":[{"type":"text","text":"Why is the sky blue?"},{"type":"image_url","image_url":{"url":"https://example.com/sky.png"}}]}]}`)
	require.NoError(t, err)
	var h affinity.PrefixHasher
	keys := make([]uint64, 0, 64)
	assert.Zero(t, testing.AllocsPerRun(100, func() {
		h.Reset(v.GetStringBytes("model"), 16, 64, keys)
		for _, f := range promptFields[routeChat] {
			writePrompt(&h, v.Get(f), 0)
		}
	}))
	assert.Len(t, h.Keys(), 5, "95 bytes with the image's URL: 5 blocks, 4 without")
}

// BenchmarkKeyingALongPrompt keys a 16 KB chat prompt as readPrompt does
// (blocks of 256 bytes: 64 keys).
func BenchmarkKeyingALongPrompt(b *testing.B) {
	v, err := fastjson.Parse(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("The quick brown fox jumps over the lazy dog. ", 364) + `"}]}`)
	require.NoError(b, err)
	var h affinity.PrefixHasher
	keys := make([]uint64, 0, 128)
	b.SetBytes(16 << 10)
	b.ReportAllocs()
	for b.Loop() {
		h.Reset(v.GetStringBytes("model"), 256, 128, keys)
		for _, f := range promptFields[routeChat] {
			writePrompt(&h, v.Get(f), 0)
		}
	}
}
