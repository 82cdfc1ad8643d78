package router

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// restarted starts a router anew on cfg, as a restart or an upgrade's new
// process would, in front of f's workers.
func (f *fleet) restarted(cfg config.Config) *fleet {
	f.t.Helper()
	r, err := Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(f.t, err)
	f.t.Cleanup(func() { r.Close() })
	return &fleet{t: f.t, r: r, mocks: f.mocks, client: f.client}
}

// With state_file set, the workers the admin API added, with the adapters
// declared for them since, outlast a restart: the new router starts with
// them, probes them and routes to them. A worker drained through the admin
// API, the adapters declared for a config worker (the config is its
// source) and a worker the config has come to name are not kept.
func TestTheStateFileKeepsTheAdminAPIsWorkersAcrossARestart(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state.json")
	f := startFleet(t, mocks(1, 3, 0), func(c *config.Config) { c.StateFile = state })
	var extra []*mockworker.Worker
	for id := uint64(2); id <= 3; id++ {
		m, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: id, Tokens: 3})
		require.NoError(t, err)
		t.Cleanup(func() { m.Close() })
		extra = append(extra, m)
		code, body := adminDo(t, f, "POST", "/workers", fmt.Sprintf(`{"id":%d,"url":%q,"capacity":4}`, id, m.URL()), "")
		require.Equal(t, http.StatusCreated, code, body)
	}
	for path, loras := range map[string]string{"/workers/2/loras": `{"loras":["sql"]}`, "/workers/1/loras": `{"loras":["cfg"]}`} {
		code, body := adminDo(t, f, "PUT", path, loras, "")
		require.Equal(t, http.StatusOK, code, body)
	}
	code, body := adminDo(t, f, "DELETE", "/workers/3", "", "")
	require.Equal(t, http.StatusAccepted, code, body)
	st, err := readState(state)
	require.NoError(t, err)
	require.Len(t, st.Workers, 1)
	assert.Equal(t, dataplane.WorkerSpec{ID: 2, URL: extra[0].URL(), Capacity: 4, LoRAs: []string{"sql"}}, withoutDefaults(st.Workers[0]))
	leftovers, _ := filepath.Glob(filepath.Join(filepath.Dir(state), ".*"))
	assert.Empty(t, leftovers, "written through a file renamed over it")

	cfg := f.r.CurrentConfig()
	require.NoError(t, f.r.Close())
	g := f.restarted(cfg)
	w2, ok := g.r.Registry.Get(2)
	require.True(t, ok, "the worker the admin API added is back")
	assert.Equal(t, 4.0, w2.Spec().Capacity)
	assert.Equal(t, []string{"sql"}, w2.DeclaredAdapters())
	_, ok = g.r.Registry.Get(3)
	assert.False(t, ok, "the drained one is not")
	w1, _ := g.r.Registry.Get(1)
	assert.Empty(t, w1.DeclaredAdapters(), "a config worker's adapters come from the config")
	require.Eventually(t, w2.Healthy, 5*time.Second, 10*time.Millisecond, "probed, then routable")
	resp := g.post("/v1/chat/completions", chatBody, "x-worker-id", "2")
	assert.Equal(t, http.StatusOK, resp.StatusCode, readAll(t, resp))
	assert.EqualValues(t, 1, extra[0].Served())

	// A reload whose config names worker 2 takes it over: the file lets it go.
	next := cfg
	next.Workers = append(append([]dataplane.WorkerSpec{}, cfg.Workers...), dataplane.WorkerSpec{ID: 2, URL: extra[0].URL()})
	_, _, err = g.r.Reload(next)
	require.NoError(t, err)
	st, err = readState(state)
	require.NoError(t, err)
	assert.Empty(t, st.Workers)
	g.assertIdle()
}

// A reload moves state_file: the new file gets the state that runs at
// once, and the admin API's next changes, while the old one is left as it
// was; a new file the router cannot write refuses the reload, which
// changes nothing; turned off, nothing is written. A restart on the moved
// file starts with its workers.
func TestAReloadMovesTheStateFile(t *testing.T) {
	dir := t.TempDir()
	first, moved := filepath.Join(dir, "first.json"), filepath.Join(dir, "moved", "state.json")
	require.NoError(t, os.Mkdir(filepath.Dir(moved), 0o700))
	f := startFleet(t, mocks(1, 3, 0), func(c *config.Config) { c.StateFile = first })
	add := func(id uint64) {
		t.Helper()
		m, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: id, Tokens: 3})
		require.NoError(t, err)
		t.Cleanup(func() { m.Close() })
		code, body := adminDo(t, f, "POST", "/workers", fmt.Sprintf(`{"id":%d,"url":%q}`, id, m.URL()), "")
		require.Equal(t, http.StatusCreated, code, body)
	}
	ids := func(path string) (got []uint64) {
		t.Helper()
		st, err := readState(path)
		require.NoError(t, err)
		for _, s := range st.Workers {
			got = append(got, s.ID)
		}
		return got
	}
	reload := func(path string) ([]string, error) { return f.reloaded(func(c *config.Config) { c.StateFile = path }) }
	add(2)
	applied, err := reload(moved)
	require.NoError(t, err)
	assert.Equal(t, []string{"state_file=" + moved}, applied)
	assert.Equal(t, []uint64{2}, ids(moved), "the state that runs, at once")
	add(3)
	assert.Equal(t, []uint64{2, 3}, ids(moved))
	assert.Equal(t, []uint64{2}, ids(first), "the old file left as it was")

	_, err = reload(filepath.Join(dir, "missing", "state.json"))
	assert.ErrorContains(t, err, "key state_file", "a file it cannot write")
	assert.Equal(t, moved, f.r.CurrentConfig().StateFile, "refused: nothing changed")
	add(4)
	assert.Equal(t, []uint64{2, 3, 4}, ids(moved))

	applied, err = reload("")
	require.NoError(t, err)
	assert.Equal(t, []string{"state_file="}, applied)
	add(5)
	assert.Equal(t, []uint64{2, 3, 4}, ids(moved), "off: nothing written")

	cfg := f.r.CurrentConfig()
	cfg.StateFile = moved
	require.NoError(t, f.r.Close())
	g := f.restarted(cfg)
	for _, id := range []uint64{2, 3, 4} {
		_, ok := g.r.Registry.Get(id)
		assert.True(t, ok, "worker %d restored from the moved file", id)
	}
}

// With state_file set, the workers put down by hand stay down across a
// restart, those of the config and those not registered yet alike (a
// worker found on etcd joins after the start): a worker of such an id
// joins down. Put back, an id leaves the file.
func TestWorkersPutDownStayDownAcrossARestart(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state.json")
	f := startFleet(t, mocks(2, 3, 0), func(c *config.Config) { c.StateFile = state })
	code, body := adminDo(t, f, "PATCH", "/workers/1", `{"down":true}`, "")
	require.Equal(t, http.StatusOK, code, body)
	st, err := readState(state)
	require.NoError(t, err)
	assert.Equal(t, []uint64{1}, st.Down)
	assert.Empty(t, st.Workers, "a config worker's spec is the config's")
	st.Down = append(st.Down, 7) // as if worker 7, found on etcd, was put down before the restart
	b, err := json.Marshal(st)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(state, b, 0o600))

	cfg := f.r.CurrentConfig()
	_, restored, err := Check(cfg)
	require.NoError(t, err)
	assert.Equal(t, 2, restored.Down)
	require.NoError(t, f.r.Close())
	g := f.restarted(cfg)
	w1, _ := g.r.Registry.Get(1)
	assert.True(t, w1.Down(), "still down after the restart")
	for range 3 {
		assert.Equal(t, "2", g.servedBy("/v1/chat/completions", chatBody))
	}
	extra, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: 7, Tokens: 3})
	require.NoError(t, err)
	t.Cleanup(func() { extra.Close() })
	code, body = adminDo(t, g, "POST", "/workers", fmt.Sprintf(`{"id":7,"url":%q}`, extra.URL()), "")
	require.Equal(t, http.StatusCreated, code, body)
	assert.Equal(t, true, g.workerInfo(7)["down"], "joins down")

	code, body = adminDo(t, g, "PATCH", "/workers/1", `{"down":false}`, "")
	require.Equal(t, http.StatusOK, code, body)
	st, err = readState(state)
	require.NoError(t, err)
	assert.Equal(t, []uint64{7}, st.Down)
	resp := g.post("/v1/chat/completions", chatBody, "x-worker-id", "1")
	assert.Equal(t, http.StatusOK, resp.StatusCode, readAll(t, resp))
	g.assertIdle()
}

// withoutDefaults is spec with the fields Normalize fills in cleared, for
// comparing with what the admin API was sent.
func withoutDefaults(spec dataplane.WorkerSpec) dataplane.WorkerSpec {
	var blank dataplane.WorkerSpec
	blank.ID, blank.URL, blank.Capacity, blank.LoRAs = spec.ID, spec.URL, spec.Capacity, spec.LoRAs
	return blank
}

// A state file the router did not write, or cannot write, stops the start
// (and fastroute check) with the key and the file named: the router never
// starts without the workers it should have, or unable to keep them.
func TestAStateFileThatDoesNotLoadStopsTheStart(t *testing.T) {
	dir := t.TempDir()
	cfg := config.Default()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Workers = []dataplane.WorkerSpec{{ID: 1, URL: "http://127.0.0.1:9"}}
	for _, tc := range []struct {
		content, err string
	}{
		{"{not json", "is not a state the router wrote"},
		{`{"workers":[{"id":2,"url":"http://127.0.0.1:9"}],"extra":1}`, `unknown field "extra"`},
		{`{"workers":[{"id":2,"url":"ftp://x"}]}`, "worker 2"},
		{`{"workers":[{"id":1,"url":"http://127.0.0.1:9"},{"id":2,"url":"http://127.0.0.1:9"},{"id":2,"url":"http://127.0.0.1:9"}]}`, "worker 2"},
		{`{"workers":[],"dns_drained":["10.0.0.1"]}`, `dns_drained: "10.0.0.1" is not an address ip:port`},
		{`{"workers":[],"dns_drained":["10.0.0.1:80","10.0.0.1:80"]}`, "appears twice"},
		{`{"workers":[],"down":[0]}`, "down: worker id 0 is not a positive integer"},
		{`{"workers":[],"down":[3,3]}`, "down: worker id 3"},
	} {
		cfg.StateFile = filepath.Join(dir, "state.json")
		require.NoError(t, os.WriteFile(cfg.StateFile, []byte(tc.content), 0o600))
		r, err := Start(cfg, slog.New(slog.DiscardHandler))
		if r != nil {
			r.Close()
		}
		if assert.Error(t, err, tc.content) {
			assert.Contains(t, err.Error(), "key state_file")
			assert.Contains(t, err.Error(), tc.err)
		}
	}
	_, _, err := Check(cfg)
	assert.ErrorContains(t, err, "key state_file")

	cfg.StateFile = filepath.Join(dir, "missing", "state.json")
	r, err := Start(cfg, slog.New(slog.DiscardHandler))
	if r != nil {
		r.Close()
	}
	assert.ErrorContains(t, err, "key state_file", "a file it cannot write")
}

// Hand drains of DNS workers in a state file are dropped, with a warning,
// by a router whose config has discovery.dns off: nothing would hold them.
func TestDNSHandDrainsWithoutDNSAreDropped(t *testing.T) {
	cfg := config.Default()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Workers = []dataplane.WorkerSpec{{ID: 1, URL: "http://127.0.0.1:9"}}
	cfg.StateFile = filepath.Join(t.TempDir(), "state.json")
	require.NoError(t, os.WriteFile(cfg.StateFile, []byte(`{"workers":[],"dns_drained":["10.0.0.1:80"]}`), 0o600))
	var logs syncBuffer
	r, err := Start(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })
	assert.Contains(t, logs.String(), "hand drains of workers found by DNS dropped: discovery.dns is off")
	st, err := readState(cfg.StateFile)
	require.NoError(t, err)
	assert.Empty(t, st.DNSDrained)
}
