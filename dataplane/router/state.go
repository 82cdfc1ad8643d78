package router

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"

	"github.com/fastroute/fastroute/dataplane"
)

// adminState is what the admin API changed in a running router and
// state_file keeps, so that a restart or an upgrade's new process starts
// with it, as a reload keeps it: the workers POST /workers added, each
// with the adapters declared for it (its own, or those PUT
// /workers/{id}/loras set since), the addresses of the workers found by
// DNS that DELETE /workers/{id} drained while DNS still names them, and
// the ids of the workers PATCH /workers/{id} put down but those found on
// etcd (their down marks there keep them). Workers of the config, and
// those found on etcd or by DNS, have their own source and are not in
// Workers; nor is a worker being drained, which is on its way out.
type adminState struct {
	Workers []dataplane.WorkerSpec `json:"workers"`
	// DNSDrained are ip:port addresses (dns.Watcher.Held).
	DNSDrained []string `json:"dns_drained,omitempty"`
	// Down are the ids put down by hand (Registry.DownIDs) but those of
	// etcd's workers and down marks.
	Down []uint64 `json:"down,omitempty"`
	// drained are DNSDrained's addresses as readState parsed them.
	drained []netip.AddrPort
}

// readState reads a state file; one that does not exist yet is an empty
// state.
func readState(path string) (adminState, error) {
	var st adminState
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("key state_file: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return st, fmt.Errorf("key state_file: %s is not a state the router wrote: %v (remove it to start without the workers the admin API added)", path, err)
	}
	seen := map[uint64]bool{}
	for i := range st.Workers {
		id := st.Workers[i].ID
		if err := st.Workers[i].Normalize(); err != nil {
			return st, fmt.Errorf("key state_file: %s: worker %d: %v", path, id, err)
		}
		if seen[id] {
			return st, fmt.Errorf("key state_file: %s: worker %d appears twice", path, id)
		}
		seen[id] = true
	}
	for _, a := range st.DNSDrained {
		ap, err := netip.ParseAddrPort(a)
		if err != nil || slices.Contains(st.drained, ap) {
			return st, fmt.Errorf("key state_file: %s: dns_drained: %q is not an address ip:port, or appears twice", path, a)
		}
		st.drained = append(st.drained, ap)
	}
	for i, id := range st.Down {
		if id == 0 || slices.Contains(st.Down[:i], id) {
			return st, fmt.Errorf("key state_file: %s: down: worker id %d is not a positive integer, or appears twice", path, id)
		}
	}
	return st, nil
}

// added returns how many of the state's workers a start adds to the
// config's workers: those the config does not name.
func (st adminState) added(workers []dataplane.WorkerSpec) int {
	n := 0
	for _, spec := range st.Workers {
		if !names(workers, spec.ID) {
			n++
		}
	}
	return n
}

// names says whether workers holds the worker id.
func names(workers []dataplane.WorkerSpec, id uint64) bool {
	return slices.ContainsFunc(workers, func(s dataplane.WorkerSpec) bool { return s.ID == id })
}

// restoreState adds the workers of the state file (st, as check read it)
// the config does not name (the config's spec of a worker it names now
// serves, as a reload would have it), unprobed: each is routable once a
// health probe passes, as after POST /workers. It puts down the ids the
// file lists down (those found on etcd or by DNS as they join). It then
// writes the file again, which a router that cannot write it refuses to
// start on.
func (r *Router) restoreState(st adminState) error {
	path := r.Config.StateFile
	if path == "" {
		return nil
	}
	for _, spec := range st.Workers {
		if names(r.Config.Workers, spec.ID) {
			r.log.Info("state_file: the config names this worker now; its spec serves", "worker", spec.ID)
			continue
		}
		if _, err := r.Registry.AddUnprobed(spec); err != nil {
			return fmt.Errorf("key state_file: %s: worker %d: %w", path, spec.ID, err)
		}
	}
	if len(st.Workers) > 0 {
		r.log.Info("workers the admin API added restored from state_file", "file", path, "workers", len(st.Workers))
	}
	if len(st.Down) > 0 {
		r.Registry.SetDownIDs(st.Down)
		r.log.Info("workers put down by hand kept down from state_file (PATCH /workers/{id} {\"down\":false} puts one back)", "file", path, "workers", st.Down)
	}
	switch {
	case len(st.DNSDrained) == 0:
	case r.DNS() == nil:
		r.log.Warn("state_file: hand drains of workers found by DNS dropped: discovery.dns is off", "file", path, "addresses", st.DNSDrained)
	default:
		r.DNS().Restore(st.drained)
		r.log.Info("hand drains of workers found by DNS restored from state_file", "file", path, "addresses", st.DNSDrained)
	}
	return r.writeState(path)
}

// saveState writes state_file after the admin API changed the workers; a
// failure is logged (the change stands, but would not outlast a restart).
// It waits for a reload under way, which writes it too.
func (r *Router) saveState() {
	r.reloadMu.Lock()
	defer r.reloadMu.Unlock()
	r.saveStateLocked()
}

// saveStateLocked is saveState for a caller that holds reloadMu.
func (r *Router) saveStateLocked() {
	if r.Config.StateFile == "" {
		return
	}
	if err := r.writeState(r.Config.StateFile); err != nil {
		r.log.Error("state_file not written: the admin API's latest changes would not outlast a restart", "err", err)
	}
}

// writeState writes the admin state of the registry now to path (the
// state_file), whole or not at all (writeWhole). The caller holds
// reloadMu, or runs before the router serves.
func (r *Router) writeState(path string) error {
	st := adminState{Workers: []dataplane.WorkerSpec{}}
	config := map[uint64]bool{}
	for _, s := range r.Config.Workers {
		config[s.ID] = true
	}
	for _, w := range r.Registry.All() {
		if config[w.ID()] || w.Draining() || r.knownDiscovered(w.ID()) {
			continue
		}
		spec := *w.Spec()
		spec.LoRAs = w.DeclaredAdapters()
		st.Workers = append(st.Workers, spec)
	}
	slices.SortFunc(st.Workers, func(a, b dataplane.WorkerSpec) int { return cmp.Compare(a.ID, b.ID) })
	if w := r.DNS(); w != nil {
		st.DNSDrained = w.Held()
	}
	for _, id := range r.Registry.DownIDs() {
		// A worker found on etcd is kept down by its mark there, which
		// may be lifted while this router is stopped.
		if e := r.Discovery(); e == nil || !(e.Known(id) || e.DownMarked(id)) {
			st.Down = append(st.Down, id)
		}
	}
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := writeWhole(path, append(b, '\n')); err != nil {
		return fmt.Errorf("key state_file: %w", err)
	}
	return nil
}

// writeWhole writes b to path whole or not at all: to a file beside it,
// synced, then renamed over it.
func writeWhole(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(b)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
	}
	return err
}
