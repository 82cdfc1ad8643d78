package router

import (
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/discovery/dns"
	"github.com/fastroute/fastroute/internal/fakedns"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mocksOnOnePort starts a mock worker on each loopback address of ips, all
// on one port (a name's port is every address's), and returns the port.
func mocksOnOnePort(t *testing.T, ips ...string) int {
	t.Helper()
	for range 20 {
		first, err := net.Listen("tcp", ips[0]+":0")
		require.NoError(t, err)
		port := first.Addr().(*net.TCPAddr).Port
		lns := []net.Listener{first}
		for _, ip := range ips[1:] {
			ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
			if err != nil {
				break
			}
			lns = append(lns, ln)
		}
		if len(lns) < len(ips) { // the port was taken on another address: try another
			for _, ln := range lns {
				ln.Close()
			}
			continue
		}
		for i, ln := range lns {
			m := mockworker.Serve(ln, mockworker.Options{ID: uint64(i + 1), Tokens: 3})
			t.Cleanup(func() { m.Close() })
		}
		return port
	}
	t.Fatal("no port free on every address")
	return 0
}

// startFakeDNS starts a DNS server on loopback for the test, closed at
// its end.
func startFakeDNS(t *testing.T) *fakedns.Server {
	t.Helper()
	srv, err := fakedns.Start()
	require.NoError(t, err)
	t.Cleanup(func() { srv.Close() })
	return srv
}

// Workers found by DNS name: every address the name resolves to is a
// worker with the name's port and the template's fields, served once
// probed. An address that leaves the answer is drained and removed; a
// worker drained by hand stays drained while DNS still names it; a static
// worker may not take a DNS worker's id.
func TestWorkersFoundByDNSName(t *testing.T) {
	srv := startFakeDNS(t)
	port := mocksOnOnePort(t, "127.0.0.1", "127.0.0.2")
	srv.Set("vllm.fastroute.test", "127.0.0.1", "127.0.0.2")
	name := "vllm.fastroute.test.:" + strconv.Itoa(port)
	f := startFleet(t, nil, func(c *config.Config) {
		c.Discovery.DNS = config.DNS{Names: []string{name}, Interval: 50 * time.Millisecond, Server: srv.Addr(), Scheme: "http",
			Worker: dataplane.WorkerSpec{Capacity: 3}}
	})
	one, two := dns.ID(net.JoinHostPort("127.0.0.1", strconv.Itoa(port))), dns.ID(net.JoinHostPort("127.0.0.2", strconv.Itoa(port)))
	require.Len(t, f.r.Registry.All(), 2, "the first lookup is done when Start returns")
	for _, id := range []uint64{one, two} {
		w, ok := f.r.Registry.Get(id)
		require.True(t, ok)
		assert.Equal(t, 3.0, w.Spec().Capacity)
	}
	served := map[string]int{}
	require.Eventually(t, func() bool {
		resp, _ := f.send(http.MethodPost, "/v1/chat/completions", chatBody)
		if resp.StatusCode == http.StatusOK { // else 503: no worker probed yet
			served[resp.Header.Get("x-fastroute-worker")]++
		}
		return len(served) == 2
	}, 5*time.Second, 10*time.Millisecond, "both workers serve once probed")
	assert.Contains(t, served, strconv.FormatUint(two, 10))
	assert.Equal(t, "1", metric(t, f, `fastroute_dns_discovery_up{name="`+name+`"}`))
	_, text := adminDo(t, f, http.MethodGet, "/workers/"+strconv.FormatUint(two, 10), "", "")
	assert.Contains(t, text, `"discovered":"dns"`)

	srv.Set("vllm.fastroute.test", "127.0.0.1")
	require.Eventually(t, func() bool { _, ok := f.r.Registry.Get(two); return !ok }, 5*time.Second, 10*time.Millisecond,
		"an address that left DNS is drained and removed")
	for range 4 {
		resp, text := f.send(http.MethodPost, "/v1/chat/completions", chatBody)
		require.Equal(t, http.StatusOK, resp.StatusCode, text)
		assert.Equal(t, strconv.FormatUint(one, 10), resp.Header.Get("x-fastroute-worker"))
	}

	code, text := adminDo(t, f, http.MethodDelete, "/workers/"+strconv.FormatUint(one, 10), "", "")
	require.Equal(t, http.StatusAccepted, code, text)
	time.Sleep(200 * time.Millisecond) // four lookups
	w, ok := f.r.Registry.Get(one)
	assert.True(t, !ok || w.Draining(), "drained by hand, it is not put again while DNS names it")
	assert.True(t, f.r.DNS().Known(one))

	cfg := f.r.CurrentConfig()
	cfg.Workers = append(cfg.Workers, dataplane.WorkerSpec{ID: two, URL: "http://127.0.0.1:1"})
	_, _, err := f.r.Reload(cfg)
	assert.NoError(t, err, "an id DNS no longer names is free")
	cfg.Workers = append(cfg.Workers, dataplane.WorkerSpec{ID: one, URL: "http://127.0.0.1:2"})
	_, _, err = f.r.Reload(cfg)
	assert.ErrorContains(t, err, "is a worker found on etcd or in DNS")
	f.assertIdle()
}

// With state_file, a hand drain of a worker found by DNS outlasts a
// restart: the file names its address, the new router does not add it
// while DNS names it, and the file lets it go once the address left DNS.
func TestStateFileKeepsHandDrainsOfDNSWorkers(t *testing.T) {
	srv := startFakeDNS(t)
	port := mocksOnOnePort(t, "127.0.0.1", "127.0.0.2")
	srv.Set("vllm.fastroute.test", "127.0.0.1", "127.0.0.2")
	state := filepath.Join(t.TempDir(), "state.json")
	f := startFleet(t, nil, func(c *config.Config) {
		c.StateFile = state
		c.Discovery.DNS = config.DNS{Names: []string{"vllm.fastroute.test.:" + strconv.Itoa(port)}, Interval: 50 * time.Millisecond,
			Server: srv.Addr(), Scheme: "http"}
	})
	oneAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	one, two := dns.ID(oneAddr), dns.ID(net.JoinHostPort("127.0.0.2", strconv.Itoa(port)))
	code, text := adminDo(t, f, http.MethodDelete, "/workers/"+strconv.FormatUint(one, 10), "", "")
	require.Equal(t, http.StatusAccepted, code, text)
	st, err := readState(state)
	require.NoError(t, err)
	assert.Equal(t, []string{oneAddr}, st.DNSDrained)
	assert.Empty(t, st.Workers, "workers found by DNS are not the admin API's")

	cfg := f.r.CurrentConfig()
	require.NoError(t, f.r.Close())
	g := f.restarted(cfg)
	_, ok := g.r.Registry.Get(one)
	assert.False(t, ok, "held across the restart: not added while DNS names it")
	_, ok = g.r.Registry.Get(two)
	assert.True(t, ok)
	assert.True(t, g.r.DNS().Known(one), "its id stays taken")
	time.Sleep(200 * time.Millisecond) // four lookups
	_, ok = g.r.Registry.Get(one)
	assert.False(t, ok)

	srv.Set("vllm.fastroute.test", "127.0.0.2")
	require.Eventually(t, func() bool {
		st, err := readState(state)
		return err == nil && len(st.DNSDrained) == 0
	}, 5*time.Second, 10*time.Millisecond, "the address left DNS: the file forgets the drain")
	srv.Set("vllm.fastroute.test", "127.0.0.1", "127.0.0.2")
	require.Eventually(t, func() bool { _, ok := g.r.Registry.Get(one); return ok }, 5*time.Second, 10*time.Millisecond,
		"back in DNS, it is a worker again")
	g.assertIdle()
}

// A reload changes the names discovery.dns looks up, from the next round
// on: a name added brings its workers, one dropped takes its workers
// away; its interval, from the reload; and its other keys from the next
// round (a new scheme and fields replace a worker). A list emptied turns
// it off: its workers drained.
func TestAReloadChangesTheDNSNames(t *testing.T) {
	srv := startFakeDNS(t)
	port := mocksOnOnePort(t, "127.0.0.1", "127.0.0.2")
	srv.Set("a.fastroute.test", "127.0.0.1")
	srv.Set("b.fastroute.test", "127.0.0.2")
	nameA, nameB := "a.fastroute.test.:"+strconv.Itoa(port), "b.fastroute.test.:"+strconv.Itoa(port)
	f := startFleet(t, nil, func(c *config.Config) {
		c.Discovery.DNS = config.DNS{Names: []string{nameA}, Interval: 50 * time.Millisecond, Server: srv.Addr(), Scheme: "http"}
	})
	one, two := dns.ID(net.JoinHostPort("127.0.0.1", strconv.Itoa(port))), dns.ID(net.JoinHostPort("127.0.0.2", strconv.Itoa(port)))
	has := func(id uint64) bool { w, ok := f.r.Registry.Get(id); return ok && !w.Draining() }
	require.True(t, has(one))
	require.False(t, has(two))

	next := f.r.CurrentConfig()
	next.Discovery.DNS.Names = []string{nameA, nameB}
	applied, needRestart, err := f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"discovery.dns.names=[" + nameA + " " + nameB + "]"}, applied)
	assert.Empty(t, needRestart)
	require.Eventually(t, func() bool { return has(two) }, 5*time.Second, 10*time.Millisecond, "the name added brings its worker")

	next.Discovery.DNS.Names = []string{nameB}
	_, _, err = f.r.Reload(next)
	require.NoError(t, err)
	require.Eventually(t, func() bool { _, ok := f.r.Registry.Get(one); return !ok }, 5*time.Second, 10*time.Millisecond,
		"the name dropped takes its worker away")
	assert.True(t, has(two))
	_, text := adminDo(t, f, http.MethodGet, "/metrics", "", "")
	assert.NotContains(t, text, `name="`+nameA+`"`, "a dropped name leaves the metrics")

	// The interval applies from the reload: an hour's round does not see
	// the record change, a round of 20 ms given then does.
	next.Discovery.DNS.Interval = time.Hour
	applied, needRestart, err = f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"discovery.dns.interval=1h0m0s"}, applied)
	assert.Empty(t, needRestart)
	srv.Set("b.fastroute.test", "127.0.0.1", "127.0.0.2")
	time.Sleep(300 * time.Millisecond) // six rounds of the old interval
	assert.False(t, has(one), "no round within the hour")
	next.Discovery.DNS.Interval = 20 * time.Millisecond
	_, _, err = f.r.Reload(next)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return has(one) }, 5*time.Second, 10*time.Millisecond, "the next round is 20 ms from the reload")
	srv.Set("b.fastroute.test", "127.0.0.2")
	require.Eventually(t, func() bool { _, ok := f.r.Registry.Get(one); return !ok }, 5*time.Second, 10*time.Millisecond)

	// Its other keys apply from the next round too: a new scheme and
	// worker fields replace the worker (the same address: the same id).
	applied, err = f.reloaded(func(c *config.Config) {
		c.Discovery.DNS.Scheme, c.Discovery.DNS.Worker.Capacity, c.Discovery.DNS.Family = "https", 8, dns.PreferIPv6
	})
	require.NoError(t, err)
	assert.Equal(t, []string{"discovery.dns.scheme=https", "discovery.dns.family=prefer_ipv6",
		fmt.Sprintf("discovery.dns.worker=%+v", f.r.CurrentConfig().Discovery.DNS.Worker)}, applied)
	require.Eventually(t, func() bool {
		w, ok := f.r.Registry.Get(two)
		return ok && w.Spec().URL == "https://127.0.0.2:"+strconv.Itoa(port) && w.Spec().Capacity == 8
	}, 5*time.Second, 10*time.Millisecond, "the worker takes the new scheme and fields")

	// A list emptied turns DNS discovery off: its workers are drained,
	// its lookups and metrics stop.
	applied, err = f.reloaded(func(c *config.Config) { c.Discovery.DNS.Names = nil })
	require.NoError(t, err)
	assert.Equal(t, []string{"discovery.dns off (its workers drained)"}, applied)
	assert.Nil(t, f.r.DNS())
	require.Eventually(t, func() bool { _, ok := f.r.Registry.Get(two); return !ok }, 5*time.Second, 10*time.Millisecond)
	srv.Set("b.fastroute.test", "127.0.0.1", "127.0.0.2")
	time.Sleep(100 * time.Millisecond) // five rounds of the old interval
	_, ok := f.r.Registry.Get(one)
	assert.False(t, ok, "no lookup any more")
	_, text = adminDo(t, f, http.MethodGet, "/metrics", "", "")
	assert.NotContains(t, text, "fastroute_dns_discovery_up")
	f.assertIdle()
}

// A reload turns DNS discovery on for a router started without it: the
// names are looked up at once and every interval from then on.
func TestAReloadTurnsDNSDiscoveryOn(t *testing.T) {
	srv := startFakeDNS(t)
	port := mocksOnOnePort(t, "127.0.0.1", "127.0.0.2")
	srv.Set("vllm.fastroute.test", "127.0.0.1")
	name := "vllm.fastroute.test.:" + strconv.Itoa(port)
	f := startFleet(t, mocks(1, 1, 0), nil)
	assert.Nil(t, f.r.DNS())
	applied, err := f.reloaded(func(c *config.Config) {
		c.Discovery.DNS = config.DNS{Names: []string{name}, Interval: 20 * time.Millisecond, Server: srv.Addr(), Scheme: "http"}
	})
	require.NoError(t, err)
	assert.Equal(t, []string{"discovery.dns on: names [" + name + "]"}, applied)
	one, two := dns.ID(net.JoinHostPort("127.0.0.1", strconv.Itoa(port))), dns.ID(net.JoinHostPort("127.0.0.2", strconv.Itoa(port)))
	require.Eventually(t, func() bool { return f.r.Registry.Snapshot().Has(one) }, 5*time.Second, 10*time.Millisecond,
		"the name's worker joins and is probed")
	resp, body := f.send("POST", "/v1/chat/completions", chatBody, "x-worker-id", strconv.FormatUint(one, 10))
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	srv.Set("vllm.fastroute.test", "127.0.0.1", "127.0.0.2")
	require.Eventually(t, func() bool { _, ok := f.r.Registry.Get(two); return ok }, 5*time.Second, 10*time.Millisecond, "and every interval")
	_, text := adminDo(t, f, http.MethodGet, "/metrics", "", "")
	assert.Contains(t, text, `fastroute_dns_discovery_up{name="`+name+`"} 1`)
	f.assertIdle()
}
