package frontend

import (
	"sync"
	"testing"
	"time"

	"github.com/fastroute/fastroute/dataplane/apikeys"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newWaiter(priority int64) *waiter {
	return &waiter{priority: priority, index: -1, wake: make(chan struct{}, 1)}
}

func woken(w *waiter) bool {
	select {
	case <-w.wake:
		return true
	default:
		return false
	}
}

// Each ended request wakes the best waiter asleep: the lowest priority,
// the oldest among equals; a full queue's worst waiter makes room for a
// better one, never for an equal or worse one.
func TestTheWaitQueueWakesTheBestWaiterFirst(t *testing.T) {
	q := newWaitQueue(3, time.Second)
	a, b, c := newWaiter(5), newWaiter(0), newWaiter(0)
	for _, w := range []*waiter{a, b, c} {
		require.True(t, q.enter(w))
	}
	q.ended()
	assert.Equal(t, []bool{false, true, false}, []bool{woken(a), woken(b), woken(c)}, "priority 0, the older one")
	assert.Equal(t, [2]bool{true, true}, stayTry(q.wakeUp(b)))
	q.leave(b)

	d := newWaiter(1)
	require.True(t, q.enter(d)) // room: b left
	e := newWaiter(-1)
	require.True(t, q.enter(e), "full: e displaces a, the worst")
	assert.True(t, woken(a))
	stay, _ := q.wakeUp(a)
	assert.False(t, stay, "a learns it was displaced")
	q.leave(a)
	assert.False(t, q.enter(newWaiter(1)), "full of waiters as good or better")
	assert.Equal(t, int64(3), q.Waiting())

	for _, want := range []*waiter{e, c, d} {
		q.ended()
		require.True(t, woken(want))
		require.Equal(t, [2]bool{true, true}, stayTry(q.wakeUp(want)))
		q.leave(want)
	}
	assert.Zero(t, q.Waiting())

	// A wake-up that finds every waiter awake goes to the next to sleep.
	f := newWaiter(0)
	require.True(t, q.enter(f))
	q.ended()
	require.True(t, woken(f))
	q.wakeUp(f)
	q.ended() // f is trying its pick
	assert.False(t, q.sleep(f), "try again at once")
	assert.True(t, q.sleep(f), "then sleep")
	q.leave(f)
	assert.Zero(t, q.Waiting())
}

func stayTry(stay, try bool) [2]bool { return [2]bool{stay, try} }

// A waiter its timer wakes does not try its pick while a waiter an ended
// request woke (called) has yet to try: the slot freed goes to the best
// waiter, whose try it is, not to the one whose timer fired first. Once
// the called waiter tried (and slept again: its model's workers are
// still busy, say), a timer's waiter tries.
func TestATimersWaiterLeavesTheFreedSlotToTheWaiterCalled(t *testing.T) {
	q := newWaitQueue(4, time.Second)
	worst, best := newWaiter(5), newWaiter(-3)
	require.True(t, q.enter(worst))
	require.True(t, q.enter(best))
	q.ended()
	require.True(t, woken(best))
	assert.False(t, woken(worst))
	assert.Equal(t, [2]bool{true, false}, stayTry(q.wakeUp(worst)), "worst's timer: best is called, worst waits")
	assert.True(t, q.sleep(worst))
	assert.Equal(t, [2]bool{true, true}, stayTry(q.wakeUp(best)), "best tries")
	assert.True(t, q.sleep(best), "its pick failed: asleep again")
	assert.Equal(t, [2]bool{true, true}, stayTry(q.wakeUp(worst)), "no call pending: a timer's waiter tries")
	q.leave(worst)

	q.ended()
	require.True(t, woken(best))
	q.leave(best) // called, and gone (its client left, say): the call ends with it
	other := newWaiter(0)
	require.True(t, q.enter(other))
	assert.Equal(t, [2]bool{true, true}, stayTry(q.wakeUp(other)))
	q.leave(other)
	assert.Zero(t, q.Waiting())
	assert.Zero(t, q.called)
}

// Waiters enter, sleep, wake and leave while requests end, all at once
// (run under -race); every one leaves and the count returns to 0.
func TestTheWaitQueueConcurrently(t *testing.T) {
	q := newWaitQueue(8, time.Second)
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			w := newWaiter(int64(g % 3))
			for range 200 {
				if !q.enter(w) {
					continue
				}
				q.ended()
				if stay, _ := q.wakeUp(w); stay && !q.sleep(w) {
					q.wakeUp(w)
				}
				q.leave(w)
			}
		})
	}
	wg.Wait()
	assert.Zero(t, q.Waiting())
	assert.Empty(t, q.heap)
	assert.Zero(t, q.called, "every call ended")
}

// Within a priority, the flows (API keys) take turns: a burst of one key's
// requests does not hold another key's behind all of it; a flow that had
// none waiting takes the next turn, not a turn it saved up while idle; a
// lower priority still goes first; one flow alone is served in arrival
// order.
func TestTheFlowsTakeTurnsWithinAPriority(t *testing.T) {
	var keys apikeys.Keys
	keys.Set([]apikeys.Entry{{Name: "a", Key: "sk-a-0123456789abcdef"}, {Name: "b", Key: "sk-b-0123456789abcdef"}, {Name: "c", Key: "sk-c-0123456789abcdef"}})
	a, b, c := keys.Clients()[0], keys.Clients()[1], keys.Clients()[2]
	q := newWaitQueue(16, time.Second)
	type arrival struct {
		name     string
		flow     *apikeys.Client
		priority int64
	}
	waiters := map[*waiter]string{}
	arrive := func(list ...arrival) {
		for _, r := range list {
			w := newWaiter(r.priority)
			w.flow = r.flow
			require.True(t, q.enter(w))
			waiters[w] = r.name
		}
	}
	next := func() string {
		q.ended()
		for w, name := range waiters {
			if woken(w) {
				require.Equal(t, [2]bool{true, true}, stayTry(q.wakeUp(w)))
				q.leave(w)
				delete(waiters, w)
				return name
			}
		}
		return ""
	}
	arrive(arrival{"a1", a, 0}, arrival{"a2", a, 0}, arrival{"a3", a, 0}, arrival{"a4", a, 0}, arrival{"b1", b, 0}, arrival{"b2", b, 0})
	assert.Equal(t, "a1", next())
	assert.Equal(t, "b1", next(), "b's first takes the turn after a's first, not after a's burst")
	arrive(arrival{"c1", c, 0}, arrival{"urgent", c, -1})
	assert.Equal(t, "urgent", next(), "a lower priority goes first")
	assert.Equal(t, "a2", next())
	assert.Equal(t, "b2", next())
	assert.Equal(t, "c1", next(), "c, idle until now, takes the turn after the last woken")
	assert.Equal(t, "a3", next())
	assert.Equal(t, "a4", next())
	assert.Zero(t, q.Waiting())

	arrive(arrival{"x1", nil, 0}, arrival{"x2", nil, 0}, arrival{"x3", nil, 0})
	for _, want := range []string{"x1", "x2", "x3"} {
		assert.Equal(t, want, next(), "without keys, one flow: arrival order")
	}
	assert.Empty(t, q.turns, "the last to leave forgets the turns")
}
