package router

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// queued starts a fleet of n mock workers answering in 4 chunks 100 ms
// apart (400 ms), each taking one request at a time, with the wait queue on.
func queued(t *testing.T, n, size int, timeout time.Duration) *fleet {
	return startFleet(t, mocks(n, 4, 100*time.Millisecond), func(c *config.Config) {
		c.Router.BusyThreshold = 1
		c.Router.Queue = config.Queue{Size: size, Timeout: timeout}
	})
}

// metric returns the value of one sample line of /metrics ("" if absent).
func metric(t *testing.T, f *fleet, sample string) string {
	t.Helper()
	_, text := adminDo(t, f, "GET", "/metrics", "", "")
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			return v
		}
	}
	return ""
}

// A request that finds its worker busy waits in the queue and is served
// once the worker frees its slot, instead of a 429; a request beyond the
// queue's size is a 429 at once; a query-only request never waits.
func TestABusyWorkerQueuesTheNextRequest(t *testing.T) {
	f := queued(t, 1, 1, 5*time.Second)
	// Timed from before the first request is sent: the worker sleeps
	// 100 ms before each of a request's 4 tokens, so the second, served
	// once the first is done, ends 800 ms after this at the least. (Timed
	// from the first's head, which comes with its first token, the bound
	// was 700 ms less the head's own delivery, missed under load.)
	start := time.Now()
	first := f.post("/v1/chat/completions", streamBody)
	require.Equal(t, http.StatusOK, first.StatusCode)

	second := make(chan *http.Response, 1)
	go func() { second <- f.post("/v1/chat/completions", chatBody) }()
	require.Eventually(t, func() bool { return metric(t, f, "fastroute_queued_requests") == "1" }, 2*time.Second, 5*time.Millisecond)

	full := f.post("/v1/chat/completions", chatBody)
	text := readAll(t, full)
	assert.Equal(t, http.StatusTooManyRequests, full.StatusCode)
	assert.Equal(t, "1", full.Header.Get("Retry-After"))
	assert.Contains(t, text, "the router's queue is full")
	query := f.post("/v1/chat/completions", chatBody, "x-query-instance-id", "true")
	assert.Equal(t, http.StatusTooManyRequests, query.StatusCode, "a query-only pick does not wait")
	readAll(t, query)

	readAll(t, first)
	resp := <-second
	body := readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.GreaterOrEqual(t, time.Since(start), 800*time.Millisecond, "it waited for the first answer (400 ms) and took its own")
	assert.Equal(t, "0", metric(t, f, "fastroute_queued_requests"))
	assert.Equal(t, "1", metric(t, f, "fastroute_queue_full_total"))
	assert.Equal(t, "1", metric(t, f, "fastroute_queue_wait_seconds_count"))
	f.assertIdle()
}

// A reload's larger queue holds more waiters, from the next arrival on.
func TestAReloadResizesTheQueue(t *testing.T) {
	f := queued(t, 1, 1, 5*time.Second)
	next := f.r.CurrentConfig()
	next.Router.Queue.Size = 2
	applied, _, err := f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"router.queue.size=2 router.queue.timeout=5s"}, applied)
	first := f.post("/v1/chat/completions", streamBody)
	require.Equal(t, http.StatusOK, first.StatusCode)
	waiters := make(chan *http.Response, 2)
	for range 2 {
		go func() { waiters <- f.post("/v1/chat/completions", chatBody) }()
	}
	require.Eventually(t, func() bool { return metric(t, f, "fastroute_queued_requests") == "2" }, 2*time.Second, 5*time.Millisecond,
		"two wait where one did")
	readAll(t, first)
	for range 2 {
		resp := <-waiters
		body := readAll(t, resp)
		assert.Equal(t, http.StatusOK, resp.StatusCode, body)
	}
	assert.Equal(t, "0", metric(t, f, "fastroute_queue_full_total"))
	f.assertIdle()
}

// A reload turns the queue on (the next request that finds its worker
// busy waits, where it had a 429 at once) and off (the next has a 429 at
// once; one waiting keeps its place and is served when the slot frees).
func TestAReloadTurnsTheQueueOnAndOff(t *testing.T) {
	f := queued(t, 1, 0, 0)
	first := f.post("/v1/chat/completions", streamBody)
	require.Equal(t, http.StatusOK, first.StatusCode)
	busy := f.post("/v1/chat/completions", chatBody)
	text := readAll(t, busy)
	assert.Equal(t, http.StatusTooManyRequests, busy.StatusCode, "no queue: a 429 at once")
	assert.NotContains(t, text, "queue")

	next := f.r.CurrentConfig()
	next.Router.Queue = config.Queue{Size: 1, Timeout: 5 * time.Second}
	applied, needRestart, err := f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"router.queue.size=1 router.queue.timeout=5s"}, applied)
	assert.Empty(t, needRestart)
	waiter := make(chan *http.Response, 1)
	go func() { waiter <- f.post("/v1/chat/completions", chatBody) }()
	require.Eventually(t, func() bool { return metric(t, f, "fastroute_queued_requests") == "1" }, 2*time.Second, 5*time.Millisecond,
		"the queue is on: it waits")

	next.Router.Queue.Size = 0
	applied, needRestart, err = f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"router.queue.size=0 router.queue.timeout=5s"}, applied)
	assert.Empty(t, needRestart)
	assert.Equal(t, 0, f.r.CurrentConfig().Router.Queue.Size)
	start := time.Now()
	busy = f.post("/v1/chat/completions", chatBody)
	text = readAll(t, busy)
	assert.Equal(t, http.StatusTooManyRequests, busy.StatusCode, "off again: a 429 at once")
	assert.NotContains(t, text, "queue")
	assert.Less(t, time.Since(start), 300*time.Millisecond, "not after a wait")

	readAll(t, first)
	resp := <-waiter
	body := readAll(t, resp)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the waiter kept its place: %s", body)
	assert.Equal(t, "0", metric(t, f, "fastroute_queued_requests"))
	assert.Equal(t, "0", metric(t, f, "fastroute_queue_full_total"))
	f.assertIdle()
}

// A request still waiting at the queue's timeout gets the 429 it would have
// had at once, saying how long it waited (the timeout here a reload's).
func TestAQueuedRequestTimesOut(t *testing.T) {
	f := queued(t, 1, 4, time.Minute)
	next := f.r.CurrentConfig()
	next.Router.Queue.Timeout = 150 * time.Millisecond
	applied, needRestart, err := f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"router.queue.size=4 router.queue.timeout=150ms"}, applied)
	assert.Empty(t, needRestart)
	first := f.post("/v1/chat/completions", streamBody)
	start := time.Now()
	resp := f.post("/v1/chat/completions", chatBody)
	text := readAll(t, resp)
	waited := time.Since(start)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Contains(t, text, "waited 150ms in the router's queue")
	assert.GreaterOrEqual(t, waited, 150*time.Millisecond)
	assert.Less(t, waited, 380*time.Millisecond, "answered at the timeout, not when the worker freed")
	assert.Equal(t, "1", metric(t, f, "fastroute_queue_timeouts_total"))
	readAll(t, first)
	f.assertIdle()
}

// A client that leaves while its request waits is gone from the queue at
// once (counted cancelled, 499 in the access log) and never reaches a
// worker.
func TestAClientThatLeavesTheQueue(t *testing.T) {
	f := queued(t, 1, 4, 5*time.Second)
	first := f.post("/v1/chat/completions", streamBody)
	c, err := net.Dial("tcp", f.r.Addr())
	require.NoError(t, err)
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(chatBody), chatBody)
	require.Eventually(t, func() bool { return metric(t, f, "fastroute_queued_requests") == "1" }, 2*time.Second, 5*time.Millisecond)
	require.NoError(t, c.Close())
	require.Eventually(t, func() bool { return metric(t, f, "fastroute_queued_requests") == "0" }, time.Second, 5*time.Millisecond,
		"the client's hang-up takes it out of the queue before the worker frees")
	assert.EqualValues(t, 1, f.r.Frontend.Metrics().Requests("/v1/chat/completions", "cancelled"))
	readAll(t, first)
	f.assertIdle()
	assert.EqualValues(t, 1, f.mocks[0].Served(), "only the first request reached the worker")
}

// Under a burst four times the fleet's slots, every request waits its turn
// and is served, no worker ever holds more than its one slot, and every
// count returns to zero.
func TestABurstDrainsThroughTheQueue(t *testing.T) {
	f := startFleet(t, mocks(2, 2, 20*time.Millisecond), func(c *config.Config) {
		c.Router.BusyThreshold = 1
		c.Router.Queue = config.Queue{Size: 64, Timeout: 10 * time.Second}
	})
	var wg sync.WaitGroup
	var most [2]int64
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case <-stop:
				return
			default:
			}
			for i, m := range f.mocks {
				most[i] = max(most[i], m.Active())
			}
			time.Sleep(time.Millisecond)
		}
	}()
	codes := make(chan int, 8)
	for i := 0; i < 8; i++ {
		wg.Go(func() {
			body := chatBody
			if i%2 == 0 {
				body = streamBody
			}
			resp := f.post("/v1/chat/completions", body)
			readAll(t, resp)
			codes <- resp.StatusCode
		})
	}
	wg.Wait()
	close(stop)
	<-watched
	close(codes)
	for code := range codes {
		assert.Equal(t, http.StatusOK, code)
	}
	assert.LessOrEqual(t, most[0], int64(1))
	assert.LessOrEqual(t, most[1], int64(1))
	assert.Equal(t, "0", metric(t, f, "fastroute_queued_requests"))
	f.assertIdle()
}

// With router.retry_statuses, a worker's answer of such a status moves the
// request to another worker before anything reaches the client, streamed
// requests too; with every worker failing, the client gets the last
// worker's own answer (not a 502), and every count returns to zero.
func TestAnAnswerOfARetryStatusMovesTheRequest(t *testing.T) {
	opts := mocks(2, 2, 0)
	opts[0].FailRate = 1 // worker 1 answers every request 500
	f := startFleet(t, opts, func(c *config.Config) {
		c.Router.RetryStatuses = []int{500, 503}
		c.Health.EjectAfter = 1000 // keep worker 1 in rotation
	})
	for i := 0; i < 6; i++ {
		body := chatBody
		if i%2 == 1 {
			body = streamBody
		}
		resp := f.post("/v1/chat/completions", body)
		text := readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode, text)
		assert.Equal(t, "2", resp.Header.Get("x-fastroute-worker"))
	}
	retries := f.r.Frontend.Metrics().Retries()
	assert.True(t, retries >= 3 && retries <= 6, "each request that met worker 1 first moved once: %d", retries)
	f.assertIdle()

	g := startFleet(t, []mockworker.Options{{ID: 1, FailRate: 1}, {ID: 2, FailRate: 1}}, func(c *config.Config) {
		c.Router.RetryStatuses = []int{500}
		c.Health.EjectAfter = 1000
	})
	resp := g.post("/v1/chat/completions", chatBody)
	text := readAll(t, resp)
	assert.Equal(t, http.StatusInternalServerError, resp.StatusCode)
	assert.Contains(t, text, "mock: injected failure", "the last worker's own answer")
	assert.EqualValues(t, 1, g.r.Frontend.Metrics().Retries(), "tried both workers once")
	g.assertIdle()

	h := startFleet(t, []mockworker.Options{{ID: 1, FailRate: 1}, {ID: 2}}, func(c *config.Config) {
		c.Health.EjectAfter = 1000
	})
	codes := map[int]int{}
	for range 4 {
		resp := h.post("/v1/chat/completions", chatBody)
		readAll(t, resp)
		codes[resp.StatusCode]++
	}
	assert.Equal(t, map[int]int{200: 2, 500: 2}, codes, "without retry_statuses a 500 reaches the client")
	cfg := h.r.CurrentConfig()
	cfg.Router.RetryStatuses = []int{500}
	applied, needRestart, err := h.r.Reload(cfg)
	require.NoError(t, err)
	assert.Equal(t, []string{"router.retry_statuses=[500]"}, applied)
	assert.Empty(t, needRestart)
	for range 4 {
		resp := h.post("/v1/chat/completions", chatBody)
		text := readAll(t, resp)
		assert.Equal(t, http.StatusOK, resp.StatusCode, "a reload's retry_statuses move the next requests: %s", text)
	}
	h.assertIdle()
}

// prioritized is a chat request with vLLM's priority field.
func prioritized(priority int) string {
	return fmt.Sprintf(`{"model":"mock-model","priority":%d,"messages":[{"role":"user","content":"hi"}]}`, priority)
}

// Waiters go to a freed worker by priority (lower is sooner, as vLLM
// has it), not by arrival.
func TestTheQueueServesLowerPriorityFirst(t *testing.T) {
	f := queued(t, 1, 4, 10*time.Second)
	first := f.post("/v1/chat/completions", streamBody)
	require.Equal(t, http.StatusOK, first.StatusCode)
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i, p := range []int{5, 0, -3} { // arrive worst first
		wg.Go(func() {
			resp := f.post("/v1/chat/completions", prioritized(p))
			text := readAll(t, resp)
			assert.Equal(t, http.StatusOK, resp.StatusCode, text)
			mu.Lock()
			order = append(order, p)
			mu.Unlock()
		})
		require.Eventually(t, func() bool { return metric(t, f, "fastroute_queued_requests") == fmt.Sprint(i+1) }, 2*time.Second, 5*time.Millisecond)
	}
	readAll(t, first)
	wg.Wait()
	assert.Equal(t, []int{-3, 0, 5}, order, "served by priority, one at a time")
	f.assertIdle()
}

// A request that finds the queue full takes the place of a waiter of
// higher priority, which gets the 429; one that goes before nobody gets
// it itself.
func TestAFullQueueDisplacesItsWorstWaiter(t *testing.T) {
	f := queued(t, 1, 1, 10*time.Second)
	first := f.post("/v1/chat/completions", streamBody)
	require.Equal(t, http.StatusOK, first.StatusCode)
	displaced := make(chan *http.Response, 1)
	go func() { displaced <- f.post("/v1/chat/completions", prioritized(5)) }()
	require.Eventually(t, func() bool { return metric(t, f, "fastroute_queued_requests") == "1" }, 2*time.Second, 5*time.Millisecond)
	better := make(chan *http.Response, 1)
	go func() { better <- f.post("/v1/chat/completions", prioritized(0)) }()

	resp := <-displaced
	text := readAll(t, resp)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Contains(t, text, "went to a request of lower priority")
	require.Eventually(t, func() bool { return metric(t, f, "fastroute_queue_displaced_total") == "1" }, 2*time.Second, 5*time.Millisecond)

	worse := f.post("/v1/chat/completions", prioritized(9))
	text = readAll(t, worse)
	assert.Equal(t, http.StatusTooManyRequests, worse.StatusCode)
	assert.Contains(t, text, "the router's queue is full", "it goes before nobody")
	equal := f.post("/v1/chat/completions", prioritized(0))
	assert.Equal(t, http.StatusTooManyRequests, equal.StatusCode, "an equal priority does not displace")
	readAll(t, equal)

	readAll(t, first)
	resp = <-better
	text = readAll(t, resp)
	assert.Equal(t, http.StatusOK, resp.StatusCode, text)
	assert.Equal(t, "2", metric(t, f, "fastroute_queue_full_total"))
	f.assertIdle()
}
