package router

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Streams of generated tokens are timed by the request's model: from the
// request's arrival to its first event's leaving (time to first token),
// and from there to the end over the tokens after the first (time per
// output token, of streams that ended well). Whole answers, and streams
// that end before their first token, are not timed; a stream cut after
// its first token has a time to first token but no time per token.
func TestStreamsAreTimedToTheirFirstTokenAndPerToken(t *testing.T) {
	const interval = 40 * time.Millisecond // before each of 5 tokens
	opts := mocks(2, 5, interval)
	opts[1].Model = "mock-b"
	f := startFleet(t, opts, nil)
	require.Eventually(t, func() bool {
		resp, text := f.send("GET", "/v1/models", "")
		return resp.StatusCode == http.StatusOK && strings.Contains(text, "mock-b")
	}, 5*time.Second, 10*time.Millisecond)
	seconds := func(sample string) float64 {
		v, err := strconv.ParseFloat(metric(t, f, sample), 64)
		require.NoError(t, err, sample)
		return v
	}

	streams := []struct{ path, body string }{
		{"/v1/chat/completions", streamBody},
		{"/v1/chat/completions", `{"model":"mock-model","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/completions", `{"model":"mock-model","stream":true,"prompt":"hi"}`},
		{"/v1/chat/completions", `{"model":"mock-b","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`},
	}
	for _, s := range streams {
		resp, text := f.send("POST", s.path, s.body)
		require.Equal(t, http.StatusOK, resp.StatusCode, text)
		require.Equal(t, 5, strings.Count(text, `"tok`), text)
	}
	resp, text := f.send("POST", "/v1/chat/completions", chatBody)
	require.Equal(t, http.StatusOK, resp.StatusCode, text)

	// Gone before its first token: nothing timed.
	ctx, cancel := context.WithTimeout(context.Background(), interval/4)
	req, err := http.NewRequestWithContext(ctx, "POST", "http://"+f.r.Addr()+"/v1/chat/completions", strings.NewReader(streamBody))
	require.NoError(t, err)
	if resp, err := f.client.Do(req); err == nil {
		_ = resp.Body.Close()
	}
	cancel()
	// Gone after its first token: timed to it, not per token.
	resp = f.post("/v1/chat/completions", streamBody)
	first, err := bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	require.Contains(t, first, "tok0")
	require.NoError(t, resp.Body.Close())
	f.assertIdle()
	require.Eventually(t, func() bool {
		return metric(t, f, `fastroute_requests_total{route="/v1/chat/completions",mode="round-robin",outcome="cancelled"}`) == "2"
	}, 5*time.Second, 10*time.Millisecond)

	assert.Equal(t, "4", metric(t, f, `fastroute_time_to_first_token_seconds_count{model="mock-model"}`),
		"three streams and the one cut after its first token; not the whole answer nor the stream gone before")
	assert.Equal(t, "1", metric(t, f, `fastroute_time_to_first_token_seconds_count{model="mock-b"}`))
	assert.Equal(t, "3", metric(t, f, `fastroute_time_per_output_token_seconds_count{model="mock-model"}`),
		"the streams that ended well")
	assert.Equal(t, "1", metric(t, f, `fastroute_time_per_output_token_seconds_count{model="mock-b"}`))
	assert.Equal(t, "0", metric(t, f, `fastroute_time_to_first_token_seconds_bucket{model="mock-model",le="0.01"}`),
		"no first token before the engine's first pause")
	assert.Equal(t, "4", metric(t, f, `fastroute_worker_time_to_first_token_seconds_count{worker="1"}`), "mock-model's worker")
	assert.Equal(t, "1", metric(t, f, `fastroute_worker_time_to_first_token_seconds_count{worker="2"}`), "mock-b's")
	assert.Equal(t, "0", metric(t, f, `fastroute_worker_time_to_first_token_seconds_bucket{worker="1",le="0.01"}`),
		"the worker's first token comes after its first pause")
	workerTTFT := seconds(`fastroute_worker_time_to_first_token_seconds_sum{worker="1"}`) / 4
	assert.GreaterOrEqual(t, workerTTFT, interval.Seconds())
	assert.LessOrEqual(t, workerTTFT, seconds(`fastroute_time_to_first_token_seconds_sum{model="mock-model"}`)/4,
		"from the send, not from the request's arrival")

	ttft := seconds(`fastroute_time_to_first_token_seconds_sum{model="mock-model"}`) / 4
	assert.GreaterOrEqual(t, ttft, interval.Seconds(), "the first token comes after the engine's first pause")
	assert.Less(t, ttft, 25*interval.Seconds(), "and not many pauses later")
	pace := seconds(`fastroute_time_per_output_token_seconds_sum{model="mock-model"}`) / 3
	assert.GreaterOrEqual(t, pace, 0.9*interval.Seconds(),
		"4 pauses over the 4 tokens after the first: the usage's count where reported (its own event is no token)")
	assert.Less(t, pace, 10*interval.Seconds())
	assert.GreaterOrEqual(t, seconds(`fastroute_time_per_output_token_seconds_sum{model="mock-b"}`), 0.9*interval.Seconds(),
		"over the 4 completion tokens after the first its usage reported, not its 5 events after the first (the usage's own)")
}
