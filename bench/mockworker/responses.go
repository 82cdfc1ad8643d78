package mockworker

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// createResponse answers POST /v1/responses as vLLM does: a response
// object, or with "stream": true its SSE events (response.created, a
// response.output_text.delta per token, response.completed). The response
// is stored while Options.ResponsesStore is on (vLLM's
// VLLM_ENABLE_RESPONSES_API_STORE) and the request does not say "store":
// false; its "store" field says whether it was. A previous_response_id
// this worker does not hold is a 404 in vLLM's words.
func (w *Worker) createResponse(ctx *fasthttp.RequestCtx) {
	p := w.parser.Get()
	defer w.parser.Put(p)
	v, err := p.ParseBytes(ctx.PostBody())
	if err != nil {
		writeErr(ctx, fasthttp.StatusBadRequest, "invalid_request_error", "mock: bad json")
		return
	}
	prev := string(v.GetStringBytes("previous_response_id"))
	if prev != "" {
		if _, ok := w.stored.Load(prev); !ok {
			notFound(ctx, prev)
			return
		}
	}
	w.served.Add(1)
	store := w.opts.ResponsesStore && (v.Get("store") == nil || v.GetBool("store"))
	var idBytes [12]byte
	for i := range idBytes {
		idBytes[i] = byte(rand.UintN(256))
	}
	id := "resp_" + hex.EncodeToString(idBytes[:])
	model := string(v.GetStringBytes("model"))
	text := strings.TrimSpace(strings.Repeat("tok ", w.opts.Tokens))
	input := len(ctx.PostBody()) / 4 // the mock's estimate of a prompt's tokens
	usage := fmt.Sprintf(`{"input_tokens":%d,"output_tokens":%d,"total_tokens":%d}`, input, w.opts.Tokens, input+w.opts.Tokens)
	done := responseObject(id, model, prev, "completed", store, text, usage)
	if store {
		w.stored.Store(id, done)
	}
	if !v.GetBool("stream") {
		ctx.SetContentType("application/json")
		ctx.SetBody(done)
		return
	}
	ctx.SetContentType("text/event-stream")
	created := responseObject(id, model, prev, "in_progress", store, "", "null")
	interval, tokens := w.opts.TokenInterval, w.opts.Tokens
	ctx.SetBodyStreamWriter(func(bw *bufio.Writer) {
		seq := 0
		event := func(typ, rest string) bool {
			_, _ = fmt.Fprintf(bw, "event: %s\ndata: {\"type\":%q,\"sequence_number\":%d,%s}\n\n", typ, typ, seq, rest)
			seq++
			return bw.Flush() == nil
		}
		if !event("response.created", `"response":`+string(created)) {
			return
		}
		for range tokens {
			time.Sleep(interval)
			if !event("response.output_text.delta", `"delta":"tok "`) {
				return
			}
		}
		event("response.completed", `"response":`+string(done))
	})
}

// storedResponse answers the routes of one stored response, rest being the
// path after /v1/responses/: GET returns it, POST .../cancel returns it
// (the mock's responses are complete by then), DELETE forgets it. An id
// this worker does not hold is a 404 in vLLM's words.
func (w *Worker) storedResponse(ctx *fasthttp.RequestCtx, rest string) {
	id, action, _ := strings.Cut(rest, "/")
	body, ok := w.stored.Load(id)
	if !ok {
		notFound(ctx, id)
		return
	}
	switch {
	case ctx.IsGet() && action == "", ctx.IsPost() && action == "cancel":
		ctx.SetContentType("application/json")
		ctx.SetBody(body.([]byte))
	case ctx.IsDelete() && action == "":
		w.stored.Delete(id)
		ctx.SetContentType("application/json")
		ctx.SetBody(fmt.Appendf(nil, `{"id":%q,"object":"response.deleted","deleted":true}`, id))
	default:
		writeErr(ctx, fasthttp.StatusNotFound, "not_found", "mock: no such route")
	}
}

// responseObject is a Responses API response object of one output
// message, with its usage (JSON; null while in progress), as vLLM's.
func responseObject(id, model, prev, status string, store bool, text, usage string) []byte {
	prevJSON := "null"
	if prev != "" {
		prevJSON = strconv.Quote(prev)
	}
	output := "[]"
	if text != "" {
		output = fmt.Sprintf(`[{"type":"message","id":"msg_%s","role":"assistant","status":"completed","content":[{"type":"output_text","text":%q,"annotations":[]}]}]`,
			id[len("resp_"):], text)
	}
	return fmt.Appendf(nil, `{"id":%q,"object":"response","created_at":%d,"model":%q,"status":%q,"store":%t,"previous_response_id":%s,"output":%s,"usage":%s}`,
		id, time.Now().Unix(), model, status, store, prevJSON, output, usage)
}

// notFound is vLLM's answer to a response id it does not hold.
func notFound(ctx *fasthttp.RequestCtx, id string) {
	writeErr(ctx, fasthttp.StatusNotFound, "invalid_request_error", fmt.Sprintf("Response with id '%s' not found.", id))
}
