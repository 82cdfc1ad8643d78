package every

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// Tick calls its function every interval, not at once, and returns when
// the context ends.
func TestTickCallsUntilTheContextEnds(t *testing.T) {
	var calls atomic.Int32
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	start := time.Now()
	var first atomic.Int64
	go func() {
		Tick(ctx, 10*time.Millisecond, func() {
			first.CompareAndSwap(0, int64(time.Since(start)))
			calls.Add(1)
		})
		close(done)
	}()
	assert.Eventually(t, func() bool { return calls.Load() >= 3 }, 2*time.Second, time.Millisecond)
	assert.GreaterOrEqual(t, time.Duration(first.Load()), 10*time.Millisecond, "the first call is an interval away")
	cancel()
	<-done
	n := calls.Load()
	time.Sleep(30 * time.Millisecond)
	assert.Equal(t, n, calls.Load(), "no call after the end")
}

// A Period's Loop calls at once, then every period; a new period applies
// from when Set gives it, not after the old one's wait.
func TestAPeriodSetAppliesAtOnce(t *testing.T) {
	p := NewPeriod(time.Hour)
	var calls atomic.Int32
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		p.Loop(ctx, func() { calls.Add(1) })
		close(done)
	}()
	assert.Eventually(t, func() bool { return calls.Load() == 1 }, 2*time.Second, time.Millisecond, "the first call at once")
	time.Sleep(50 * time.Millisecond)
	assert.EqualValues(t, 1, calls.Load(), "the next an hour away")
	p.Set(0)
	assert.Equal(t, time.Hour, p.Get(), "no period of 0: ignored")
	p.Set(10 * time.Millisecond)
	assert.Equal(t, 10*time.Millisecond, p.Get())
	assert.Eventually(t, func() bool { return calls.Load() >= 4 }, 2*time.Second, time.Millisecond, "every 10 ms from the Set")
	cancel()
	<-done
}
