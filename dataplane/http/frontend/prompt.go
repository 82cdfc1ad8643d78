package frontend

import (
	"github.com/valyala/fastjson"

	"github.com/fastroute/fastroute/affinity"
	"github.com/fastroute/fastroute/dataplane"
)

// The fields that hold a generation request's prompt, in the order the
// engine's template puts them: a system prompt or instructions first,
// then the conversation or the prompt.
var promptFields = [...][]string{
	routeChat:        {"messages"},
	routeCompletions: {"prompt"},
	routeResponses:   {"instructions", "input"},
	routeMessages:    {"system", "messages"},
}

// generateFields hold the prompt of SGLang's native POST /generate.
var generateFields = []string{"text"}

// The fields of a message, or of a part of one, that carry its text (a
// role, a name, the text, an image's URL), in the order they are keyed.
var messageFields = [...]string{"role", "name", "content", "text", "image_url", "url"}

// maxPromptDepth bounds how deep a prompt's values are read: an image
// part's URL is five levels below the messages (message, content, part,
// image_url, url).
const maxPromptDepth = 5

// unitSep ends each piece of a prompt's text, so that ["ab", "c"] and
// ["a", "bc"] key apart.
var unitSep = []byte{0x1f}

// readPrompt keys the prompt of a generation request's body v for prefix
// routing (dataplane.Routing.Prefixes): its text (SGLang's /generate's
// too), read field by field in the order the engine sees it, hashed in blocks (affinity.PrefixHasher),
// seeded with the model's name. The keys go to the request routing
// places by them: the prefill leg's when the request is split, since a
// prefix cache worth finding is the prefill worker's. With
// Routing.CachedSplits the request to a decode worker (a split's decode
// leg, or a whole request) is routed by them in the decode key space, and
// a whole request records them as they are too (its worker prefills it).
// It allocates nothing once the keys' buffers have grown.
func (ex *exchange) readPrompt(rt *dataplane.Routing, v *fastjson.Value) {
	fields := generateFields
	if !ex.generate {
		if int(ex.rt) >= len(promptFields) {
			return
		}
		fields = promptFields[ex.rt]
	}
	if len(fields) == 0 {
		return
	}
	keys := &ex.req.PrefixKeys
	switch {
	case ex.split:
		keys = &ex.prefillLeg().req.PrefixKeys
	case rt.CachedSplits(): // routed in the decode key space below, recorded in both
		keys = &ex.req.RecordKeys
	}
	h := &ex.prompt
	h.Reset(ex.req.Model, rt.PrefixBlock, rt.PrefixBlocks, *keys)
	for _, f := range fields {
		writePrompt(h, v.Get(f), 0)
	}
	*keys = h.Keys()
	if rt.CachedSplits() {
		// The request (a split's decode leg) goes to a decode worker, which
		// is found by the decode key space: dataplane.Selector.SelectSplit.
		ex.req.PrefixKeys = affinity.DecodeKeys(ex.req.PrefixKeys[:0], *keys)
	}
}

// writePrompt adds the text of v to h: a string as it is, an array's
// elements in turn, an object's text fields (messageFields); numbers (a
// prompt of token ids) and the rest add nothing.
func writePrompt(h *affinity.PrefixHasher, v *fastjson.Value, depth int) {
	if v == nil || depth > maxPromptDepth {
		return
	}
	switch v.Type() {
	case fastjson.TypeString:
		h.Write(v.GetStringBytes())
		h.Write(unitSep)
	case fastjson.TypeArray:
		for _, e := range v.GetArray() {
			writePrompt(h, e, depth+1)
		}
	case fastjson.TypeObject:
		for _, f := range messageFields {
			writePrompt(h, v.Get(f), depth+1)
		}
	}
}
