package logformat

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/fastroute/fastroute/internal/syncbuf"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every logger of a switch, derived ones with their attributes and groups
// included, writes its next line in the format set last.
func TestALoggerWritesInTheFormatSetLast(t *testing.T) {
	var out bytes.Buffer
	sw := New(&out, "text")
	log := sw.Logger()
	access := log.With("log", "access").WithGroup("req")
	lines := func() []string {
		t.Helper()
		l := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
		out.Reset()
		return l
	}

	log.Info("started", "workers", 3)
	access.Info("served", "status", 200)
	got := lines()
	require.Len(t, got, 2)
	assert.Contains(t, got[0], `msg=started workers=3`)
	assert.Contains(t, got[1], `msg=served log=access req.status=200`)

	sw.Set("json")
	log.Info("reloaded")
	access.Info("served", "status", 404)
	access.With("worker", 2).Info("retried")
	got = lines()
	require.Len(t, got, 3)
	var line map[string]any
	require.NoError(t, json.Unmarshal([]byte(got[0]), &line), got[0])
	assert.Equal(t, "reloaded", line["msg"])
	require.NoError(t, json.Unmarshal([]byte(got[1]), &line), got[1])
	assert.Equal(t, "access", line["log"])
	assert.Equal(t, map[string]any{"status": float64(404)}, line["req"])
	line = nil
	require.NoError(t, json.Unmarshal([]byte(got[2]), &line), got[2])
	assert.Equal(t, map[string]any{"worker": float64(2)}, line["req"], "an attribute after the group is in it")

	sw.Set("text")
	access.Info("served", "status", 200)
	assert.Contains(t, lines()[0], `msg=served log=access req.status=200`)
}

// Lines logged while the format changes are whole lines of one format or
// the other (run under -race).
func TestLinesLoggedWhileTheFormatChangesStayWhole(t *testing.T) {
	var out syncbuf.Buffer
	sw := New(&out, "text")
	access := sw.Logger().With("log", "access")
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 200 {
				access.Info("served", "status", 200)
			}
		})
	}
	wg.Go(func() {
		for i := range 100 {
			sw.Set([]string{"json", "text"}[i%2])
		}
	})
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	assert.Len(t, lines, 800)
	for _, l := range lines {
		if strings.HasPrefix(l, "{") {
			var line map[string]any
			assert.NoError(t, json.Unmarshal([]byte(l), &line), l)
		} else {
			assert.Contains(t, l, "msg=served log=access status=200")
		}
	}
}
