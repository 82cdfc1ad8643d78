//go:build nonvml

package nvml

import (
	"errors"
	"testing"
	"time"
)

func TestStubIsUnavailable(t *testing.T) {
	c := NewSystem()
	if err := c.Start(); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Start: %v, want ErrUnavailable", err)
	}
	if err := c.Refresh(time.Now()); !errors.Is(err, ErrUnavailable) || c.Latest() != nil {
		t.Fatalf("Refresh: %v", err)
	}
}
