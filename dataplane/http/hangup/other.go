//go:build !linux

package hangup

// Watcher watches nothing outside Linux: a closed client is noticed when
// the router next writes to it.
type Watcher[T any] struct{}

// New returns a Watcher that watches nothing.
func New[T any](func(t *T, gen uint32)) (*Watcher[T], error) { return &Watcher[T]{}, nil }

// Add watches nothing and says so.
func (*Watcher[T]) Add(int) (Conn, bool) { return Conn{}, false }

// Begin reports the peer as open.
func (*Watcher[T]) Begin(Conn, *T) bool { return true }

// Closed reports the peer as open.
func (*Watcher[T]) Closed(Conn) bool { return false }

// End does nothing.
func (*Watcher[T]) End(Conn, *T) {}

// Remove does nothing.
func (*Watcher[T]) Remove(Conn) {}

// Close does nothing.
func (*Watcher[T]) Close() error { return nil }
