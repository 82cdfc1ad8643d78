package mockworker

import (
	"encoding/base64"
	"fmt"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"
	"golang.org/x/net/websocket"
)

// vLLM's realtime transcription API in miniature, at GET /v1/realtime over
// WebSocket (x/net's server, through fasthttp's net/http adaptor, which
// lets it take the connection over): session.created on open, a
// transcription.delta for each input_audio_buffer.append, and on a final
// input_audio_buffer.commit a transcription.done, then the close.

// realtimeEvent is a client's event: its type, an append's base64 audio,
// a commit's final flag.
type realtimeEvent struct {
	Type  string `json:"type"`
	Audio string `json:"audio"`
	Final bool   `json:"final"`
}

// newRealtime returns the handler of w's realtime sessions.
func newRealtime(w *Worker) fasthttp.RequestHandler {
	return fasthttpadaptor.NewFastHTTPHandler(websocket.Server{Handler: w.realtime})
}

// realtime serves one session: each append's audio counts, and is
// answered with a delta naming the bytes heard so far.
func (w *Worker) realtime(ws *websocket.Conn) {
	w.served.Add(1)
	w.conns.Store(ws, struct{}{}) // Kill cuts it
	defer w.conns.Delete(ws)
	created := map[string]any{"type": "session.created", "worker": w.opts.ID, "model": w.opts.Model}
	if websocket.JSON.Send(ws, created) != nil {
		return
	}
	heard, deltas := 0, 0
	for {
		var ev realtimeEvent
		if websocket.JSON.Receive(ws, &ev) != nil {
			return
		}
		switch ev.Type {
		case "input_audio_buffer.append":
			audio, err := base64.StdEncoding.DecodeString(ev.Audio)
			if err != nil {
				_ = websocket.JSON.Send(ws, map[string]any{"type": "error", "error": map[string]string{"message": "audio is not base64"}})
				continue
			}
			heard += len(audio)
			deltas++
			if websocket.JSON.Send(ws, map[string]any{"type": "transcription.delta", "delta": fmt.Sprintf("tok%d ", deltas)}) != nil {
				return
			}
		case "input_audio_buffer.commit":
			if ev.Final {
				_ = websocket.JSON.Send(ws, map[string]any{"type": "transcription.done", "worker": w.opts.ID,
					"usage": map[string]int{"input_audio_bytes": heard, "output_tokens": deltas}})
				return
			}
		}
	}
}
