// Package every runs a function at a fixed interval until a context ends:
// the loop of the periodic sweeps and lookups.
package every

import (
	"context"
	"time"
)

// Tick calls f every d until ctx ends; the first call is d from now.
func Tick(ctx context.Context, d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}
