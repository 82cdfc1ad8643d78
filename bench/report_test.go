package bench

import (
	"encoding/xml"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func synthetic(name string, rps int, base time.Duration) Result {
	r := Result{Name: name, Requests: rps, Elapsed: time.Second}
	for i := 0; i < 1000; i++ {
		r.sorted = append(r.sorted, base+time.Duration(i)*base/1000)
	}
	r.P50, r.P99 = r.Percentile(0.5), r.Percentile(0.99)
	return r
}

func TestTableRatiosAndPlot(t *testing.T) {
	rows := []Row{
		{Workload: "non-streaming", Front: "direct", Result: synthetic("direct", 1000, time.Millisecond)},
		{Workload: "non-streaming", Front: "fastroute", Result: synthetic("fastroute", 600, 2*time.Millisecond)},
		{Workload: "non-streaming", Front: "nginx", Result: synthetic("nginx", 500, 4*time.Millisecond)},
		{Workload: "non-streaming", Front: "haproxy", Result: synthetic("haproxy", 400, time.Millisecond)},
	}
	assert.Equal(t, 1500*time.Microsecond, rows[0].Result.Percentile(0.5))
	table := Table(rows, E2EOptions{Connections: 8, Duration: time.Second, Workers: 3})
	assert.Contains(t, table, "| non-streaming | fastroute | 600 | 3.00 ms | 3.80 ms | 3.98 ms | 4.00 ms | 0.60× | 1.20× | 0.50× |")
	assert.NotContains(t, table, "rounds", "one round: no spread")
	svg := Plot(rows)
	var doc struct {
		Polylines []struct{} `xml:"polyline"`
	}
	require.NoError(t, xml.Unmarshal([]byte(svg), &doc))
	assert.Len(t, doc.Polylines, 4, "one line per front end")
	for _, f := range fronts {
		if slices.ContainsFunc(rows, func(r Row) bool { return r.Front == f.name }) {
			assert.Contains(t, svg, ">"+f.name+"</text>", "legend")
		} else {
			assert.NotContains(t, svg, ">"+f.name+"</text>", "no legend for a front end that did not run")
		}
	}
}

// Rounds give each front end's median round by CPU per request (by req/s
// where CPU is not measured), and the table shows the CPU's spread.
func TestTheMedianRoundAndTheSpreadOfRounds(t *testing.T) {
	cpu := func(us int, rps int) Result {
		r := synthetic("fastroute", rps, time.Millisecond)
		r.CPUPerRequest = time.Duration(us) * time.Microsecond
		return r
	}
	row := medianRow("non-streaming", "fastroute", []Result{cpu(40, 1), cpu(25, 2), cpu(31, 3)})
	assert.Equal(t, 31*time.Microsecond, row.Result.CPUPerRequest)
	assert.Equal(t, 25*time.Microsecond, row.CPULeast)
	assert.Equal(t, 40*time.Microsecond, row.CPUMost)
	direct := medianRow("non-streaming", "direct", []Result{cpu(0, 900), cpu(0, 700), cpu(0, 800)})
	assert.Equal(t, 800, direct.Result.Requests, "by req/s where CPU is not measured")
	assert.Zero(t, medianRow("non-streaming", "nginx", []Result{cpu(20, 1)}).CPUMost, "one round: no spread")

	nginx1w := medianRow("non-streaming", "nginx-1w", []Result{cpu(20, 5), cpu(22, 5), cpu(24, 5)})
	table := Table([]Row{direct, row, nginx1w}, E2EOptions{Connections: 8, Duration: time.Second, Workers: 3, Rounds: 3})
	assert.Contains(t, table, "3 rounds, the front ends interleaved")
	assert.Contains(t, table, "| 31.0 (25.0–40.0) | 1.41× | - |", "without ratios per round: the ratio of the median rounds")
}

// The ratios to the references are taken round by round, and the table
// shows their median over the rounds: a front end as costly as nginx-1w in
// each round is at 1.00× even when the machine's speed moved between
// rounds, where the ratio of the median rounds would pair a slow round
// with a fast one.
func TestRatiosAreTakenRoundByRound(t *testing.T) {
	at := func(us int, p99 time.Duration) Result {
		r := synthetic("x", 1000, p99)
		r.CPUPerRequest, r.P99 = time.Duration(us)*time.Microsecond, p99
		r.UserCPUPerRequest = r.CPUPerRequest / 4
		return r
	}
	userTwice := func(rs []Result, ref []Result) []Result { // user-space CPU twice ref's in each round
		for k := range rs {
			rs[k].UserCPUPerRequest = 2 * ref[k].UserCPUPerRequest
		}
		return rs
	}
	ms := time.Millisecond
	rounds := make([][]Result, len(fronts))
	for i, f := range fronts {
		switch f.name {
		case "direct":
			rounds[i] = []Result{at(0, ms), at(0, ms), at(0, ms)}
		case "fastroute": // as costly as nginx-1w in each round; its median round against nginx-1w's: 30/29
			rounds[i] = userTwice([]Result{at(40, 8*ms), at(30, 6*ms), at(20, 4*ms)},
				[]Result{at(40, 10*ms), at(29, 5*ms), at(20, 4*ms)})
		case "nginx":
			rounds[i] = []Result{at(30, 10*ms), at(30, 5*ms), at(30, 4*ms)}
		case "nginx-1w":
			rounds[i] = []Result{at(40, 10*ms), at(29, 5*ms), at(20, 4*ms)}
		default:
			rounds[i] = []Result{at(50, ms), at(50, ms), at(50, ms)}
		}
	}
	rows := workloadRows("non-streaming", fronts, rounds)
	require.Len(t, rows, len(fronts))
	byFront := map[string]Row{}
	for _, r := range rows {
		byFront[r.Front] = r
	}
	f := byFront["fastroute"]
	assert.InDelta(t, 1.0, f.CPURatio, 1e-9, "40/40, 30/29, 20/20: the median round's")
	assert.InDelta(t, 1.0, f.CPURatioLeast, 1e-9)
	assert.InDelta(t, 30.0/29, f.CPURatioMost, 1e-9)
	assert.InDelta(t, 1.0, f.P99Ratio, 1e-9, "0.8, 1.2, 1.0")
	assert.InDelta(t, 2.0, f.UserRatio, 1e-9, "twice nginx-1w's user-space CPU in each round")
	assert.Zero(t, byFront["direct"].CPURatio, "no CPU measured: no ratio")
	assert.InDelta(t, 1.0, byFront["nginx-1w"].CPURatio, 1e-9)
	table := Table(rows, E2EOptions{Connections: 8, Duration: time.Second, Workers: 3, Rounds: 3})
	assert.Contains(t, table, "| non-streaming | fastroute |")
	assert.Contains(t, table, "| 1.00× | 30.0 (20.0–40.0) | 1.00× (1.00–1.03) | 14.5 (2.00×) |",
		"the median round's user-space CPU (twice nginx-1w's 7.25) and the median of the rounds' ratios")
}

// A run of some front ends (--fronts) keeps fronts' order, refuses a name
// it does not know, and shows no ratio to a reference that did not run.
func TestAChoiceOfFrontEnds(t *testing.T) {
	chosen, err := chosenFronts([]string{"floor-epoll", "fastroute"})
	require.NoError(t, err)
	require.Len(t, chosen, 2)
	assert.Equal(t, []string{"fastroute", "floor-epoll"}, []string{chosen[0].name, chosen[1].name})
	_, err = chosenFronts([]string{"envoy"})
	require.ErrorContains(t, err, `no front end "envoy"`)
	assert.ErrorContains(t, err, "floor-goroutines")
	all, err := chosenFronts(nil)
	require.NoError(t, err)
	assert.Len(t, all, len(fronts))

	r := synthetic("x", 1000, time.Millisecond)
	r.CPUPerRequest, r.UserCPUPerRequest = 30*time.Microsecond, 10*time.Microsecond
	rows := workloadRows("non-streaming", chosen, [][]Result{{r}, {r}})
	require.Len(t, rows, 2)
	assert.Zero(t, rows[0].CPURatio, "nginx-1w did not run: no ratio to it")
	assert.Zero(t, rows[0].P99Ratio, "nginx did not run: no ratio to it")
	table := Table(rows, E2EOptions{Connections: 8, Duration: time.Second, Workers: 3})
	assert.NotContains(t, table, "NaN")
	assert.Contains(t, table, "| non-streaming | floor-epoll | 1000 | 1.50 ms | 1.90 ms | 1.99 ms | 2.00 ms | - | - | - | 30.0 | - | 10.0 (-) |")
}

// TestE2ESmoke runs the whole comparison briefly where nginx and HAProxy are
// installed (make bench-e2e installs them); elsewhere it skips.
func TestE2ESmoke(t *testing.T) {
	for _, tool := range []string{"nginx", "haproxy"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed; `make bench-e2e` installs it", tool)
		}
	}
	if testing.Short() {
		t.Skip("starts processes")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	rows, err := RunE2E(E2EOptions{Binary: bin, Workers: 2, Connections: 4, Duration: 200 * time.Millisecond, OutDir: dir, Rounds: 2})
	require.NoError(t, err)
	assert.Len(t, rows, len(Workloads)*len(fronts), "a row per front end and workload, whatever the rounds")
	for _, r := range rows {
		assert.Positive(t, r.Result.Requests, "%s %s", r.Workload, r.Front)
		assert.Zero(t, r.Result.Errors)
		if r.Front != "direct" {
			assert.LessOrEqual(t, r.CPULeast, r.CPUMost, "%s %s: the spread of two rounds", r.Workload, r.Front)
		}
		// /proc counts CPU in 10 ms ticks: a front end as light as nginx
		// may show none in a round this short, and so may fastroute in one
		// round on a saturated machine (a flake hunt beside four busy
		// loops saw it); one of its two rounds shows some.
		if r.Front == "fastroute" {
			assert.Positive(t, r.CPUMost, "%s %s: the more of two rounds", r.Workload, r.Front)
		}
	}
	md, err := os.ReadFile(filepath.Join(dir, "results.md"))
	require.NoError(t, err)
	n := 0
	for _, wl := range Workloads {
		n += strings.Count(string(md), "| "+wl.Name+" |")
	}
	assert.Equal(t, len(rows), n, "a table row per front end and workload")
	_, err = os.Stat(filepath.Join(dir, "results.svg"))
	assert.NoError(t, err)
}

// buildBinary builds the CPU-only fastroute binary for the smoke tests: it
// works under both test runs (cgo and CGO_ENABLED=0).
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "fastroute")
	build := exec.Command("go", "build", "-tags", "nonvml", "-o", bin, "../cmd/fastroute")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}
