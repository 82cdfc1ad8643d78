package mockworker

import (
	"encoding/base64"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/websocket"
)

// A realtime session as vLLM's API has it: created on open, a delta per
// append, done and the close on a final commit; a Kill cuts one open.
func TestRealtimeSession(t *testing.T) {
	w := startEngine(t, Options{ID: 3})
	ws, err := websocket.Dial("ws://"+w.Addr()+"/v1/realtime", "", "http://localhost/")
	require.NoError(t, err)
	defer ws.Close()
	require.NoError(t, ws.SetDeadline(time.Now().Add(5*time.Second)))
	var ev map[string]any
	require.NoError(t, websocket.JSON.Receive(ws, &ev))
	assert.Equal(t, map[string]any{"type": "session.created", "worker": 3.0, "model": "mock-model"}, ev)
	audio := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("pcm", 100)))
	for i := 1; i <= 3; i++ {
		require.NoError(t, websocket.JSON.Send(ws, map[string]any{"type": "input_audio_buffer.append", "audio": audio}))
		ev = nil
		require.NoError(t, websocket.JSON.Receive(ws, &ev))
		assert.Equal(t, "transcription.delta", ev["type"])
	}
	require.NoError(t, websocket.JSON.Send(ws, map[string]any{"type": "input_audio_buffer.commit", "final": true}))
	ev = nil
	require.NoError(t, websocket.JSON.Receive(ws, &ev))
	assert.Equal(t, "transcription.done", ev["type"])
	assert.Equal(t, map[string]any{"input_audio_bytes": 900.0, "output_tokens": 3.0}, ev["usage"])
	assert.ErrorIs(t, websocket.JSON.Receive(ws, &ev), io.EOF, "the session closes")
	assert.EqualValues(t, 1, w.Served())

	open, err := websocket.Dial("ws://"+w.Addr()+"/v1/realtime", "", "http://localhost/")
	require.NoError(t, err)
	defer open.Close()
	require.NoError(t, open.SetDeadline(time.Now().Add(5*time.Second)))
	require.NoError(t, websocket.JSON.Receive(open, &ev))
	w.Kill()
	assert.Error(t, websocket.JSON.Receive(open, &ev), "a killed worker's session is cut")
}
