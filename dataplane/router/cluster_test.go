package router

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/discovery"
	"github.com/fastroute/fastroute/discovery/etcdlocal"
	"github.com/fastroute/fastroute/discovery/etcdtest"
	"github.com/fastroute/fastroute/internal/testpki"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// clusterRouter starts a router that discovers its workers on e.
func clusterRouter(t *testing.T, e *etcdtest.Server, prefix string, tweak func(*config.Config)) *fleet {
	return startFleet(t, nil, func(c *config.Config) {
		c.Discovery.Etcd = config.Etcd{Endpoints: []string{e.Endpoint}, Prefix: prefix, DialTimeout: time.Second}
		if tweak != nil {
			tweak(c)
		}
	})
}

func register(t *testing.T, e *etcdtest.Server, prefix string, m *mockworker.Worker, id uint64, ttl time.Duration) *discovery.Registration {
	t.Helper()
	reg, err := discovery.Register(discovery.Options{Endpoints: []string{e.Endpoint}, Prefix: prefix, DialTimeout: time.Second},
		dataplane.WorkerSpec{ID: id, URL: m.URL()}, ttl)
	require.NoError(t, err)
	return reg
}

func startMocks(t *testing.T, n int) []*mockworker.Worker {
	t.Helper()
	var out []*mockworker.Worker
	t.Cleanup(func() { closeTogether(out) })
	for i := 0; i < n; i++ {
		m, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: uint64(i + 1), Tokens: 1})
		require.NoError(t, err)
		out = append(out, m)
	}
	return out
}

// Two routers see registered workers join, take requests, place sessions
// alike, and leave: at once on a clean deregistration, within the lease
// TTL when the registrar dies.
func TestTwoRoutersFollowEtcd(t *testing.T) {
	e := etcdtest.Start(t)
	const prefix = "/t1"
	a, b := clusterRouter(t, e, prefix, nil), clusterRouter(t, e, prefix, nil)
	ms := startMocks(t, 3)
	var regs []*discovery.Registration
	for i, m := range ms {
		regs = append(regs, register(t, e, prefix, m, uint64(i+1), 2*time.Second))
	}
	for _, f := range []*fleet{a, b} {
		require.Eventually(t, func() bool { return f.r.Registry.Snapshot().Len() == 3 }, 5*time.Second, 10*time.Millisecond)
	}
	status, body := adminDo(t, a, "GET", "/workers", "", "")
	assert.Equal(t, 200, status)
	assert.Contains(t, body, `"discovered":"etcd"`)
	for i := 0; i < 12; i++ {
		session := fmt.Sprintf("s%d", i)
		assert.Equal(t, a.servedBy("/v1/chat/completions", chatBody, "x-session-id", session),
			b.servedBy("/v1/chat/completions", chatBody, "x-session-id", session), "session %s", session)
	}

	require.NoError(t, regs[0].Close())
	for _, f := range []*fleet{a, b} {
		require.Eventually(t, func() bool { return !f.r.Registry.Snapshot().Has(1) }, 2*time.Second, 10*time.Millisecond, "a deregistered worker drains at once")
	}
	require.NoError(t, regs[1].Abandon()) // the registrar dies: its lease runs out
	left := time.Now()
	for _, f := range []*fleet{a, b} {
		require.Eventually(t, func() bool { return !f.r.Registry.Snapshot().Has(2) }, 3*time.Second+time.Second, 20*time.Millisecond, "worker 2 outlived its lease")
	}
	assert.Less(t, time.Since(left), 3*time.Second+500*time.Millisecond, "TTL + 1s")
	assert.True(t, a.r.Registry.Snapshot().Has(3) && b.r.Registry.Snapshot().Has(3))
	a.assertIdle()
	b.assertIdle()
	_ = regs[2].Close()
}

// With etcd gone the routers route on the last known workers and say so;
// once it is back they resync, and no request is lost meanwhile.
func TestEtcdOutageKeepsRouting(t *testing.T) {
	e := etcdtest.Start(t)
	const prefix = "/t2"
	f := clusterRouter(t, e, prefix, nil)
	ms := startMocks(t, 2)
	reg := register(t, e, prefix, ms[0], 1, 5*time.Second)
	defer reg.Close()
	require.Eventually(t, func() bool { return f.r.Registry.Snapshot().Has(1) }, 5*time.Second, 10*time.Millisecond)

	var wg sync.WaitGroup
	stop := make(chan struct{})
	failures := 0
	var mu sync.Mutex
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			resp, err := f.client.Post("http://"+f.r.Addr()+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
			mu.Lock()
			if err != nil || resp.StatusCode != 200 {
				failures++
			}
			mu.Unlock()
			if err == nil {
				readAll(t, resp)
			}
		}
	}()
	e.Stop()
	require.Eventually(t, func() bool { return !f.r.Discovery().Up() }, 5*time.Second, 20*time.Millisecond)
	_, body := adminDo(t, f, "GET", "/metrics", "", "")
	assert.Contains(t, body, "fastroute_discovery_up 0")
	_, body = adminDo(t, f, "GET", "/workers", "", "")
	assert.Contains(t, body, `"discovery_up":false`)
	time.Sleep(500 * time.Millisecond)
	assert.True(t, f.r.Registry.Snapshot().Has(1), "the last known workers stay")

	e.Restart()
	require.Eventually(t, func() bool { return f.r.Discovery().Up() }, 10*time.Second, 20*time.Millisecond)
	late := register(t, e, prefix, ms[1], 2, 5*time.Second)
	defer late.Close()
	require.Eventually(t, func() bool { return f.r.Registry.Snapshot().Has(2) }, 5*time.Second, 10*time.Millisecond, "in step again")
	close(stop)
	wg.Wait()
	assert.Zero(t, failures, "requests lost to the etcd outage")
	assert.True(t, f.r.Registry.Snapshot().Has(1))
	f.assertIdle()
}

// An id is never used twice: an etcd key with a config file's id is
// ignored, and a reload cannot add an id etcd already gave.
func TestDiscoveredAndStaticIDsNeverClash(t *testing.T) {
	e := etcdtest.Start(t)
	const prefix = "/t3"
	ms := startMocks(t, 2)
	f := clusterRouter(t, e, prefix, func(c *config.Config) {
		c.Workers = []dataplane.WorkerSpec{{ID: 1, URL: ms[0].URL()}}
	})
	clash := register(t, e, prefix, ms[1], 1, 5*time.Second)
	defer clash.Close()
	other := register(t, e, prefix, ms[1], 2, 5*time.Second)
	defer other.Close()
	require.Eventually(t, func() bool { return f.r.Registry.Snapshot().Has(2) }, 5*time.Second, 10*time.Millisecond)
	w, _ := f.r.Registry.Get(1)
	assert.Equal(t, ms[0].URL(), w.Spec().URL, "the config file's worker 1 stays")

	cfg := f.r.CurrentConfig()
	cfg.Workers = append(cfg.Workers, dataplane.WorkerSpec{ID: 2, URL: ms[0].URL()})
	_, _, err := f.r.Reload(cfg)
	assert.ErrorContains(t, err, "2 is a worker found on etcd or in DNS")
}

// DELETE /workers/{id} on one replica drains a discovered worker on every
// replica, until its registration ends.
func TestDrainMarkHonouredByEveryReplica(t *testing.T) {
	e := etcdtest.Start(t)
	const prefix = "/t4"
	a, b := clusterRouter(t, e, prefix, nil), clusterRouter(t, e, prefix, nil)
	ms := startMocks(t, 2)
	regs := []*discovery.Registration{register(t, e, prefix, ms[0], 1, 5*time.Second), register(t, e, prefix, ms[1], 2, 5*time.Second)}
	for _, f := range []*fleet{a, b} {
		require.Eventually(t, func() bool { return f.r.Registry.Snapshot().Len() == 2 }, 5*time.Second, 10*time.Millisecond)
	}
	status, _ := adminDo(t, a, "DELETE", "/workers/1", "", "")
	assert.Equal(t, 202, status)
	for _, f := range []*fleet{a, b} {
		require.Eventually(t, func() bool { return !f.r.Registry.Snapshot().Has(1) }, 3*time.Second, 10*time.Millisecond, "the other replica drains it too")
	}
	time.Sleep(300 * time.Millisecond)
	assert.False(t, b.r.Registry.Snapshot().Has(1), "the mark holds")
	assert.True(t, a.r.Registry.Snapshot().Has(2) && b.r.Registry.Snapshot().Has(2))

	// A new registration of the worker (a restart) starts without the mark.
	require.NoError(t, regs[0].Close())
	again := register(t, e, prefix, ms[0], 1, 5*time.Second)
	defer again.Close()
	for _, f := range []*fleet{a, b} {
		require.Eventually(t, func() bool { return f.r.Registry.Snapshot().Has(1) }, 5*time.Second, 10*time.Millisecond)
	}
	_ = regs[1].Close()
	a.assertIdle()
	b.assertIdle()
}

// PATCH /workers/{id} {"down":true} on one replica puts a worker found on
// etcd down on every replica, through a down mark there that outlives its
// registration (an engine restarted for its maintenance registers again,
// and stays down) until PATCH {"down":false} on any replica lifts it. A
// mark written before its worker registers has it join down. The state
// file leaves such workers to their marks.
func TestDownMarkHonouredByEveryReplica(t *testing.T) {
	e := etcdtest.Start(t)
	const prefix = "/t-down"
	state := filepath.Join(t.TempDir(), "state.json")
	a := clusterRouter(t, e, prefix, func(c *config.Config) { c.StateFile = state })
	b := clusterRouter(t, e, prefix, nil)
	ms := startMocks(t, 3)
	reg1 := register(t, e, prefix, ms[0], 1, 5*time.Second)
	reg2 := register(t, e, prefix, ms[1], 2, 5*time.Second)
	defer func() { _ = reg2.Close() }()
	for _, f := range []*fleet{a, b} {
		require.Eventually(t, func() bool { return f.r.Registry.Snapshot().Len() == 2 }, 5*time.Second, 10*time.Millisecond)
	}
	isDown := func(f *fleet, id uint64) bool { w, ok := f.r.Registry.Get(id); return ok && w.Down() }

	status, body := adminDo(t, a, "PATCH", "/workers/1", `{"down":true}`, "")
	require.Equal(t, 200, status, body)
	assert.Contains(t, body, `"down":true`)
	for _, f := range []*fleet{a, b} {
		require.Eventually(t, func() bool { return isDown(f, 1) && !f.r.Registry.Snapshot().Has(1) }, 3*time.Second, 10*time.Millisecond,
			"the other replica puts it down too")
		assert.True(t, f.r.Registry.Snapshot().Has(2))
	}
	b.assertIdle()
	resp, body := b.send(http.MethodPost, "/v1/chat/completions", chatBody, "x-worker-id", "1")
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, body)
	saved, err := os.ReadFile(state)
	require.NoError(t, err)
	assert.NotContains(t, string(saved), `"down"`, "kept down by its mark, not by the state file")

	// The engine restarted: its registration ends, a new one begins.
	require.NoError(t, reg1.Close())
	for _, f := range []*fleet{a, b} {
		require.Eventually(t, func() bool { _, ok := f.r.Registry.Get(1); return !ok }, 3*time.Second, 10*time.Millisecond)
	}
	reg1 = register(t, e, prefix, ms[0], 1, 5*time.Second)
	defer func() { _ = reg1.Close() }()
	for _, f := range []*fleet{a, b} {
		require.Eventually(t, func() bool { return isDown(f, 1) }, 5*time.Second, 10*time.Millisecond, "registered again, still down")
	}

	// A mark before its worker: it joins down.
	require.NoError(t, a.r.Discovery().MarkDown(3, true))
	reg3 := register(t, e, prefix, ms[2], 3, 5*time.Second)
	defer func() { _ = reg3.Close() }()
	for _, f := range []*fleet{a, b} {
		require.Eventually(t, func() bool { return isDown(f, 3) }, 5*time.Second, 10*time.Millisecond, "joined down")
	}

	status, body = adminDo(t, b, "PATCH", "/workers/1", `{"down":false}`, "")
	require.Equal(t, 200, status, body)
	status, body = adminDo(t, b, "PATCH", "/workers/3", `{"down":false}`, "")
	require.Equal(t, 200, status, body)
	for _, f := range []*fleet{a, b} {
		require.Eventually(t, func() bool {
			snap := f.r.Registry.Snapshot()
			return snap.Has(1) && snap.Has(3) && !isDown(f, 1) && !isDown(f, 3)
		}, 5*time.Second, 10*time.Millisecond, "lifted on the other replica: back on both")
	}

	// etcd down: put down on the replica asked only, and a 503 says so.
	e.Stop()
	status, body = adminDo(t, a, "PATCH", "/workers/2", `{"down":true}`, "")
	assert.Equal(t, http.StatusServiceUnavailable, status, body)
	assert.Contains(t, body, "worker 2 put down on this router only: etcd did not take its down mark")
	assert.True(t, isDown(a, 2))
	assert.False(t, isDown(b, 2))
	e.Restart()
	require.Eventually(t, func() bool { // a 503 until etcd has elected its leader again
		status, _ := adminDo(t, a, "PATCH", "/workers/2", `{"down":false}`, "")
		return status == 200
	}, 15*time.Second, 100*time.Millisecond)
	assert.False(t, isDown(a, 2))
	a.assertIdle()
	b.assertIdle()
}

// The same spec put again (a resync) keeps the worker as it is; a changed
// one replaces it.
func TestDiscoveredSpecPutTwiceKeepsTheWorker(t *testing.T) {
	f := startFleet(t, nil, nil)
	m := startMocks(t, 1)[0]
	target := discoveryTarget{f.r, "on etcd"}
	spec := dataplane.WorkerSpec{ID: 4, URL: m.URL()}
	require.NoError(t, target.Put(spec))
	first, _ := f.r.Registry.Get(4)
	require.NoError(t, target.Put(spec))
	again, _ := f.r.Registry.Get(4)
	assert.Same(t, first, again)
	spec.Capacity = 2
	require.NoError(t, target.Put(spec))
	changed, _ := f.r.Registry.Get(4)
	assert.NotSame(t, first, changed)
	assert.Equal(t, 2.0, changed.Spec().Capacity)
}

// Replicas that advertise their admin listeners find each other on etcd
// and share the prompt prefixes they record: a conversation whose turns
// alternate between them stays on its worker. A replica that stops
// deletes its key, and the other stops sending to it.
func TestReplicasFindEachOtherOnEtcdToSharePrefixes(t *testing.T) {
	e := etcdtest.Start(t)
	const prefix = "/t-prefixes"
	admin := freeAdminAddrs(t, 2)
	replica := func(i int) *fleet {
		return clusterRouter(t, e, prefix, func(c *config.Config) {
			prefixByInFlight(true)(c)
			c.AdminListen = admin[i]
			c.Router.PrefixAffinity.Advertise = "http://" + admin[i]
			c.Router.PrefixAffinity.ShareInterval = 5 * time.Millisecond
		})
	}
	a, b := replica(0), replica(1)
	for i, o := range cachingEngines(3) {
		m, err := mockworker.Start("127.0.0.1:0", o)
		require.NoError(t, err)
		t.Cleanup(func() { m.Close() })
		reg := register(t, e, prefix, m, uint64(i+1), 10*time.Second)
		t.Cleanup(func() { _ = reg.Close() })
	}
	peerOf := func(addr string) string {
		return fmt.Sprintf(`fastroute_prefix_shared_records_total{peer="http://%s",outcome="sent"}`, addr)
	}
	for i, f := range []*fleet{a, b} {
		require.Eventually(t, func() bool { return f.r.Registry.Snapshot().Len() == 3 }, 5*time.Second, 10*time.Millisecond)
		require.Eventually(t, func() bool {
			_, page := adminDo(t, f, "GET", "/metrics", "", "")
			return strings.Contains(page, peerOf(admin[1-i])) && !strings.Contains(page, peerOf(admin[i]))
		}, 5*time.Second, 10*time.Millisecond, "replica %d shares with the other, not with itself", i)
	}
	// A key that names no admin listener is ignored; one put after it
	// shows the watch went past it (etcd delivers a prefix's events in
	// order).
	opts := discovery.Options{Endpoints: []string{e.Endpoint}, Prefix: prefix, DialTimeout: time.Second}
	for _, u := range []string{"ftp://10.0.0.9/x", "http://127.0.0.1:1"} {
		reg, err := discovery.RegisterRouter(opts, u, 10*time.Second)
		require.NoError(t, err)
		t.Cleanup(func() { _ = reg.Close() })
	}
	require.Eventually(t, func() bool { return len(a.r.PrefixShare.Peers()) == 2 }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, []string{"http://" + admin[1], "http://127.0.0.1:1"}, a.r.PrefixShare.Peers(), "a key that names no admin listener is ignored")

	assert.Len(t, stayedPut(t, converseVia([]*fleet{a, b}, 5, 4, settled(t, a, b))), 3)
	taken, passed, unknown := b.r.Selector.PrefixRouted()
	assert.Equal(t, [3]uint64{10, 0, 0}, [3]uint64{taken, passed, unknown}, "replica b knew every conversation it saw from a's records")

	require.NoError(t, b.r.Close())
	require.Eventually(t, func() bool {
		_, page := adminDo(t, a, "GET", "/metrics", "", "")
		return !strings.Contains(page, peerOf(admin[1]))
	}, 5*time.Second, 10*time.Millisecond, "a stopped replica's key is deleted, and its peer stops sending to it")
	a.assertIdle()
}

// A replica that advertises itself while etcd does not answer keeps
// trying to register, and stopping does not wait out a registration
// attempt: Close returns within about the dial timeout.
func TestAReplicaStopsPromptlyWhileEtcdIsDown(t *testing.T) {
	down := freeAdminAddrs(t, 2) // nothing listens there
	f := startFleet(t, cachingEngines(1), func(c *config.Config) {
		prefixAffinity(true)(c)
		c.AdminListen = down[1]
		c.Router.PrefixAffinity.Advertise = "http://" + down[1]
		c.Discovery.Etcd = config.Etcd{Endpoints: []string{down[0]}, Prefix: "/t-down", DialTimeout: 500 * time.Millisecond}
	})
	time.Sleep(700 * time.Millisecond) // a registration attempt is under way
	start := time.Now()
	require.NoError(t, f.r.Close())
	assert.Less(t, time.Since(start), 2*time.Second, "a registration attempt ends with the router (it would wait 5.5 s)")
}

// keysOn counts the keys on etcd e under the prefix under.
func keysOn(t *testing.T, e *etcdtest.Server, under string) int {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: time.Second})
	require.NoError(t, err)
	defer cli.Close()
	resp, err := cli.Get(context.Background(), under, clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	return int(resp.Count)
}

// A reload that moves discovery.etcd to another etcd (new endpoints) has
// the router follow it: the workers registered there join, those of the
// etcd before are drained, and this replica's registration and its share
// of the keys' use move there, their keys on the etcd before deleted. A
// client certificate that does not load refuses the reload, and etcd
// turned off on a replica that advertises itself there waits for a
// restart (advertise, which needs etcd, does).
func TestAReloadMovesToAnotherEtcd(t *testing.T) {
	before, after := etcdtest.Start(t), etcdtest.Start(t)
	const prefix = "/moved"
	admin := freeAdminAddrs(t, 1)
	f := clusterRouter(t, before, prefix, func(c *config.Config) {
		prefixByInFlight(true)(c)
		c.AdminListen = admin[0]
		c.Router.PrefixAffinity.Advertise = "http://" + admin[0]
		c.APIKeysFile, c.APIKeysShareInterval = keysFile(t, "team-a "+teamAKey), 100*time.Millisecond
	})
	mocks := startMocks(t, 2)
	for i, e := range []*etcdtest.Server{before, after} {
		reg := register(t, e, prefix, mocks[i], uint64(i+1), 10*time.Second)
		t.Cleanup(func() { _ = reg.Close() })
	}
	servedBy := func() string {
		t.Helper()
		resp, text := f.send("POST", "/v1/chat/completions", chatBody, "Authorization", "Bearer "+teamAKey)
		require.Equal(t, http.StatusOK, resp.StatusCode, text)
		return resp.Header.Get("x-fastroute-worker")
	}
	require.Eventually(t, func() bool {
		return keysOn(t, before, discovery.RoutersKey(prefix)) == 1 && keysOn(t, before, discovery.UsageKey(prefix)) == 1
	}, 5*time.Second, 10*time.Millisecond, "registered and sharing on the first etcd")
	require.Eventually(t, func() bool { _, ok := f.r.Registry.Get(1); return ok }, 5*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return f.r.Registry.Snapshot().Has(1) }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, "1", servedBy())

	bad := f.r.CurrentConfig()
	bad.Discovery.Etcd.Endpoints = []string{after.Endpoint}
	bad.Discovery.Etcd.CertFile, bad.Discovery.Etcd.KeyFile = filepath.Join(t.TempDir(), "c.pem"), filepath.Join(t.TempDir(), "k.pem")
	require.NoError(t, os.WriteFile(bad.Discovery.Etcd.CertFile, []byte("not a certificate"), 0o600))
	require.NoError(t, os.WriteFile(bad.Discovery.Etcd.KeyFile, []byte("not a key"), 0o600))
	_, _, err := f.r.Reload(bad)
	assert.ErrorContains(t, err, "discovery.etcd")
	assert.Equal(t, []string{before.Endpoint}, f.r.CurrentConfig().Discovery.Etcd.Endpoints, "refused: nothing changed")

	applied, err := f.reloaded(func(c *config.Config) { c.Discovery.Etcd.Endpoints = []string{after.Endpoint} })
	require.NoError(t, err)
	assert.Contains(t, applied, fmt.Sprintf("discovery.etcd: endpoints [%s], prefix %s", after.Endpoint, prefix))
	for deadline := time.Now().Add(5 * time.Second); ; {
		w1, has1 := f.r.Registry.Get(1)
		if !has1 || w1.Draining() {
			w2, has2 := f.r.Registry.Get(2)
			require.True(t, has2 && w2.Healthy(), "the new etcd's worker takes requests before the old one's leaves")
			break
		}
		require.True(t, time.Now().Before(deadline), "worker 1 leaves")
	}
	require.Eventually(t, func() bool {
		_, gone := f.r.Registry.Get(1)
		return !gone && f.r.Registry.Snapshot().Has(2)
	}, 5*time.Second, 10*time.Millisecond, "the new etcd's worker joins, the one before's leaves")
	assert.Equal(t, "2", servedBy())
	require.Eventually(t, func() bool {
		return keysOn(t, after, discovery.RoutersKey(prefix)) == 1 && keysOn(t, after, discovery.UsageKey(prefix)) == 1 &&
			keysOn(t, before, discovery.RoutersKey(prefix)) == 0 && keysOn(t, before, discovery.UsageKey(prefix)) == 0
	}, 5*time.Second, 10*time.Millisecond, "the registration and the keys' share moved")

	off := f.r.CurrentConfig()
	off.Discovery.Etcd, off.Router.PrefixAffinity.Advertise, off.APIKeysShareInterval = config.Etcd{}, "", 0
	_, needRestart, err := f.r.Reload(off)
	require.NoError(t, err)
	assert.Subset(t, needRestart, []string{"discovery", "router.prefix_affinity"}, "etcd turned off waits for a restart with advertise")
	assert.Equal(t, []string{after.Endpoint}, f.r.CurrentConfig().Discovery.Etcd.Endpoints)
	f.assertIdle()
}

// etcd's TLS files are read again at a reload: a router whose CA file
// trusts another CA than the one that signed etcd's certificate finds no
// worker; the right CA written over the file, under the same name, and a
// reload of the same config, it follows etcd.
func TestAReloadReadsEtcdsTLSFilesAgain(t *testing.T) {
	ca, other := testpki.Root(t, "etcd-ca"), testpki.Root(t, "another-ca")
	serverCert, serverKey := ca.Server("etcd", 10).Files()
	caFile := testpki.WriteFile(t, "ca.pem", testpki.CertPEM(ca.Cert))
	e := etcdtest.StartTLS(t, &etcdlocal.TLS{CertFile: serverCert, KeyFile: serverKey, CAFile: caFile})
	const prefix = "/tls"
	clientCert, clientKey := ca.Client("router", 11).Files()
	secure := config.Etcd{Endpoints: []string{e.Endpoint}, Prefix: prefix, DialTimeout: time.Second, CertFile: clientCert, KeyFile: clientKey}
	m := startMocks(t, 1)[0]
	registrar := secure
	registrar.CAFile = caFile // trusts etcd
	reg, err := discovery.Register(etcdOptions(registrar, nil), dataplane.WorkerSpec{ID: 1, URL: m.URL()}, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Close() })

	trusted := testpki.WriteFile(t, "trusted.pem", testpki.CertPEM(other.Cert))
	f := startFleet(t, nil, func(c *config.Config) {
		c.Discovery.Etcd = secure
		c.Discovery.Etcd.CAFile = trusted
	})
	time.Sleep(500 * time.Millisecond) // lists that fail their handshakes
	assert.Zero(t, f.r.Registry.Snapshot().Len(), "etcd's certificate is not trusted")
	assert.False(t, f.r.Discovery().Up())

	require.NoError(t, os.WriteFile(trusted, testpki.CertPEM(ca.Cert), 0o600))
	applied, err := f.reloaded(func(*config.Config) {})
	require.NoError(t, err)
	assert.Equal(t, []string{fmt.Sprintf("discovery.etcd: endpoints [%s], prefix %s (its TLS files replaced)", e.Endpoint, prefix)}, applied)
	require.Eventually(t, func() bool { _, ok := f.r.Registry.Get(1); return ok && f.r.Discovery().Up() }, 5*time.Second, 10*time.Millisecond,
		"the CA read again: etcd trusted")
	applied, err = f.reloaded(func(*config.Config) {})
	require.NoError(t, err)
	assert.Empty(t, applied, "the files unchanged: nothing moves")

	require.NoError(t, os.Remove(trusted))
	_, err = f.reloaded(func(*config.Config) {})
	assert.ErrorContains(t, err, "discovery.etcd.ca_file")
}

// A reload turns etcd discovery on: the workers registered there join and
// serve beside the config's, a down mark there holds a worker of the
// config down, the scrape shows fastroute_discovery_up and the replica's
// share of its keys' use starts. Turned off, the workers found there are
// drained, the mark's hold lifted, the share ended (its key deleted) and
// the metric gone; the router serves on the config's workers.
func TestAReloadTurnsEtcdDiscoveryOnAndOff(t *testing.T) {
	e := etcdtest.Start(t)
	const prefix = "/toggled"
	reg := register(t, e, prefix, startMocks(t, 1)[0], 7, 10*time.Second)
	t.Cleanup(func() { _ = reg.Close() })
	f := startFleet(t, []mockworker.Options{{ID: 1, Tokens: 1}}, func(c *config.Config) { c.APIKeysFile = keysFile(t, "team-a "+teamAKey) })
	served := func(headers ...string) (int, string) {
		t.Helper()
		resp, _ := f.send("POST", "/v1/chat/completions", chatBody, append([]string{"Authorization", "Bearer " + teamAKey}, headers...)...)
		return resp.StatusCode, resp.Header.Get("x-fastroute-worker")
	}
	assert.Empty(t, metric(t, f, "fastroute_discovery_up"))

	applied, err := f.reloaded(func(c *config.Config) {
		c.Discovery.Etcd = config.Etcd{Endpoints: []string{e.Endpoint}, Prefix: prefix, DialTimeout: time.Second}
		c.APIKeysShareInterval = 100 * time.Millisecond
	})
	require.NoError(t, err)
	assert.Subset(t, applied, []string{fmt.Sprintf("discovery.etcd on: endpoints [%s], prefix %s", e.Endpoint, prefix), "api_keys_share_interval=100ms"})
	require.Eventually(t, func() bool { return f.r.Registry.Snapshot().Has(7) }, 5*time.Second, 10*time.Millisecond, "the worker on etcd joins")
	status, worker := served("x-worker-id", "7")
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, "7", worker)
	assert.Equal(t, "1", metric(t, f, "fastroute_discovery_up"))
	require.Eventually(t, func() bool { return keysOn(t, e, discovery.UsageKey(prefix)) == 1 }, 5*time.Second, 10*time.Millisecond, "the keys' use shared")
	require.NoError(t, f.r.Discovery().MarkDown(1, true))
	require.Eventually(t, func() bool { w, _ := f.r.Registry.Get(1); return w.Down() }, 5*time.Second, 10*time.Millisecond, "etcd's down mark holds worker 1")

	applied, err = f.reloaded(func(c *config.Config) { c.Discovery.Etcd, c.APIKeysShareInterval = config.Etcd{}, 0 })
	require.NoError(t, err)
	assert.Subset(t, applied, []string{"discovery.etcd off (its workers drained)", "api_keys_share_interval=0s"})
	assert.Nil(t, f.r.Discovery())
	w1, _ := f.r.Registry.Get(1)
	assert.False(t, w1.Down(), "the mark of an etcd no longer watched holds nothing")
	require.Eventually(t, func() bool { _, ok := f.r.Registry.Get(7); return !ok }, 5*time.Second, 10*time.Millisecond, "the worker found on etcd drained and gone")
	status, worker = served()
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, "1", worker)
	assert.Empty(t, metric(t, f, "fastroute_discovery_up"))
	require.Eventually(t, func() bool { return keysOn(t, e, discovery.UsageKey(prefix)) == 0 }, 5*time.Second, 10*time.Millisecond, "the share's key deleted")
	assert.Empty(t, f.r.CurrentConfig().Discovery.Etcd.Endpoints)
	f.assertIdle()
}
