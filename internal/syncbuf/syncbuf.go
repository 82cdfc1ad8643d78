// Package syncbuf holds a buffer that one goroutine writes while another
// reads it: a logger's destination that a test reads while the process
// under test logs.
package syncbuf

import (
	"strings"
	"sync"
)

// Buffer is an io.Writer whose text so far String returns, both safe to
// call at once.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
