package bench

import (
	"encoding/xml"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRoutingWorkloadIsSeededPoissonWithHeavyTails(t *testing.T) {
	a, b := workload(7, 50, 20*time.Second), workload(7, 50, 20*time.Second)
	assert.Equal(t, a, b, "the same seed replays the same arrivals for every router")
	assert.InDelta(t, 1000, len(a), 120, "about rate × duration arrivals")
	maxOut, maxPrompt := 0, 0
	for _, j := range a {
		maxOut, maxPrompt = max(maxOut, j.out), max(maxPrompt, j.prompt)
	}
	meanP, meanO := meanLengths(7)
	assert.Greater(t, float64(maxOut), 4*meanO, "answers are heavy-tailed")
	assert.Greater(t, float64(maxPrompt), 4*meanP, "prompts are heavy-tailed")
	body := chatBody(300, 10)
	assert.Equal(t, 300, len(body)/4, "the engine estimates 4 bytes a token")
	assert.Contains(t, string(body), `"max_tokens":10`)
}

func TestEngineCapacityModel(t *testing.T) {
	gpu, cpu := simEngine{"g", 16, 1, false}, simEngine{"c", 16, 1.0 / 6, false}
	// 16 slots, 66 answer tokens at a 5.8 ms full-batch step, 327-token prompts at 20 µs a token.
	assert.InDelta(t, 16/(66*0.0058+16*327*20e-6), gpu.capacity(327, 66), 0.01)
	assert.InDelta(t, gpu.capacity(327, 66)/6, cpu.capacity(327, 66), 0.01, "speed scales throughput")
}

// A conversation's turns come in order, each body starting with the one
// before (all but its closing brackets), and are replayed alike for every
// router.
func TestConversationsRepeatTheirPast(t *testing.T) {
	jobs, meanP, meanO := conversations(3, 40, 10*time.Second)
	again, _, _ := conversations(3, 40, 10*time.Second)
	assert.Equal(t, jobs, again)
	assert.InDelta(t, 400, len(jobs), 80, "about rate × duration turns")
	last := map[string][]byte{} // conversation → its latest turn's body
	turns := 0
	for i, j := range jobs {
		require.True(t, i == 0 || jobs[i-1].at <= j.at, "in arrival order")
		m := regexp.MustCompile(`"content":"conversation (\d+): `).FindSubmatch(j.body)
		require.NotNil(t, m)
		if prev, ok := last[string(m[1])]; ok {
			open := prev[:len(prev)-2] // without "]}"
			assert.True(t, strings.HasPrefix(string(j.body[strings.Index(string(j.body), `"messages"`):]), string(open[strings.Index(string(open), `"messages"`):])),
				"a turn repeats the conversation so far")
			turns++
		}
		last[string(m[1])] = j.body
		assert.Equal(t, len(j.body)/4, j.prompt)
	}
	assert.Greater(t, turns, len(jobs)/2, "most turns follow one before")
	assert.Greater(t, meanP, float64(convDocTokens))
	assert.Positive(t, meanO)
}

func TestRoutingTableMarksFailures(t *testing.T) {
	rows := []RoutingRow{
		{Load: 0.8, Router: "fastroute load-aware", Window: time.Second, Timeout: 5 * time.Second, Completed: 10,
			TTFT: []time.Duration{10 * time.Millisecond, 20 * time.Millisecond}, E2E: []time.Duration{time.Second, 2 * time.Second},
			ByWorker: map[string]int{"a": 10}, WorkerList: []string{"a", "b"}},
		{Load: 0.8, Router: "nginx least_conn", Window: time.Second, Timeout: 5 * time.Second, Completed: 9, Failed: 1,
			TTFT: []time.Duration{10 * time.Millisecond, 5 * time.Second}, E2E: []time.Duration{time.Second, 5 * time.Second},
			ByWorker: map[string]int{"a": 5, "b": 4}, WorkerList: []string{"a", "b"}},
	}
	table := RoutingTable(rows, 100, RoutingOptions{Warmup: time.Second, Duration: time.Second, Timeout: 5 * time.Second,
		NoMetrics: []string{"cpu"}, MetricsDelay: 200 * time.Millisecond})
	assert.Contains(t, table, "cpu (4 slots, speed 0.17, no metrics); metrics pages 200ms late; fleet capacity 100.0 req/s")
	assert.Contains(t, table, "| 80% | fastroute load-aware | 20.0 ms | 20.0 ms | 2.00 s | 2.00 s | 10.0 | 0 | 100/0 | ≤ 0.00× |")
	assert.Contains(t, table, "| 80% | nginx least_conn | ≥ 5.00 s (failed) | ≥ 5.00 s (failed) | ≥ 5.00 s (failed) | ≥ 5.00 s (failed) | 9.0 | 1 | 56/44 | 1.00× |")
	var doc struct {
		Polylines []struct{} `xml:"polyline"`
	}
	require.NoError(t, xml.Unmarshal([]byte(RoutingPlot(rows)), &doc))
	assert.Len(t, doc.Polylines, 2, "one line per router")
}

// TestRoutingSmoke runs the routing comparison briefly where nginx is
// installed (make bench-routing installs it); elsewhere it skips.
func TestRoutingSmoke(t *testing.T) {
	if _, err := exec.LookPath("nginx"); err != nil {
		t.Skip("nginx not installed; `make bench-routing` installs it")
	}
	if testing.Short() {
		t.Skip("starts processes")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	rows, err := RunRouting(RoutingOptions{Binary: bin, Warmup: 300 * time.Millisecond, Duration: 700 * time.Millisecond,
		Timeout: 5 * time.Second, Loads: []float64{0.3}, Seed: 1, OutDir: dir, PDLoad: 0.3, ConvLoad: 0.3, JoinLoad: 0.3, SlowJoinLoad: 0.3, RestartLoad: 0.3,
		NoMetrics: []string{"cpu"}, // read by the router itself
		Routers:   []string{"fastroute device-aware-weighted (default)", "nginx least_conn", "fastroute default + prefix affinity"}})
	require.NoError(t, err)
	require.Len(t, rows, 2)
	for _, r := range rows {
		assert.Positive(t, r.Completed, r.Router)
		assert.Equal(t, r.Completed, r.ByWorker["gpu-a"]+r.ByWorker["gpu-b"]+r.ByWorker["cpu"], "%s: every answer names its engine", r.Router)
	}
	assert.Zero(t, rows[0].Failed)
	md, err := os.ReadFile(filepath.Join(dir, "routing.md"))
	require.NoError(t, err)
	assert.Contains(t, string(md), "cpu (4 slots, speed 0.17, no metrics)")
	assert.Len(t, regexp.MustCompile(`(?m)^\| 30% \|`).FindAllString(string(md), -1), 2, "a row of the main table per router") // not a cell of another table that reads 30%
	for _, setup := range PDSetups() {
		assert.Contains(t, string(md), "| "+setup.Name+" |")
		assert.NotContains(t, string(md), "| "+setup.Name+" | 0s", "%s: its requests were answered", setup.Name)
	}
	conv := regexp.MustCompile(`(?m)^\| fastroute default \+ prefix affinity \|.* \| 0 \| (\d+)% \|`).FindStringSubmatch(string(md))
	require.NotNil(t, conv, "the conversation comparison's row, none failed:\n%s", md)
	assert.NotEqual(t, "0", conv[1], "its engines found prompt tokens cached")
	_, join, ok := strings.Cut(string(md), "Scale-up: gpu-c")
	require.True(t, ok, "the scale-up comparison:\n%s", md)
	join, slow, ok := strings.Cut(join, "Scale-up: cpu-2 (like cpu)")
	require.True(t, ok, "the scale-up comparison with a slow engine after it:\n%s", md)
	served := regexp.MustCompile(`(?m)^\| fastroute device-aware-weighted \(default\) \|.* \| 0 \| \d+/\d+/\d+/(\d+) \|$`).FindStringSubmatch(join)
	require.NotNil(t, served, "the scale-up comparison's row, none failed:\n%s", md)
	assert.NotEqual(t, "0", served[1], "the engine that joined served requests")
	assert.Regexp(t, `(?m)^\| fastroute device-aware-weighted \(default\) \|.* \| 0 \| \d+/\d+/\d+/\d+ \|$`, slow, "with a slow engine joining, none failed")
	_, restart, ok := strings.Cut(string(md), "Restart: ")
	require.True(t, ok, "the restart comparison:\n%s", md)
	assert.Regexp(t, `(?m)^\| fastroute device-aware-weighted \(default\) \|.* \| [1-9]\d*\.\d \| 0 \| \d+/\d+/\d+ \|$`, restart,
		"the restarted router answered, none failed")
	_, err = os.Stat(filepath.Join(dir, "routing.svg"))
	assert.NoError(t, err)
}

func TestStreamsSmoke(t *testing.T) {
	if _, err := exec.LookPath("nginx"); err != nil {
		t.Skip("nginx not installed; `make bench-streams` installs it")
	}
	if testing.Short() {
		t.Skip("starts processes")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	rows, err := RunStreams(StreamsOptions{Binary: bin, Counts: []int{40}, Chunks: 8, Gap: 20 * time.Millisecond, OutDir: dir})
	require.NoError(t, err)
	require.Len(t, rows, 3)
	for _, r := range rows {
		assert.Equal(t, 40, r.OK, "%s: %v", r.Front, r.Errors)
		assert.GreaterOrEqual(t, r.GapP99, 15*time.Millisecond, "%s: the worker's pace shows", r.Front)
	}
	assert.Positive(t, rows[1].Goroutines, "fastroute's goroutines are read")
	md, err := os.ReadFile(filepath.Join(dir, "streams.md"))
	require.NoError(t, err)
	assert.Contains(t, string(md), "| fastroute | 40 | 40 | 0 |")
}
