package router

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fastroute/fastroute/affinity"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// With a retry budget, a request moves to another worker only while the
// budget's share of requests are not all on a retry: one retry held (its
// worker holds it), the next request whose worker is dead gets a 502 that
// says the budget was spent instead of a retry; once the first ends, the
// next retries again; a reload that turns the budget off retries every
// one. Occupancy and the budget's counts return to zero.
func TestTheRetryBudgetCapsTheRequestsOnARetry(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free)
	alive := startEngine(t, func(w http.ResponseWriter, _ *http.Request, body map[string]any) {
		if strings.Contains(fmt.Sprint(body["messages"]), "hold") {
			<-release
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"object":"chat.completion","choices":[]}`)
	})
	dead := deadAddr(t)
	f := startFleet(t, nil, func(c *config.Config) {
		c.Health.Interval = time.Hour // keep the dead worker routable
		c.Health.EjectAfter = 0
		c.Router.Mode = "least-loaded"
		c.Router.RetryBudget = config.RetryBudget{Percent: 10, MinRetries: 1}
		c.Workers = append(c.Workers, dataplane.WorkerSpec{ID: 1, URL: "http://" + dead}, dataplane.WorkerSpec{ID: 2, URL: alive.URL})
	})
	// Sessions every router places on the dead worker: their requests go
	// there first, then retry on the live one.
	var sessions []string
	for i := 0; len(sessions) < 8; i++ {
		s := fmt.Sprintf("s%d", i)
		if id, _ := f.r.Registry.Snapshot().Rendezvous(affinity.Key([]byte(s)), dataplane.PhaseDecode, nil); id == 1 {
			sessions = append(sessions, s)
		}
	}
	send := func(session, prompt string) (int, string) {
		code, _, text := f.do("POST", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"`+prompt+`"}]}`, "x-session-id", session)
		return code, text
	}

	held := make(chan int, 1)
	go func() {
		code, _ := send(sessions[0], "hold")
		held <- code
	}()
	require.Eventually(t, func() bool { return metric(t, f, "fastroute_retrying_requests") == "1" }, 5*time.Second, 5*time.Millisecond)
	code, text := send(sessions[1], "hi")
	assert.Equal(t, http.StatusBadGateway, code)
	assert.Contains(t, text, "worker 1 failed before answering")
	assert.Contains(t, text, "not retried: the retry budget is spent")
	assert.Equal(t, "1", metric(t, f, "fastroute_retries_refused_total"))

	free()
	assert.Equal(t, http.StatusOK, <-held, "the request on its retry was served")
	require.Eventually(t, func() bool { return metric(t, f, "fastroute_retrying_requests") == "0" }, 5*time.Second, 5*time.Millisecond)
	code, text = send(sessions[2], "hi")
	assert.Equal(t, http.StatusOK, code, "no request on a retry: this one may: %s", text)

	next := f.r.CurrentConfig()
	next.Router.RetryBudget.Percent = 0
	applied, _, err := f.r.Reload(next)
	require.NoError(t, err)
	assert.Contains(t, strings.Join(applied, " "), "router.retry_budget")
	var wg sync.WaitGroup
	codes := make(chan int, 5)
	for _, s := range sessions[3:] {
		wg.Go(func() {
			code, _ := send(s, "hi")
			codes <- code
		})
	}
	wg.Wait()
	close(codes)
	for code := range codes {
		assert.Equal(t, http.StatusOK, code, "no budget: every request retries")
	}
	assert.Equal(t, "1", metric(t, f, "fastroute_retries_refused_total"))
	assert.Equal(t, "0", metric(t, f, "fastroute_retrying_requests"))
	f.assertIdle()
}
