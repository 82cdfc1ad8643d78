package metrics

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// initialized is when this package's variables were set, soon after the
// test process started.
var initialized = time.Now()

// scrape writes collector c and parses its text with Prometheus' own parser.
func scrape(t *testing.T, c Collector) map[string]*dto.MetricFamily {
	t.Helper()
	var set Set
	set.Register(c)
	var buf bytes.Buffer
	_, err := set.WriteTo(&buf)
	require.NoError(t, err)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(&buf)
	require.NoError(t, err, buf.String())
	return fams
}

func value(t *testing.T, fams map[string]*dto.MetricFamily, name string) float64 {
	t.Helper()
	f, ok := fams[name]
	require.True(t, ok, "%s is written", name)
	m := f.GetMetric()[0]
	if f.GetType() == dto.MetricType_COUNTER {
		return m.GetCounter().GetValue()
	}
	return m.GetGauge().GetValue()
}

// The process families read this process's /proc files: CPU time grows as
// the process burns CPU, descriptors opened show in process_open_fds,
// and the start time is this process's.
func TestProcessFamiliesReadThisProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc/self/stat: the process families are left out here")
	}
	c := Process()
	before := scrape(t, c)
	cpu0 := value(t, before, "process_cpu_seconds_total")
	// Burn 300 ms of this process's CPU, however long the machine takes
	// to give it (300 ms of wall time on a busy machine was once 190 ms).
	for start := ownCPU(t); ownCPU(t)-start < 300*time.Millisecond; {
	}
	var files []*os.File
	for range 20 {
		f, err := os.Open("/proc/self/stat")
		require.NoError(t, err)
		files = append(files, f)
	}
	after := scrape(t, c)
	for _, f := range files {
		f.Close()
	}
	assert.GreaterOrEqual(t, value(t, after, "process_cpu_seconds_total")-cpu0, 0.2, "300 ms of CPU burnt")
	fds := value(t, after, "process_open_fds") - value(t, before, "process_open_fds")
	assert.InDelta(t, 20, fds, 3, "20 files opened")
	assert.Greater(t, value(t, after, "process_resident_memory_bytes"), 1e6)
	assert.GreaterOrEqual(t, value(t, after, "process_virtual_memory_bytes"), value(t, after, "process_resident_memory_bytes"))
	assert.Greater(t, value(t, after, "process_max_fds"), 0.0)
	assert.Greater(t, value(t, after, "go_threads"), 0.0)
	assert.Greater(t, value(t, after, "go_memstats_heap_inuse_bytes"), 0.0)
	assert.Equal(t, float64(debug.SetMemoryLimit(-1)), value(t, after, "go_gc_gomemlimit_bytes"))
	assert.GreaterOrEqual(t, value(t, after, "go_memstats_sys_bytes"), value(t, after, "go_memstats_heap_inuse_bytes"))
	runtime.GC()
	assert.Greater(t, value(t, scrape(t, c), "go_gc_cycles_total"), value(t, after, "go_gc_cycles_total"))

	// 2,048 goroutines parked deep in a recursion hold stacks grown past
	// 8 KiB each: at least 16 MiB, which MemStats' StackInuse, read just
	// after, agrees with up to what other goroutines' stacks did between
	// the two reads.
	hold, held := make(chan struct{}), sync.WaitGroup{}
	for range 2048 {
		held.Add(1)
		go func() { parkDeep(16, &held, hold) }()
	}
	held.Wait()
	parked := scrape(t, c)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	close(hold)
	stacks := value(t, parked, "go_memstats_stack_inuse_bytes")
	assert.Greater(t, stacks, 2048*8192.0)
	assert.InDelta(t, float64(ms.StackInuse), stacks, 2<<20, "MemStats' StackInuse")
	assert.GreaterOrEqual(t, value(t, parked, "go_memstats_sys_bytes"), stacks)

	// The process started before the test binary's packages were set up,
	// and not long before.
	started := value(t, after, "process_start_time_seconds")
	assert.LessOrEqual(t, started, float64(initialized.UnixMilli())/1000+0.01)
	assert.Greater(t, started, float64(initialized.Add(-10*time.Second).Unix()))

	info := after["fastroute_build_info"].GetMetric()[0]
	assert.Equal(t, 1.0, info.GetGauge().GetValue())
	assert.Contains(t, info.String(), runtime.Version())
}

// A command name may hold spaces and parentheses: fields count from the
// last ')'.
func TestProcStatFieldsCountFromTheCommandsEnd(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stat")
	line := "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 900 0 0 0 150 25 0 0 20 0 7 0 12345 1048576 300 18446744073709551615\n"
	require.NoError(t, os.WriteFile(path, []byte(line), 0o600))
	st, err := readProcStat(path)
	require.NoError(t, err)
	assert.Equal(t, procStat{utime: 150, stime: 25, threads: 7, start: 12345, vsize: 1048576, rss: 300}, st)

	require.NoError(t, os.WriteFile(path, []byte("4242 (cut short) S 1 2\n"), 0o600))
	_, err = readProcStat(path)
	assert.ErrorContains(t, err, "not in the format proc(5) gives")
}

// ownCPU is this process's CPU time so far, user and system.
func ownCPU(t *testing.T) time.Duration {
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// parkDeep recurses depth frames of about 1 KiB each, says so on held and
// waits for hold to close, its stack grown all the while.
func parkDeep(depth int, held *sync.WaitGroup, hold <-chan struct{}) byte {
	var frame [1024]byte
	frame[depth%len(frame)] = byte(depth)
	if depth == 0 {
		held.Done()
		<-hold
		return frame[0]
	}
	return frame[depth%len(frame)] + parkDeep(depth-1, held, hold)
}
