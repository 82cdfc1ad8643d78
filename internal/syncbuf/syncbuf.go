// Package syncbuf holds a buffer that one goroutine writes while another
// reads it: a logger's destination that a test reads while the process
// under test logs, or a child process's output kept for the error that
// says why it did not come up.
package syncbuf

import "sync"

// Buffer is an io.Writer whose text so far String returns, both safe to
// call at once.
type Buffer struct {
	// Last, when above 0, keeps only the last Last bytes written.
	Last int

	mu sync.Mutex
	b  []byte
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b = append(s.b, p...)
	if over := len(s.b) - s.Last; s.Last > 0 && over > 0 {
		s.b = append(s.b[:0], s.b[over:]...)
	}
	return len(p), nil
}

// String returns what was written so far (its last Last bytes).
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(s.b)
}
