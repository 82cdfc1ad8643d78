package metrics

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
)

// Build is what the binary knows of its own build.
type Build struct {
	Version   string // the main module's version ("(devel)" in a checkout)
	Commit    string // the VCS revision, "unknown" without one
	Modified  bool   // built from a tree with changes not committed
	GoVersion string
}

// ReadBuild returns the running binary's build; ok is false when it was
// built without module information.
func ReadBuild() (b Build, ok bool) {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return Build{Commit: "unknown", GoVersion: runtime.Version()}, false
	}
	b = Build{Version: info.Main.Version, Commit: "unknown", GoVersion: info.GoVersion}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Commit = s.Value
		case "vcs.modified":
			b.Modified = s.Value == "true"
		}
	}
	return b, true
}

// userHZ is the clock tick of /proc's times on Linux (USER_HZ, 100 on
// every architecture Go runs Linux on), as Prometheus' own procfs has it.
const userHZ = 100

// Process returns the collector of the router process's own families, under
// the names of Prometheus' Go client (process_cpu_seconds_total,
// process_resident_memory_bytes, process_open_fds, go_goroutines...), so
// that dashboards made for any Go or Prometheus-instrumented process show
// the router's, and fastroute_build_info. The process_ families come from
// /proc/self and are left out where it cannot be read (outside Linux).
func Process() Collector {
	build, _ := ReadBuild()
	return func(w *Writer) {
		modified := "false"
		if build.Modified {
			modified = "true"
		}
		w.Header("fastroute_build_info", "gauge", "The running build: module version, commit, whether its tree had changes not committed, Go version (always 1).")
		w.Sample("fastroute_build_info", 1, "version", build.Version, "commit", build.Commit, "modified", modified, "goversion", build.GoVersion)
		if st, err := readProcStat("/proc/self/stat"); err == nil {
			w.Single("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.", float64(st.utime+st.stime)/userHZ)
			w.Single("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", float64(st.rss*int64(os.Getpagesize())))
			w.Single("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", float64(st.vsize))
			if boot, err := bootTime("/proc/stat"); err == nil {
				w.Single("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.", float64(boot)+float64(st.start)/userHZ)
			}
			w.Single("go_threads", "gauge", "Number of OS threads created.", float64(st.threads))
		}
		if n, err := countDir("/proc/self/fd"); err == nil {
			w.Single("process_open_fds", "gauge", "Number of open file descriptors.", float64(n))
		}
		if n, err := maxOpenFiles("/proc/self/limits"); err == nil {
			w.Single("process_max_fds", "gauge", "Maximum number of open file descriptors.", float64(n))
		}
		// Client_golang's name: about one per open client connection, so
		// dashboards that know it show the router's connections.
		w.Single("go_goroutines", "gauge", "Number of goroutines that currently exist.", float64(runtime.NumGoroutine()))
		writeRuntimeFamilies(w)
	}
}

// runtimeFamilies are the families read from runtime/metrics, each the
// sum of its samples (all uint64s), under client_golang's names.
var runtimeFamilies = []struct {
	name, typ, help string
	samples         []string
}{
	{"go_memstats_heap_inuse_bytes", "gauge", "Number of heap bytes that are in use.",
		[]string{"/memory/classes/heap/objects:bytes", "/memory/classes/heap/unused:bytes"}},
	{"go_memstats_sys_bytes", "gauge", "Number of bytes obtained from system.", []string{"/memory/classes/total:bytes"}},
	{"go_memstats_stack_inuse_bytes", "gauge", "Number of bytes in use by the stack allocator.", []string{"/memory/classes/heap/stacks:bytes"}},
	{"go_gc_gomemlimit_bytes", "gauge", "Go runtime memory limit configured by the user, otherwise math.MaxInt64. This value is set by the GOMEMLIMIT environment variable, and the runtime/debug.SetMemoryLimit function.",
		[]string{"/gc/gomemlimit:bytes"}},
	{"go_gc_cycles_total", "counter", "Garbage collection cycles completed.", []string{"/gc/cycles/total:gc-cycles"}},
}

// writeRuntimeFamilies reads runtimeFamilies' samples (no stop of the
// world, unlike runtime.ReadMemStats) into a slice of this scrape's own,
// since scrapes may run at once, and writes the families.
func writeRuntimeFamilies(w *Writer) {
	var samples []metrics.Sample
	for _, f := range runtimeFamilies {
		for _, name := range f.samples {
			samples = append(samples, metrics.Sample{Name: name})
		}
	}
	metrics.Read(samples)
	for _, f := range runtimeFamilies {
		var sum uint64
		for range f.samples {
			sum += samples[0].Value.Uint64()
			samples = samples[1:]
		}
		w.Single(f.name, f.typ, f.help, float64(sum))
	}
}

// procStat holds the fields of /proc/<pid>/stat the collector writes.
type procStat struct {
	utime, stime uint64 // clock ticks
	threads      int64
	start        uint64 // clock ticks after boot
	vsize        uint64 // bytes
	rss          int64  // pages
}

// readProcStat reads /proc/<pid>/stat (proc(5)). The command name, in
// parentheses, may hold spaces and parentheses itself: the fields are
// counted from its last ')'.
func readProcStat(path string) (procStat, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return procStat{}, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, errMalformed(path)
	}
	// Fields from the third (state) on; proc(5) numbers them from 1.
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 22 {
		return procStat{}, errMalformed(path)
	}
	field := func(n int) uint64 { v, _ := strconv.ParseUint(f[n-3], 10, 64); return v }
	return procStat{utime: field(14), stime: field(15), threads: int64(field(20)), start: field(22),
		vsize: field(23), rss: int64(field(24))}, nil
}

// bootTime reads the btime line of /proc/stat: the boot, in seconds since
// the Unix epoch.
func bootTime(path string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "btime "); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, errMalformed(path)
}

// maxOpenFiles reads the soft "Max open files" limit of /proc/<pid>/limits.
func maxOpenFiles(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "Max open files"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				return strconv.ParseUint(f[0], 10, 64)
			}
		}
	}
	return 0, errMalformed(path)
}

// countDir counts a directory's entries, a batch of names at a time (a
// router with thousands of connections has thousands of descriptors).
func countDir(path string) (int, error) {
	d, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer d.Close()
	n := 0
	for {
		names, err := d.Readdirnames(1024)
		n += len(names)
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

type errMalformed string

func (e errMalformed) Error() string { return string(e) + ": not in the format proc(5) gives" }
