package syncbuf

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// A Buffer keeps all it was given, or with Last only the end of it.
func TestBufferKeepsAllOrTheEnd(t *testing.T) {
	var all Buffer
	last := Buffer{Last: 4 << 10}
	for i := range 1000 {
		_, _ = fmt.Fprintf(&all, "line %d\n", i)
		_, _ = fmt.Fprintf(&last, "line %d\n", i)
	}
	assert.True(t, strings.HasPrefix(all.String(), "line 0\nline 1\n"))
	assert.Len(t, last.String(), 4<<10)
	assert.True(t, strings.HasSuffix(last.String(), "line 998\nline 999\n"), last.String()[len(last.String())-40:])
	assert.Equal(t, all.String()[len(all.String())-4<<10:], last.String())
}
