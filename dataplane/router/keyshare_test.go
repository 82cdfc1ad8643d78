package router

import (
	"net/http"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/discovery/etcdtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// keyUse is what a test reads of an API key's use on a replica.
type keyUse interface {
	RecentTokens(time.Time) uint64
	PeerTokens() uint64
	PeerInflight() int64
}

// keyClient returns the key named name on f's router.
func keyClient(t *testing.T, f *fleet, name string) keyUse {
	t.Helper()
	for _, c := range f.r.APIKeys.Clients() {
		if c.Name() == name {
			return c
		}
	}
	t.Fatalf("no client %s", name)
	return nil
}

// fastBody is a chat request for the model "fast".
const fastBody = `{"model":"fast","messages":[{"role":"user","content":"hi"}]}`

// useTeamAsMinute has team-a's answers through f use its minute's 60
// tokens: f refuses it before 20 requests.
func useTeamAsMinute(t *testing.T, f *fleet) {
	t.Helper()
	sent := 0
	for ; sent < 20; sent++ {
		resp, text := f.send("POST", "/v1/chat/completions", fastBody, "Authorization", "Bearer "+teamAKey)
		if resp.StatusCode == http.StatusTooManyRequests {
			break
		}
		require.Equal(t, http.StatusOK, resp.StatusCode, text)
	}
	require.Less(t, sent, 20, "the router caps team-a")
}

// With api_keys_share_interval, replicas on one etcd share each key's
// use, so that its caps hold across them: the tokens a key's answers used
// through one replica count toward its tokens_per_minute on the other,
// and its requests in flight on one toward its max_inflight on the
// other, until they end.
func TestAKeysCapsHoldAcrossReplicas(t *testing.T) {
	e := etcdtest.Start(t)
	const prefix = "/keys"
	fast, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: 1, Tokens: 3, Model: "fast"})
	require.NoError(t, err)
	t.Cleanup(func() { fast.Close() })
	slow, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: 2, Tokens: 60, TokenInterval: 50 * time.Millisecond, Model: "slow"})
	require.NoError(t, err)
	t.Cleanup(func() { slow.Close() })
	keys := keysFile(t, "team-a "+teamAKey+" tokens_per_minute=60", "batch "+batchKey+" max_inflight=2")
	replica := func() *fleet {
		return clusterRouter(t, e, prefix, func(c *config.Config) {
			c.APIKeysFile, c.APIKeysShareInterval = keys, 100*time.Millisecond
		})
	}
	a, b := replica(), replica()
	register(t, e, prefix, fast, 1, 5*time.Second)
	register(t, e, prefix, slow, 2, 5*time.Second)
	for _, f := range []*fleet{a, b} {
		require.Eventually(t, func() bool {
			snap := f.r.Registry.Snapshot()
			return snap.ModelGroup([]byte("fast")) != nil && snap.ModelGroup([]byte("slow")) != nil
		}, 5*time.Second, 10*time.Millisecond, "both replicas learn both workers' models")
	}
	client := func(f *fleet, name string) keyUse { return keyClient(t, f, name) }

	useTeamAsMinute(t, a) // through a
	require.Eventually(t, func() bool { return client(b, "team-a").PeerTokens() >= 60 }, 5*time.Second, 10*time.Millisecond,
		"b learns what team-a used through a")
	resp, text := b.send("POST", "/v1/chat/completions", fastBody, "Authorization", "Bearer "+teamAKey)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "b refuses team-a, which used nothing through b: %s", text)
	assert.Contains(t, text, "tokens_per_minute")
	assert.Zero(t, client(b, "team-a").RecentTokens(time.Now()))
	assert.NotEqual(t, "0", metric(t, b, `fastroute_api_key_peer_recent_tokens{api_key="team-a"}`))
	resp, text = b.send("POST", "/v1/chat/completions", fastBody, "Authorization", "Bearer "+batchKey)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "another key goes on: %s", text)

	// batch's two streams through a hold its two slots on b too.
	var streams []*http.Response
	for range 2 {
		resp := a.post("/v1/chat/completions", `{"model":"slow","stream":true,"messages":[]}`, "Authorization", "Bearer "+batchKey)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		streams = append(streams, resp)
	}
	require.Eventually(t, func() bool { return client(b, "batch").PeerInflight() == 2 }, 5*time.Second, 10*time.Millisecond)
	resp, text = b.send("POST", "/v1/chat/completions", fastBody, "Authorization", "Bearer "+batchKey)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "two in flight through a: %s", text)
	assert.Contains(t, text, "max_inflight")
	for _, s := range streams {
		require.NoError(t, s.Body.Close())
	}
	require.Eventually(t, func() bool { return client(b, "batch").PeerInflight() == 0 }, 5*time.Second, 10*time.Millisecond,
		"the streams' slots come back on b once they end on a")
	resp, text = b.send("POST", "/v1/chat/completions", fastBody, "Authorization", "Bearer "+batchKey)
	assert.Equal(t, http.StatusOK, resp.StatusCode, text)
	a.assertIdle()
	b.assertIdle()
	assert.Equal(t, "0", metric(t, a, `fastroute_api_key_peer_inflight{api_key="batch"}`), "b's own request ended too")
}

// A reload starts, stops and restarts the share of the keys' use: a
// replica that did not share learns the other's use once a reload turns
// its share on, and forgets it once the other's reload turns that one's
// off (its key deleted from etcd), each key's caps counting again what the
// replica serves.
func TestAReloadTurnsTheKeysShareOnAndOff(t *testing.T) {
	e := etcdtest.Start(t)
	const prefix = "/keys-reload"
	fast, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: 1, Tokens: 3, Model: "fast"})
	require.NoError(t, err)
	t.Cleanup(func() { fast.Close() })
	keys := keysFile(t, "team-a "+teamAKey+" tokens_per_minute=60", "batch "+batchKey)
	replica := func(iv time.Duration) *fleet {
		return clusterRouter(t, e, prefix, func(c *config.Config) {
			c.APIKeysFile, c.APIKeysShareInterval = keys, iv
		})
	}
	a, b := replica(100*time.Millisecond), replica(0)
	register(t, e, prefix, fast, 1, 5*time.Second)
	for _, f := range []*fleet{a, b} {
		require.Eventually(t, func() bool {
			w, ok := f.r.Registry.Get(1)
			return ok && len(w.Advertised().Models) > 0
		}, 5*time.Second, 10*time.Millisecond, "the worker's models learned")
	}
	useTeamAsMinute(t, a)
	time.Sleep(300 * time.Millisecond) // three of a's shares
	assert.Zero(t, keyClient(t, b, "team-a").PeerTokens(), "b does not share")

	cfg := b.r.CurrentConfig()
	cfg.APIKeysShareInterval = 200 * time.Millisecond
	applied, needRestart, err := b.r.Reload(cfg)
	require.NoError(t, err)
	assert.Contains(t, applied, "api_keys_share_interval=200ms")
	assert.Empty(t, needRestart)
	require.Eventually(t, func() bool { return keyClient(t, b, "team-a").PeerTokens() >= 60 }, 5*time.Second, 10*time.Millisecond,
		"b learns what team-a used through a")
	resp, text := b.send("POST", "/v1/chat/completions", fastBody, "Authorization", "Bearer "+teamAKey)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, text)
	resp, text = b.send("POST", "/v1/chat/completions", fastBody, "Authorization", "Bearer "+batchKey)
	require.Equal(t, http.StatusOK, resp.StatusCode, text)
	require.Eventually(t, func() bool { return keyClient(t, a, "batch").PeerTokens() > 0 }, 5*time.Second, 10*time.Millisecond,
		"a learns what batch used through b")

	cfg = a.r.CurrentConfig()
	cfg.APIKeysShareInterval = 0
	applied, _, err = a.r.Reload(cfg)
	require.NoError(t, err)
	assert.Contains(t, applied, "api_keys_share_interval=0s")
	require.Eventually(t, func() bool { return keyClient(t, b, "team-a").PeerTokens() == 0 }, 5*time.Second, 10*time.Millisecond,
		"a's key left etcd: b no longer counts its use")
	assert.Zero(t, keyClient(t, a, "batch").PeerTokens(), "and a forgot b's")
	resp, text = b.send("POST", "/v1/chat/completions", fastBody, "Authorization", "Bearer "+teamAKey)
	assert.Equal(t, http.StatusOK, resp.StatusCode, text)
	a.assertIdle()
	b.assertIdle()
}
