package frontend

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"

	"github.com/valyala/fasthttp"
)

// requestIDKey is headerRequestID, set on answers without normalizing.
var requestIDKey = []byte(headerRequestID)

// stampRequestID, with GenerateRequestIDs on, gives a request that came
// without an X-Request-Id one made up (128 random bits in 32 hex digits,
// nginx's $request_id), which its worker gets as the client's would be
// (vLLM's --enable-request-id-headers takes it as the request's id), and
// has the answer carry the request's id, the client's or the one made up.
func stampRequestID(ctx *fasthttp.RequestCtx) {
	id := ctx.Request.Header.Peek(headerRequestID)
	if len(id) == 0 {
		var raw [16]byte
		binary.LittleEndian.PutUint64(raw[:8], rand.Uint64())
		binary.LittleEndian.PutUint64(raw[8:], rand.Uint64())
		var text [32]byte
		hex.Encode(text[:], raw[:])
		ctx.Request.Header.SetBytesV(headerRequestID, text[:])
		id = ctx.Request.Header.Peek(headerRequestID)
	}
	ctx.Response.Header.SetCanonical(requestIDKey, id)
}

// answerRequestID has a worker's answer carry the request's id in place of
// any the worker sent (vLLM echoes the one it got, in its own case).
func answerRequestID(ctx *fasthttp.RequestCtx) {
	dropWhere(&ctx.Response.Header, func(k []byte) bool { return bytes.EqualFold(k, requestIDKey) })
	ctx.Response.Header.SetCanonical(requestIDKey, ctx.Request.Header.Peek(headerRequestID))
}
