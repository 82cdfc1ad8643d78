package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// StreamsOptions configures the concurrency run: many SSE streams held
// open at once through each front end.
type StreamsOptions struct {
	Binary string
	Counts []int         // concurrent streams per run
	Chunks int           // chunks per answer
	Gap    time.Duration // the worker's pause before each chunk
	// Spread opens the streams evenly over one Gap instead of all at once,
	// so that their chunks come at a steady pace rather than in bursts of
	// one chunk of every stream.
	Spread bool
	OutDir string
}

// StreamsRow is one front end at one concurrency.
type StreamsRow struct {
	Front      string
	Streams    int
	OK         int
	Errors     map[string]int // by status or error kind
	RSSPerOpen float64        // front end's peak resident set added per stream, bytes
	Goroutines int            // fastroute's, with every stream open; 0: not measured
	GapP99     time.Duration  // 99th percentile gap between two chunks of a stream
	Mean       time.Duration  // mean stream duration
}

var streamFronts = []struct {
	name  string
	start startFunc
}{
	{"direct", nil},
	{"fastroute", func(bin, _ string, workers []string) (string, *exec.Cmd, error) {
		return startServe(bin, workers, "--mode", "least-loaded", "--busy-threshold", "0", "--telemetry-nvml=false", "--telemetry-cpu=false")
	}},
	{"nginx (1 worker process)", nginxFront("least_conn;", "1")},
}

// RunStreams runs every front end at every concurrency on three mock
// workers and writes streams.md.
func RunStreams(o StreamsOptions) ([]StreamsRow, error) {
	dir, err := os.MkdirTemp("", "fastroute-streams")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	workers, stop, err := startMocks(o.Binary, 3, []string{"--tokens", strconv.Itoa(o.Chunks), "--token-interval", o.Gap.String()})
	if err != nil {
		return nil, err
	}
	defer stop()
	// Every front end runs at one concurrency before any runs at the next,
	// each after a pause of a millisecond per stream of the run before:
	// a run that followed a larger one met its aftermath (the workers'
	// collections, thousands of closing sockets) and added 14 ms to the
	// chunk gap at 1,000 streams that a run on a quiet machine does not.
	var rows []StreamsRow
	for _, n := range o.Counts {
		for _, f := range streamFronts {
			if len(rows) > 0 {
				time.Sleep(time.Duration(rows[len(rows)-1].Streams) * time.Millisecond)
			}
			row, err := runStreamsOnce(o, dir, f.name, f.start, workers, n)
			if err != nil {
				return nil, fmt.Errorf("%s, %d streams: %w", f.name, n, err)
			}
			fmt.Println("  " + row.String())
			rows = append(rows, row)
		}
	}
	table := StreamsTable(rows, o)
	if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
		return nil, err
	}
	fmt.Print("\n" + table)
	return rows, os.WriteFile(filepath.Join(o.OutDir, "streams.md"), []byte(table), 0o644)
}

func runStreamsOnce(o StreamsOptions, dir, name string, start startFunc, workers []string, n int) (StreamsRow, error) {
	row := StreamsRow{Front: name, Streams: n, Errors: map[string]int{}}
	targets, pid, admin := workers, 0, ""
	if start != nil {
		addr, p, err := start(o.Binary, dir, workers)
		if err != nil {
			return row, err
		}
		defer terminate(p)
		if err := waitAnswer(addr, "/v1/chat/completions", []byte(`{"model":"mock-model","messages":[]}`)); err != nil {
			return row, notUp(err, p)
		}
		targets, pid = []string{addr}, p.Process.Pid
		if i := slices.Index(p.Args, "--admin-listen"); i >= 0 {
			admin = p.Args[i+1]
		}
	}
	var idle int64
	if pid != 0 {
		idle = treePeakRSS(pid) // after one request: the idle process's peak so far
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n, DisableCompression: true}}
	defer client.CloseIdleConnections()
	body := []byte(`{"model":"mock-model","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	type result struct {
		err  string
		gaps []time.Duration
		took time.Duration
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if o.Spread {
				time.Sleep(time.Duration(i) * o.Gap / time.Duration(n))
			}
			t := time.Now()
			gaps, err := holdStream(client, targets[i%len(targets)], body, o.Chunks, time.Duration(o.Chunks)*o.Gap+30*time.Second)
			results[i] = result{err: err, gaps: gaps, took: time.Since(t)}
		})
	}
	// The goroutine count is sampled while the streams run (the most is
	// when they are all open); the resident set is the peak's.
	done := make(chan struct{})
	sampled := make(chan int, 1)
	go func() {
		most := 0
		for admin != "" {
			most = max(most, goroutines(admin))
			select {
			case <-done:
				sampled <- most
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
		<-done
		sampled <- most
	}()
	wg.Wait()
	close(done)
	row.Goroutines = <-sampled
	if pid != 0 {
		row.RSSPerOpen = float64(treePeakRSS(pid)-idle) / float64(n)
	}
	var gaps []time.Duration
	var total time.Duration
	for _, r := range results {
		if r.err != "" {
			row.Errors[r.err]++
			continue
		}
		row.OK++
		total += r.took
		gaps = append(gaps, r.gaps...)
	}
	slices.Sort(gaps)
	row.GapP99 = pct(gaps, 0.99)
	if row.OK > 0 {
		row.Mean = total / time.Duration(row.OK)
	}
	return row, nil
}

// holdStream reads one streamed answer to its end and returns the gaps
// between its chunks; the error is the status or the kind of failure.
func holdStream(client *http.Client, addr string, body []byte, chunks int, timeout time.Duration) ([]time.Duration, string) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, "connect/transport error"
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil, "status " + strconv.Itoa(resp.StatusCode)
	}
	gaps := make([]time.Duration, 0, chunks)
	rd := bufio.NewReader(resp.Body)
	last, seen := time.Time{}, 0
	for {
		line, err := rd.ReadSlice('\n')
		if bytes.HasPrefix(line, []byte("data: {")) {
			now := time.Now()
			if seen > 0 {
				gaps = append(gaps, now.Sub(last))
			}
			last, seen = now, seen+1
		}
		if bytes.HasPrefix(line, []byte("data: [DONE]")) {
			if seen != chunks {
				return nil, "short stream"
			}
			return gaps, ""
		}
		if err != nil && err != bufio.ErrBufferFull {
			return nil, "stream cut"
		}
	}
}

// goroutines reads the goroutine count from fastroute's /metrics. (A
// goroutine profile every 200 ms made about 10 MB of garbage in the router
// at 1,000 streams, which its measured resident set counted.)
func goroutines(admin string) int {
	sums, err := seriesSums(admin, "go_goroutines")
	if err != nil {
		return 0
	}
	return int(sums[0])
}

// String is the row as one progress line.
func (r StreamsRow) String() string {
	return fmt.Sprintf("%-26s %5d streams: %5d ok, errors %v, %6.1f KiB RSS per stream, %5d goroutines, chunk gap p99 %v, mean %v",
		r.Front, r.Streams, r.OK, errorCounts(r.Errors), r.RSSPerOpen/1024, r.Goroutines, r.GapP99.Round(time.Millisecond), r.Mean.Round(10*time.Millisecond))
}

// errorCounts lists errors by kind, "kind: n, kind: n" in the kinds'
// order, or "0".
func errorCounts(errs map[string]int) string {
	if len(errs) == 0 {
		return "0"
	}
	parts := make([]string, 0, len(errs))
	for kind, n := range errs {
		parts = append(parts, fmt.Sprintf("%s: %d", kind, n))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// StreamsTable formats the rows as Markdown, the chunk gap beside
// direct's at the same concurrency.
func StreamsTable(rows []StreamsRow, o StreamsOptions) string {
	var b strings.Builder
	opened := "every stream opened at once"
	if o.Spread {
		opened = fmt.Sprintf("the streams opened evenly over %v (--spread)", o.Gap)
	}
	fmt.Fprintf(&b, "%d chunks %v apart per stream, three mock workers; %s\n\n", o.Chunks, o.Gap, opened)
	b.WriteString("| front end | streams | ok | errors | peak RSS per stream | most goroutines | chunk gap p99 | added over direct | mean stream |\n")
	b.WriteString("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rows {
		errs := errorCounts(r.Errors)
		added, goroutines, rss := "-", "-", "-"
		for _, d := range rows {
			if d.Front == "direct" && d.Streams == r.Streams && r.Front != "direct" {
				added = "≤ 0"
				if r.GapP99 > d.GapP99 {
					added = fmtDur(r.GapP99 - d.GapP99)
				}
			}
		}
		if r.Goroutines > 0 {
			goroutines = strconv.Itoa(r.Goroutines)
		}
		if r.Front != "direct" {
			rss = fmt.Sprintf("%.1f KiB", r.RSSPerOpen/1024)
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %s | %s | %s | %s | %s | %s |\n", r.Front, r.Streams, r.OK, errs, rss, goroutines,
			fmtDur(r.GapP99), added, fmtDur(r.Mean))
	}
	return b.String()
}
