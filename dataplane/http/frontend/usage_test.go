package frontend

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/valyala/fastjson"
)

func TestTheUsageOfAnAnswerIsRead(t *testing.T) {
	for _, tc := range []struct {
		name               string
		data               []string // read in turn, as a stream's bytes pass
		prompt, completion int64
	}{
		{"chat", []string{`{"id":"c","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":9,"total_tokens":12,"completion_tokens":3,"prompt_tokens_details":null}}`}, 9, 3},
		{"spaced, as Python's json.dumps writes", []string{`{"usage" : { "prompt_tokens": 7, "completion_tokens": 2 } }`}, 7, 2},
		{"embeddings", []string{`{"data":[{"embedding":[0.1]}],"usage":{"prompt_tokens":5,"total_tokens":5}}`}, 5, -1},
		{"responses", []string{`{"id":"resp_1","output":[],"usage":{"input_tokens":11,"output_tokens":4,"input_tokens_details":{"cached_tokens":0}}}`}, 11, 4},
		{"a usage named in a string is no usage", []string{`{"choices":[{"text":"say \"usage\":{\"prompt_tokens\":99}"}],"usage":{"prompt_tokens":1,"completion_tokens":2}}`}, 1, 2},
		{"a string holding braces", []string{`{"usage":{"note":"} {","prompt_tokens":3,"completion_tokens":4}}`}, 3, 4},
		{"no usage", []string{`{"choices":[]}`}, -1, -1},
		{"usage null, as OpenAI's chunks before the last", []string{`data: {"choices":[{"delta":{"content":"a"}}],"usage":null}` + "\n\n"}, -1, -1},
		{"a stream's final usage chunk", []string{
			`data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n",
			`data: {"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":8,"total_tokens":28}}` + "\n\ndata: [DONE]\n\n",
		}, 20, 8},
		{"continuous usage stats: the last totals", []string{
			`data: {"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":1}}` + "\n\n" + `data: {"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":2}}` + "\n\n",
			`data: {"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":3}}` + "\n\n",
		}, 20, 3},
		{"anthropic: input in the first event, output in a later one", []string{
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":12,\"output_tokens\":1}}}\n\n",
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":15}}\n\n",
		}, 12, 15},
		{"cut between two reads: not read", []string{`data: {"choices":[],"usage":{"prompt_tokens":20,"comp`, `letion_tokens":8}}` + "\n\n"}, -1, -1},
		{"not counts", []string{`{"usage":{"prompt_tokens":"9","completion_tokens":-3}}`}, -1, -1},
		{"a string ending in usage after the usage", []string{`{"usage":{"prompt_tokens":4,"completion_tokens":5},"note":"a\"usage"}`}, 4, 5},
		{"a name holding usage", []string{`{"usage":{"prompt_tokens":4,"completion_tokens":5},"a\"usage":{"prompt_tokens":99}}`}, 4, 5},
		{"an escaped backslash before a real quote", []string{`{"note":"a\\","usage":{"prompt_tokens":6,"completion_tokens":1}}`}, 6, 1},
		{"the last whole usage of a read", []string{
			`data: {"usage":{"prompt_tokens":20,"completion_tokens":1}}` + "\n\n" + `data: {"usage":{"prompt_tokens":20,"compl`}, 20, 1},
	} {
		var u tokenUsage
		u.reset()
		var p fastjson.Parser
		for _, d := range tc.data {
			u.scan(&p, []byte(d))
		}
		assert.Equal(t, tokenUsage{prompt: tc.prompt, completion: tc.completion}, u, tc.name)
	}
}

func TestReadingAUsageAllocatesNothing(t *testing.T) {
	var u tokenUsage
	var p fastjson.Parser
	data := []byte(`data: {"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":8,"total_tokens":28}}` + "\n\n")
	u.scan(&p, data)
	assert.Zero(t, testing.AllocsPerRun(1000, func() { u.scan(&p, data) }))
	assert.Equal(t, tokenUsage{prompt: 20, completion: 8}, u)
}

// A stream that says no usage is charged its data lines as completion
// tokens, [DONE] and text that only looks like a line aside, and its
// request's body at 4 bytes a token as its prompt; one that says its
// usage is charged that.
func TestAStreamWithoutUsageIsChargedItsEvents(t *testing.T) {
	var u tokenUsage
	u.reset()
	u.bodyBytes = 410
	for _, d := range []string{
		"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n",
		"data: {\"choices\":[{\"delta\":{\"content\":\"a\\ndata: b\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"c\"}}]}\n\n",
		"data: {\"choices\":[{\"delta\":{}}]}\n\ndata: [DONE]\n\n",
		"data: [DONE]\r\n\r\n", // a second [DONE] alone, CRLF-framed
	} {
		u.countEvents([]byte(d))
	}
	prompt, completion := u.charged()
	assert.Equal(t, uint64(102), prompt)
	assert.Equal(t, uint64(4), completion)
	u.prompt, u.completion = 30, 7
	prompt, completion = u.charged()
	assert.Equal(t, uint64(30), prompt, "a usage said wins")
	assert.Equal(t, uint64(7), completion)
	u.reset()
	u.bodyBytes = 410
	prompt, completion = u.charged()
	assert.Zero(t, prompt+completion, "a whole answer without usage is charged nothing")
}

// FuzzTheUsageOfAnAnswer builds answers around any text (which JSON
// escapes: "usage", quotes, braces and backslashes included), as a value
// before and after the usage object and as a name, compact or indented,
// whole or as a stream's event: the scan reads exactly the usage put in.
// (A usage object nested after the answer's own would be read instead:
// no engine's answer has one. Nor has one a second "usage" member, which
// the text "usage" as a name would make: the scan takes the last, as
// JSON parsers take a repeated name's last value, and that input, which
// make fuzz found, is skipped.)
// On raw bytes it never fails and reads no negative count.
func FuzzTheUsageOfAnAnswer(f *testing.F) {
	f.Add("hi", uint32(9), uint32(3), false, []byte(`{"usage":{"prompt_tokens":1}}`))
	f.Add(`a"usage`, uint32(0), uint32(7), true, []byte(`{"usage":{`))
	f.Add(`"usage":{"prompt_tokens":99}} \`, uint32(12), uint32(0), false, []byte(`"\\"usage":{"prompt_tokens":2}`))
	f.Fuzz(func(t *testing.T, text string, prompt, completion uint32, indent bool, raw []byte) {
		var p fastjson.Parser
		var u tokenUsage
		u.reset()
		u.scan(&p, raw)
		if u.prompt < -1 || u.completion < -1 {
			t.Fatalf("negative counts %+v from %q", u, raw)
		}
		quoted, err := json.Marshal(text)
		if err != nil || text == "usage" {
			t.Skip()
		}
		doc := []byte(fmt.Sprintf(`{%s:[%s],"choices":[{"message":{"content":%s}}],"usage":{"prompt_tokens":%d,"completion_tokens":%d},"note":%s,%s:{"tokens":0}}`,
			quoted, quoted, quoted, prompt, completion, quoted, quoted))
		if !json.Valid(doc) {
			t.Fatalf("built an invalid document %s", doc)
		}
		for _, answer := range [][]byte{doc, indented(doc, indent), append(append([]byte("data: "), doc...), "\n\n"...)} {
			u.reset()
			u.scan(&p, answer)
			if u != (tokenUsage{prompt: int64(prompt), completion: int64(completion)}) {
				t.Fatalf("read %+v from %s", u, answer)
			}
		}
	})
}

// indented is doc indented when indent, else doc.
func indented(doc []byte, indent bool) []byte {
	if !indent {
		return doc
	}
	var b bytes.Buffer
	if err := json.Indent(&b, doc, "", "  "); err != nil {
		panic(err)
	}
	return b.Bytes()
}
