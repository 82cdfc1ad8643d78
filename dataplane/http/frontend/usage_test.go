package frontend

import (
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
	} {
		var u tokenUsage
		u.reset()
		var p fastjson.Parser
		for _, d := range tc.data {
			u.scan(&p, []byte(d))
		}
		assert.Equal(t, tokenUsage{tc.prompt, tc.completion}, u, tc.name)
	}
}

func TestReadingAUsageAllocatesNothing(t *testing.T) {
	var u tokenUsage
	var p fastjson.Parser
	data := []byte(`data: {"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":8,"total_tokens":28}}` + "\n\n")
	u.scan(&p, data)
	assert.Zero(t, testing.AllocsPerRun(1000, func() { u.scan(&p, data) }))
	assert.Equal(t, tokenUsage{20, 8}, u)
}
