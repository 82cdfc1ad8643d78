package apikeys

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The other replicas' usage, summed by name, counts in a client's
// admissions beside its own: their tokens toward tokens_per_minute
// (Retry-After taking them to stay), their requests in flight toward
// max_inflight; a later report replaces it, a client no replica names
// counts nothing there, and a name no client has is ignored.
func TestTheOtherReplicasUsageCountsInAdmissions(t *testing.T) {
	var k Keys
	k.Set([]Entry{{Name: "batch", Key: keyB, TokensPerMinute: 100, MaxInflight: 3}, {Name: "team-a", Key: keyA}})
	c := k.Lookup([]byte(keyB))
	t0 := epoch.Add(10 * time.Second)
	c.AddTokens(t0, 20, 10)
	require.Equal(t, Admitted, c.Admit(t0))
	assert.Equal(t, []Usage{{Name: "batch", Tokens: 30, Inflight: 1}, {Name: "team-a"}}, k.Usage(t0))

	k.SetPeerUsage([]Usage{{Name: "batch", Tokens: 40, Inflight: 1}, {Name: "batch", Tokens: 25, Inflight: 1}, {Name: "gone", Tokens: 1000}})
	assert.Equal(t, uint64(65), c.PeerTokens())
	assert.Equal(t, int64(2), c.PeerInflight())
	assert.Equal(t, OverInflight, c.Admit(t0), "1 here and 2 elsewhere: 3, the cap")
	c.Release()
	assert.Equal(t, Admitted, c.Admit(t0), "2 elsewhere, 0 here")
	c.Release()
	c.AddTokens(t0.Add(5*time.Second), 5, 0)
	assert.Equal(t, OverTokens, c.Admit(t0.Add(5*time.Second)), "35 here and 65 elsewhere: 100, the cap")
	assert.Equal(t, 55*time.Second, c.RetryAfter(t0.Add(5*time.Second), OverTokens),
		"below 100 when this replica's first 30 leave the minute, the others' 65 taken to stay")
	assert.Equal(t, Admitted, c.Admit(t0.Add(60*time.Second)), "this replica's 30 left: 5 here, 65 elsewhere")
	c.Release()

	k.SetPeerUsage([]Usage{{Name: "batch", Tokens: 100}})
	assert.Equal(t, 60*time.Second, c.RetryAfter(t0.Add(61*time.Second), OverTokens), "the others' tokens alone reach the cap")
	k.SetPeerUsage(nil)
	assert.Zero(t, c.PeerTokens(), "no report names it: nothing elsewhere")
	assert.Zero(t, c.PeerInflight())
	assert.Equal(t, Admitted, c.Admit(t0.Add(61*time.Second)))
	c.Release()
	assert.Zero(t, k.Lookup([]byte(keyA)).PeerTokens())
}
