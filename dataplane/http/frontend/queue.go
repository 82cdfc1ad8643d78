package frontend

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/fastroute/fastroute/dataplane"
)

// waitQueue holds requests that found every worker they may go to busy
// (router.queue): up to size of them wait, each up to timeout, and try
// their pick again whenever a request ends, oldest waiter first, or every
// recheck at the latest (a worker that comes back, a slot freed on a
// worker some other waiter cannot use). A request that finds the queue
// full, or still waits at its timeout, is answered 429 as it would have
// been without the queue. A new request that finds a free worker takes it
// even while others wait: the waiters may be waiting for other workers (a
// model's, an adapter's). The request path pays one atomic load per ended
// request, and nothing while nobody waits.
type waitQueue struct {
	size    int64
	timeout time.Duration
	waiting atomic.Int64
	// freed gets a token when a request ends while others wait; each token
	// wakes the oldest waiter.
	freed chan struct{}
}

// queueRecheck bounds how long a waiter sleeps between two tries when no
// request ends meanwhile.
const queueRecheck = 50 * time.Millisecond

func newWaitQueue(size int, timeout time.Duration) *waitQueue {
	if size <= 0 {
		return nil
	}
	return &waitQueue{size: int64(size), timeout: timeout, freed: make(chan struct{}, size)}
}

// ended is told of every request that released its reservation: it wakes
// a waiter, if any.
func (q *waitQueue) ended() {
	if q != nil && q.waiting.Load() > 0 {
		select {
		case q.freed <- struct{}{}:
		default: // as many tokens as waiters already
		}
	}
}

// Waiting returns the requests in the queue now.
func (q *waitQueue) Waiting() int64 {
	if q == nil {
		return 0
	}
	return q.waiting.Load()
}

// errQueueFull is the 429 of a request that found the queue full.
var errQueueFull = &dataplane.Error{Code: dataplane.ResourceExhausted,
	Msg: "every worker this request may go to is busy and the router's queue is full"}

// errWaitedOut is the 429 of a request that waited out the queue's timeout.
func errWaitedOut(timeout time.Duration, last error) error {
	return &dataplane.Error{Code: dataplane.ResourceExhausted,
		Msg: fmt.Sprintf("waited %v in the router's queue: %v", timeout, last)}
}

// awaitSlot waits in the queue for the request's pick to succeed, its
// first having failed with first: nil once it did, the pick's own error
// once it fails otherwise (the workers left, say), a 429 when the queue is
// full or the timeout passes, errHungUpQueued when the client left
// meanwhile. The client's connection is watched from here on
// (watchClient).
func (ex *exchange) awaitSlot(first error) error {
	q, m := ex.s.queue, ex.s.metrics
	if q.waiting.Add(1) > q.size {
		q.waiting.Add(-1)
		m.queueFull.Inc()
		return errQueueFull
	}
	defer q.waiting.Add(-1)
	start := time.Now()
	deadline := start.Add(q.timeout)
	if ex.queueTimer == nil {
		ex.queueTimer = time.NewTimer(queueRecheck)
	}
	t := ex.queueTimer
	err := first
	for {
		left := time.Until(deadline)
		if left <= 0 {
			m.queueTimeouts.Inc()
			return errWaitedOut(q.timeout, err)
		}
		t.Reset(min(left, queueRecheck))
		select {
		case <-q.freed:
			t.Stop()
		case <-t.C:
		}
		if ex.hungUp() {
			return errHungUpQueued
		}
		if err = ex.pick(); err == nil {
			m.queueWait.Observe(time.Since(start))
			return nil
		}
		if !errors.Is(err, dataplane.ErrResourceExhausted) {
			return err
		}
	}
}

// errHungUpQueued ends a request whose client left while it waited in the
// queue.
var errHungUpQueued = errors.New("the client closed its connection while the request waited in the queue")
