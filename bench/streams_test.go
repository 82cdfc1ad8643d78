package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestStreamsTableNamesErrorsByKind(t *testing.T) {
	rows := []StreamsRow{
		{Front: "direct", Streams: 10, OK: 10, GapP99: 100 * time.Millisecond},
		{Front: "nginx", Streams: 10, OK: 6, GapP99: 90 * time.Millisecond,
			Errors: map[string]int{"status 502": 1, "connect/transport error": 3}},
	}
	table := StreamsTable(rows, StreamsOptions{Chunks: 4, Gap: 100 * time.Millisecond})
	lines := strings.Split(table, "\n")
	assert.Contains(t, lines[4], "| direct | 10 | 10 | 0 |")
	assert.Contains(t, lines[5], "| nginx | 10 | 6 | connect/transport error: 3, status 502: 1 |")
	assert.Contains(t, lines[5], "| ≤ 0 |", "a gap under direct's adds nothing")
	assert.Contains(t, rows[1].String(), "errors connect/transport error: 3, status 502: 1,")
	assert.Contains(t, lines[0], "every stream opened at once")
	spread := StreamsTable(rows, StreamsOptions{Chunks: 4, Gap: 100 * time.Millisecond, Spread: true})
	assert.Contains(t, spread, "the streams opened evenly over 100ms (--spread)")
}
