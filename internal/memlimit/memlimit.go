// Package memlimit keeps the Go runtime's soft memory limit below the
// memory limit of the process's cgroup, as that limit changes. Go sets
// GOMAXPROCS from the cgroup's CPU quota, but nothing from its memory
// limit: without a soft limit the collector lets the heap grow to twice
// what it holds live, and a burst (thousands of streams opened at once)
// can take a router in a container past its limit and have it killed.
//
// The limit is the tightest of the process's cgroup and its ancestors up
// to the hierarchy's mount: cgroup v2's memory.max and memory.high (the
// throttle point, above which the kernel reclaims from the cgroup and
// slows its allocations: systemd's MemoryHigh=, Kubernetes' memory QoS),
// else cgroup v1's memory.limit_in_bytes, found through
// /proc/self/mountinfo and /proc/self/cgroup (a container's own namespace
// or the host's).
package memlimit

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
)

// Ratio is the share of the cgroup's limit the Go runtime's soft limit is
// set to: the rest is for what the runtime does not count and the cgroup
// does (the binary's pages, the kernel's socket buffers).
const Ratio = 0.9

// Limiter keeps the Go runtime's soft memory limit at Ratio of the memory
// limit of the process's cgroup read under Root (Read), unless Getenv says
// GOMEMLIMIT is set: the operator's own limit, or "off", stands. Apply
// reads the cgroup's limit again each time (Kubernetes resizes a running
// container's), so that the soft limit follows it. It is used by one
// goroutine at a time.
type Limiter struct {
	Root   string
	Getenv func(string) string
	set    int64 // the soft limit this Limiter set last; 0: none
}

// Apply reads the cgroup's limit and sets the soft limit to Ratio of it,
// or lifts the one it set when the cgroup has none any more. It returns
// the soft limit in force (0: none of its own), the cgroup's limit, and
// whether this call changed the soft limit. A limit that cannot be read
// changes nothing.
func (l *Limiter) Apply() (soft int64, lim Limit, changed bool, err error) {
	if l.Getenv("GOMEMLIMIT") != "" {
		return 0, Limit{}, false, nil
	}
	lim, ok, err := Read(l.Root)
	if err != nil {
		return l.set, Limit{}, false, err
	}
	if ok {
		soft = int64(float64(lim.Bytes) * Ratio)
	}
	if soft == l.set {
		return soft, lim, false, nil
	}
	if soft > 0 {
		debug.SetMemoryLimit(soft)
	} else {
		debug.SetMemoryLimit(math.MaxInt64) // the runtime's own default: none
	}
	l.set = soft
	return soft, lim, true, nil
}

// Limit is a cgroup's memory limit and the file it was read from.
type Limit struct {
	Bytes int64
	File  string
}

// unlimitedV1 is the least cgroup v1 value that means no limit: v1 writes
// its maximum, rounded down to a page, for none.
const unlimitedV1 = 1 << 62

// Read returns the memory limit of the process's cgroup read under root
// ("/" but in tests): the tightest set on it or an ancestor, cgroup v2's
// first, then v1's. ok is false when no cgroup sets one.
func Read(root string) (lim Limit, ok bool, err error) {
	found, err := placements(root)
	if err != nil {
		return Limit{}, false, err
	}
	for _, p := range found {
		lim, ok, err := tightest(p.mount, p.group, p.files)
		if err != nil || ok {
			return lim, ok, err
		}
	}
	return Limit{}, false, nil
}

// hierarchies are the cgroup hierarchies that may limit memory, in the
// order Read takes them: v2's, then v1's memory controller's; each with
// the files that say a cgroup's limits.
var hierarchies = []struct {
	fstype, controller string
	files              []string
}{
	{"cgroup2", "", []string{"memory.max", "memory.high"}}, {"cgroup", "memory", []string{"memory.limit_in_bytes"}},
}

// placement is the process's cgroup in one of hierarchies: the directory
// the hierarchy is mounted at (under root), the cgroup's path below it,
// and the hierarchy's limit files.
type placement struct {
	mount, group string
	files        []string
}

// placements returns the process's cgroup in each of hierarchies mounted
// under root, in their order, read from /proc/self/mountinfo and
// /proc/self/cgroup.
func placements(root string) ([]placement, error) {
	mounts, err := os.ReadFile(filepath.Join(root, "proc/self/mountinfo"))
	if err != nil {
		return nil, err
	}
	groups, err := os.ReadFile(filepath.Join(root, "proc/self/cgroup"))
	if err != nil {
		return nil, err
	}
	var out []placement
	for _, h := range hierarchies {
		mountRoot, mountPoint, found := mountOf(mounts, h.fstype, h.controller)
		if !found {
			continue
		}
		if group, found := groupOf(groups, h.controller); found {
			out = append(out, placement{filepath.Join(root, mountPoint), within(group, mountRoot), h.files})
		}
	}
	return out, nil
}

// mountOf finds in mountinfo the mount of the hierarchy of type fstype
// (cgroup2; or cgroup with controller among its options): the cgroup it
// shows (its root) and where.
func mountOf(mountinfo []byte, fstype, controller string) (root, point string, ok bool) {
	sc := bufio.NewScanner(bytes.NewReader(mountinfo))
	for sc.Scan() {
		// ID parent major:minor root point options [optional...] - fstype source superoptions
		before, after, found := strings.Cut(sc.Text(), " - ")
		fields, tail := strings.Fields(before), strings.Fields(after)
		if !found || len(fields) < 5 || len(tail) < 3 || tail[0] != fstype {
			continue
		}
		if controller != "" && !hasItem(tail[2], controller) {
			continue
		}
		return unescape(fields[3]), unescape(fields[4]), true
	}
	return "", "", false
}

// groupOf finds in /proc/self/cgroup the process's cgroup in the v2
// hierarchy (controller "") or the v1 one of controller.
func groupOf(cgroup []byte, controller string) (string, bool) {
	sc := bufio.NewScanner(bytes.NewReader(cgroup))
	for sc.Scan() {
		// hierarchy-ID:controllers:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if controller == "" && parts[0] == "0" && parts[1] == "" || controller != "" && hasItem(parts[1], controller) {
			return parts[2], true
		}
	}
	return "", false
}

// within is group's path below the mount that shows the cgroup
// mountRoot ("/" in a container's own namespace); "/" when group is not
// below it (the mount shows a cgroup the process left).
func within(group, mountRoot string) string {
	rel, err := filepath.Rel(mountRoot, group)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "/"
	}
	return path.Join("/", rel)
}

// tightest reads files in the cgroup dir mount+group and in each of its
// ancestors up to mount, and returns the least limit set.
func tightest(mount, group string, files []string) (lim Limit, ok bool, err error) {
	for g := group; ; g = path.Dir(g) {
		for _, file := range files {
			name := filepath.Join(mount, g, file)
			data, err := os.ReadFile(name)
			switch {
			case errors.Is(err, os.ErrNotExist):
				// The root cgroup has no limit file, nor has a hierarchy
				// without the memory controller.
			case err != nil:
				return Limit{}, false, err
			default:
				n, set, err := parseLimit(data)
				if err != nil {
					return Limit{}, false, fmt.Errorf("%s: %w", name, err)
				}
				if set && (!ok || n < lim.Bytes) {
					lim, ok = Limit{Bytes: n, File: name}, true
				}
			}
		}
		if g == "/" || g == "." {
			return lim, ok, nil
		}
	}
}

// parseLimit reads a limit file: "max" or v1's largest values are none.
func parseLimit(data []byte) (n int64, set bool, err error) {
	s := strings.TrimSpace(string(data))
	if s == "max" {
		return 0, false, nil
	}
	n, err = strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, false, fmt.Errorf("%q is not a limit in bytes", s)
	}
	return n, n < unlimitedV1, nil
}

// hasItem says whether the comma-separated list holds item.
func hasItem(list, item string) bool {
	for it := range strings.SplitSeq(list, ",") {
		if it == item {
			return true
		}
	}
	return false
}

// unescape undoes mountinfo's octal escapes of a path (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
