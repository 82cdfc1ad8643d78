package frontend

import (
	"container/heap"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/apikeys"
)

// waitQueue holds requests that found every worker they may go to busy
// (router.queue): up to size of them wait, each up to timeout, and try
// their pick again whenever a request ends, or every recheck at the latest
// (a worker that comes back, a slot freed on a worker some other waiter
// cannot use). Each ended request wakes the best waiter: the lowest
// priority (vLLM's request field: lower is sooner, 0 by default), then the
// first by its flow's turn, then the oldest. A flow is the requests of one
// API key (all requests are one flow while keys are off): within a
// priority the flows take turns, as start-time fair queuing has them
// (each arrival's turn is one past its flow's last, or past the turn of
// the last waiter woken when its flow had none waiting), so that one
// key's burst does not hold another's requests behind all of it, as
// llm-d's flow control does between its flows. A request that finds the queue full takes the place
// of the worst waiter when it has a lower priority; otherwise, or once it
// waited its timeout, it is answered 429 as it would have been without
// the queue. A new request that finds a free worker takes it even while
// others wait: the waiters may be waiting for other workers (a model's, an
// adapter's). The request path pays one atomic load per ended request
// while nobody waits; while some do, an ended request takes the queue's
// lock to wake one.
type waitQueue struct {
	size    atomic.Int64 // how many may wait; 0: the queue is off
	timeout atomic.Int64 // how long a request waits, in nanoseconds
	waiting atomic.Int64 // requests in the queue, waiting or trying their pick

	mu    sync.Mutex
	heap  waiters // the waiters asleep, best first
	seq   uint64  // arrivals, for the order among equal priorities and turns
	spare int64   // wake-ups that found every waiter awake (trying its pick), for the next to sleep
	// Waiters an ended request woke that have not yet tried their pick:
	// while there are some, a waiter its timer woke does not try, so that
	// the slot freed goes to the best waiter, not to whichever timer fired.
	called int
	// Fair queuing between flows: each flow's last turn given, and the
	// turn of the last waiter woken.
	turns map[*apikeys.Client]uint64
	now   uint64
}

// waiter is one request's place in the queue (an exchange's, reused).
type waiter struct {
	priority  int64
	flow      *apikeys.Client // its API key's client; nil: none (keys off)
	turn      uint64          // its place among the flows' turns (enter)
	seq       uint64
	index     int           // in the heap; -1 while out of it
	wake      chan struct{} // a slot freed for it, or its displacement (cap 1)
	displaced bool          // by a request of lower priority, at a full queue
	called    bool          // woken by an ended request, its try still to come (waitQueue.called)
}

// waiters is a heap of the waiters asleep, the best at the top.
type waiters []*waiter

func (h waiters) Len() int { return len(h) }
func (h waiters) Less(i, j int) bool {
	a, b := h[i], h[j]
	if a.priority != b.priority {
		return a.priority < b.priority
	}
	if a.turn != b.turn {
		return a.turn < b.turn
	}
	return a.seq < b.seq
}
func (h waiters) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *waiters) Push(x any) {
	w := x.(*waiter)
	w.index = len(*h)
	*h = append(*h, w)
}
func (h *waiters) Pop() any {
	old := *h
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	w.index = -1
	return w
}

// queueRecheck bounds how long a waiter sleeps between two tries when no
// request ends meanwhile.
const queueRecheck = 50 * time.Millisecond

func newWaitQueue(size int, timeout time.Duration) *waitQueue {
	q := &waitQueue{}
	q.size.Store(int64(max(size, 0)))
	q.timeout.Store(int64(timeout))
	return q
}

// on says whether requests that find their workers busy wait (a size
// above 0).
func (q *waitQueue) on() bool { return q.size.Load() > 0 }

// SetQueue changes the wait queue's size and timeout for the requests that
// enter it from now on (a reload): a size of 0 turns it off, one above 0
// on. Those waiting keep their places and deadlines; a smaller size (0
// included) refuses arrivals until fewer wait.
func (s *Server) SetQueue(size int, timeout time.Duration) {
	s.queue.timeout.Store(int64(timeout))
	s.queue.size.Store(int64(max(size, 0)))
}

// ended is told of every request that released its reservation: it wakes
// the best waiter asleep, or leaves the wake-up to the next to sleep when
// every waiter is trying its pick already.
func (q *waitQueue) ended() {
	if q.waiting.Load() == 0 {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.heap) == 0 {
		q.spare = min(q.spare+1, q.size.Load())
		return
	}
	w := heap.Pop(&q.heap).(*waiter)
	q.now = max(q.now, w.turn)
	w.called = true
	q.called++
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Waiting returns the requests in the queue now.
func (q *waitQueue) Waiting() int64 { return q.waiting.Load() }

// enter takes w into the queue, asleep, or reports false when the queue is
// full of requests w does not go before. A full queue's worst waiter
// asleep makes room for a better w: it is woken displaced.
func (q *waitQueue) enter(w *waiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	w.seq, w.displaced = q.seq, false
	q.seq++
	select {
	case <-w.wake: // a wake-up its last request did not take
	default:
	}
	if q.waiting.Add(1) > q.size.Load() {
		worst := -1
		for i := range q.heap {
			if worst < 0 || q.heap.Less(worst, i) {
				worst = i
			}
		}
		if worst < 0 || q.heap[worst].priority <= w.priority {
			q.waiting.Add(-1)
			return false
		}
		out := heap.Remove(&q.heap, worst).(*waiter)
		out.displaced = true
		select {
		case out.wake <- struct{}{}:
		default:
		}
	}
	if q.turns == nil {
		q.turns = map[*apikeys.Client]uint64{}
	}
	w.turn = max(q.now, q.turns[w.flow]) + 1
	q.turns[w.flow] = w.turn
	heap.Push(&q.heap, w)
	return true
}

// wakeUp takes w, just woken by its wake-up or its timer, out of the heap;
// stay is false when w was displaced; try says w tries its pick now: it
// was called (ended), or its timer woke it while no waiter called is
// still to try (a slot that freed without an ended request, a capacity
// raised, is taken on a timer).
func (q *waitQueue) wakeUp(w *waiter) (stay, try bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if w.index >= 0 {
		heap.Remove(&q.heap, w.index)
	}
	return !w.displaced, w.called || q.called == 0
}

// answered ends w's call (ended): its try is over. Under q.mu.
func (q *waitQueue) answered(w *waiter) {
	if w.called {
		w.called = false
		q.called--
	}
}

// sleep puts w, whose pick failed again, back to sleep in its place (its
// priority and arrival), or reports false when a wake-up is there for it
// already and it should try again at once.
func (q *waitQueue) sleep(w *waiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.answered(w)
	select {
	case <-w.wake: // a wake-up that came after its timer
	default:
	}
	if q.spare > 0 {
		q.spare--
		return false
	}
	heap.Push(&q.heap, w)
	return true
}

// leave takes w out of the queue for good. The last to leave forgets
// the flows' turns (their memory stays allocated for the next wait).
func (q *waitQueue) leave(w *waiter) {
	q.mu.Lock()
	q.answered(w)
	if w.index >= 0 {
		heap.Remove(&q.heap, w.index)
	}
	if q.waiting.Add(-1) == 0 {
		clear(q.turns)
		q.now = 0
	}
	q.mu.Unlock()
}

// errQueueFull is the 429 of a request that found the queue full.
var errQueueFull = &dataplane.Error{Code: dataplane.ResourceExhausted,
	Msg: "every worker this request may go to is busy and the router's queue is full"}

// errDisplaced is the 429 of a waiter whose place a request of lower
// priority took.
var errDisplaced = &dataplane.Error{Code: dataplane.ResourceExhausted,
	Msg: "every worker this request may go to is busy, and its place in the router's full queue went to a request of lower priority"}

// errWaitedOut is the 429 of a request that waited out the queue's timeout.
func errWaitedOut(timeout time.Duration, last error) error {
	return &dataplane.Error{Code: dataplane.ResourceExhausted,
		Msg: fmt.Sprintf("waited %v in the router's queue: %v", timeout, last)}
}

// awaitSlot waits in the queue for the request's pick to succeed, its
// first having failed with first: nil once it did, the pick's own error
// once it fails otherwise (the workers left, say), a 429 when the queue is
// full, the request is displaced or the timeout passes, errHungUpQueued
// when the client left meanwhile. The client's connection is watched from
// here on (watchClient).
func (ex *exchange) awaitSlot(first error) error {
	q, m := ex.s.queue, ex.s.metrics
	w := &ex.place
	if w.wake == nil {
		w.wake, w.index = make(chan struct{}, 1), -1
	}
	w.priority, w.flow = ex.priority, ex.key
	if !q.enter(w) {
		m.queueFull.Inc()
		return errQueueFull
	}
	defer q.leave(w)
	start, timeout := time.Now(), time.Duration(q.timeout.Load())
	deadline := start.Add(timeout)
	if ex.queueTimer == nil {
		ex.queueTimer = time.NewTimer(queueRecheck)
	}
	t := ex.queueTimer
	err := first
	for asleep := true; ; {
		left := time.Until(deadline)
		if left <= 0 {
			m.queueTimeouts.Inc()
			return errWaitedOut(timeout, err)
		}
		if asleep {
			t.Reset(min(left, queueRecheck))
			select {
			case <-w.wake:
				t.Stop()
			case <-t.C:
			}
			stay, try := q.wakeUp(w)
			if !stay {
				m.queueDisplaced.Inc()
				return errDisplaced
			}
			if !try { // a waiter called takes the slot freed
				asleep = q.sleep(w)
				continue
			}
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
		asleep = q.sleep(w)
	}
}

// errHungUpQueued ends a request whose client left while it waited in the
// queue.
var errHungUpQueued = errors.New("the client closed its connection while the request waited in the queue")
