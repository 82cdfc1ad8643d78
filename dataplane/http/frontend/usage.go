package frontend

import (
	"bytes"

	"github.com/valyala/fastjson"
)

// tokenUsage is what an answer says it used, in its "usage" object:
// OpenAI's prompt_tokens and completion_tokens (chat, completions,
// embeddings), or input_tokens and output_tokens (the Responses API,
// Anthropic's messages). -1: not said. For a stream that says neither,
// its data lines (events) estimate its completion tokens and its
// request's body (bodyBytes) its prompt's.
type tokenUsage struct{ prompt, completion, events, bodyBytes int64 }

func (u *tokenUsage) reset() { *u = tokenUsage{prompt: -1, completion: -1} }

// bytesPerToken is the estimate of a prompt's tokens from its request's
// body: about 4 bytes of English text a token, as OpenAI's guidance and
// the mock engines have it.
const bytesPerToken = 4

var lineData, lineDone = []byte("\ndata:"), []byte("\ndata: [DONE]")

// countEvents counts the data lines of an event stream's bytes (a line
// that begins the bytes counts too), but for its [DONE], which only ends
// a stream: vLLM and SGLang send a token an event unless asked to batch
// them, so the count estimates the completion tokens of a stream whose
// client did not ask for its usage (stream_options.include_usage). A
// newline inside an event's JSON is escaped, so its text cannot pass for
// a line.
func (u *tokenUsage) countEvents(data []byte) {
	n := bytes.Count(data, lineData)
	if bytes.HasPrefix(data, lineData[1:]) {
		n++
	}
	if n > 0 && bytes.HasSuffix(bytes.TrimRight(data, "\r\n"), lineDone[1:]) {
		n--
	}
	u.events += int64(n)
}

// charged returns the prompt and completion tokens to charge: those the
// answer said; for a stream that said neither, the estimates of its
// events and its request's body.
func (u *tokenUsage) charged() (prompt, completion uint64) {
	if u.prompt < 0 && u.completion < 0 && u.events > 0 {
		return uint64(u.bodyBytes / bytesPerToken), uint64(u.events)
	}
	return uint64(max(u.prompt, 0)), uint64(max(u.completion, 0))
}

var usageName = []byte(`"usage"`)

// scan reads the last usage object in data: a whole answer, or the bytes
// of a streamed one as they pass. The counts it holds replace those read
// before, since a stream reports them as totals so far (OpenAI's final
// usage chunk, vLLM's continuous usage stats, Anthropic's input tokens in
// its first event and output tokens in a later one). "usage" counts as a
// name only (a quote inside a JSON string is escaped) and followed by an
// object; a usage object cut between two reads of a stream is not read
// (engines write an event whole), an earlier whole one in the same bytes
// is. It allocates nothing once p has grown.
func (u *tokenUsage) scan(p *fastjson.Parser, data []byte) {
	for end := len(data); ; {
		i := bytes.LastIndex(data[:end], usageName)
		if i < 0 {
			return
		}
		end = i
		if escaped(data, i) {
			continue
		}
		j := spaceEnd(data, i+len(usageName))
		if j >= len(data) || data[j] != ':' {
			continue
		}
		if j = spaceEnd(data, j+1); j >= len(data) || data[j] != '{' {
			continue
		}
		objEnd := valueEnd(data, j)
		if objEnd < 0 {
			continue
		}
		v, err := p.ParseBytes(data[j:objEnd])
		if err != nil {
			continue
		}
		if n, ok := tokenCount(v, "prompt_tokens", "input_tokens"); ok {
			u.prompt = n
		}
		if n, ok := tokenCount(v, "completion_tokens", "output_tokens"); ok {
			u.completion = n
		}
		return
	}
}

// tokenCount is the first of the named fields of v that is a count.
func tokenCount(v *fastjson.Value, names ...string) (int64, bool) {
	for _, name := range names {
		if f := v.Get(name); f != nil {
			if n, err := f.Int64(); err == nil && n >= 0 {
				return n, true
			}
		}
	}
	return 0, false
}
