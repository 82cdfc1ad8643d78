package frontend

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// A key among a WebSocket request's subprotocols is found wherever it is,
// and the others are kept, in order, for the worker.
func TestSubprotocolKey(t *testing.T) {
	for _, tc := range []struct{ offered, key, rest string }{
		{"realtime, openai-insecure-api-key.sk-1", "sk-1", "realtime"},
		{"openai-insecure-api-key.sk-1,realtime,  json ", "sk-1", "realtime, json"},
		{"a, openai-insecure-api-key.sk-1, b, openai-insecure-api-key.sk-2", "sk-1", "a, b, openai-insecure-api-key.sk-2"},
		{"openai-insecure-api-key.sk-1", "sk-1", ""},
	} {
		key, rest := subprotocolKey([]byte(tc.offered))
		assert.Equal(t, tc.key, string(key), tc.offered)
		assert.Equal(t, tc.rest, string(rest), tc.offered)
		assert.NotNil(t, rest, "a key was named: the rest is offered on, maybe empty")
	}
	for _, offered := range []string{"", "realtime", "realtime, openai-insecure-api-keysk"} {
		key, rest := subprotocolKey([]byte(offered))
		assert.Nil(t, key, offered)
		assert.Nil(t, rest, "no key: the header stays as it is")
	}
}
