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
