package apikeys

import (
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	keyA = "sk-team-a-0123456789abcdef"
	keyB = "sk-batch-0123456789abcdef"
)

func TestParseReadsNamesKeysAndCaps(t *testing.T) {
	entries, err := Parse([]byte("# clients\n\nteam-a " + keyA + " priority=-1\n\tbatch\t" + keyB + "  max_inflight=2 priority=10 tokens_per_minute=90000\n" +
		"ops sk-ops-0123456789abcdef priority=0 models=meta-llama/Llama-3.1-8B;sql-lora expires=2027-01-31\n" +
		"temp sk-temp-0123456789abcdef expires=2026-12-24T18:00:00+01:00\n"))
	require.NoError(t, err)
	assert.Equal(t, []Entry{
		{Name: "team-a", Key: keyA, Priority: -1, HasPriority: true},
		{Name: "batch", Key: keyB, MaxInflight: 2, TokensPerMinute: 90000, Priority: 10, HasPriority: true},
		{Name: "ops", Key: "sk-ops-0123456789abcdef", HasPriority: true, Models: []string{"meta-llama/Llama-3.1-8B", "sql-lora"},
			Expires: time.Date(2027, 1, 31, 0, 0, 0, 0, time.UTC)},
		{Name: "temp", Key: "sk-temp-0123456789abcdef", Expires: time.Date(2026, 12, 24, 17, 0, 0, 0, time.UTC)},
	}, entries)
}

func TestParseRefusesBadLinesWithoutQuotingAKey(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"", "no key in it"},
		{"# only a comment\n", "no key in it"},
		{"team-a\n", "line 1: want NAME KEY [max_inflight=N] [tokens_per_minute=N] [requests_per_minute=N] [priority=P] [models=a;b] [expires=T], got 1 fields"},
		{"a " + keyA + " max_inflight=1 priority=2 tokens_per_minute=3 requests_per_minute=4 models=m expires=2027-01-01 extra\n", "line 1: want NAME KEY [max_inflight=N] [tokens_per_minute=N] [requests_per_minute=N] [priority=P] [models=a;b] [expires=T], got 9 fields"},
		{"a " + keyA + " requests_per_minute=-1\n", `line 1: field 3 is none of`},
		{"a " + keyA + " expires=tomorrow\n", "line 1: field 3: expires= wants a date (2027-01-31, midnight UTC) or an RFC 3339 time"},
		{"a " + keyA + " expires=2027-02-30\n", "line 1: field 3: expires= wants a date"},
		{"a " + keyA + " models=llama;;qwen\n", `line 1: models= names an empty model`},
		{"a " + keyA + " models=\n", `line 1: models= names an empty model`},
		{"a " + keyA + " models=qwen;llama;qwen\n", `line 1: models= names "qwen" twice`},
		{"a " + keyA + " models=a models=b\n", `line 1: models is given twice`},
		{"team-a sk-old-0123456789abcd " + keyA + "\n", `line 1: field 3 is none of`},
		{keyA + " sk-short\n", `line 1: the key (field 2) is shorter`},
		{"a " + keyA + " tokens_per_minute=-5\n", `line 1: field 3 is none of`},
		{"a " + keyA + " max_inflight=1 extra\n", `line 1: field 4 is none of max_inflight=N`},
		{"a " + keyA + " priority=1 priority=2\n", `line 1: priority is given twice`},
		{"a " + keyA + " priority=high\n", `line 1: field 3 is none of`},
		{"team/a " + keyA + "\n", `line 1: the name (field 1) is not 1 to 64 letters`},
		{strings.Repeat("n", 65) + " " + keyA + "\n", "is not 1 to 64 letters"},
		{"\nteam-a sk-short\n", `line 2: the key (field 2) is shorter than 16 characters`},
		{"team-a " + keyA + "\u00e9\n", `line 1: the key (field 2) holds a character that is not printable ASCII`},
		{"team-a " + keyA + " max_inflight=-1\n", `line 1: field 3 is none of max_inflight=N`},
		{"team-a " + keyA + " inflight=3\n", `line 1: field 3 is none of max_inflight=N`},
		{"team-a " + keyA + "\nteam-a " + keyB + "\n", `line 2: its name is line 1's too`},
		{"team-a " + keyA + "\n#\nbatch " + keyA + "\n", `line 3: its key is line 1's too`},
	} {
		_, err := Parse([]byte(tc.file))
		require.Error(t, err, tc.file)
		assert.Contains(t, err.Error(), tc.want)
		assert.NotContains(t, err.Error(), keyA)
		assert.NotContains(t, err.Error(), "sk-short")
	}
}

// An entry may name a client certificate instead of a key ("cert:NAME",
// %20 for a space): found by LookupCert, never by a key that spells it.
func TestAnEntryMayNameAClientCertificate(t *testing.T) {
	entries, err := Parse([]byte("summarizer cert:spiffe://example.org/ns/batch/sa/summarizer max_inflight=8\n" +
		"alice cert:Alice%20Smith\nteam-a " + keyA + "\n"))
	require.NoError(t, err)
	assert.Equal(t, []Entry{
		{Name: "summarizer", Cert: "spiffe://example.org/ns/batch/sa/summarizer", MaxInflight: 8},
		{Name: "alice", Cert: "Alice Smith"},
		{Name: "team-a", Key: keyA},
	}, entries)
	var k Keys
	k.Set(entries)
	assert.Equal(t, "summarizer", k.LookupCert([]byte("spiffe://example.org/ns/batch/sa/summarizer")).Name())
	assert.Equal(t, "alice", k.LookupCert([]byte("Alice Smith")).Name())
	assert.Nil(t, k.LookupCert([]byte("spiffe://example.org/ns/batch/sa/other")))
	assert.Nil(t, k.LookupCert(nil))
	assert.Nil(t, k.LookupCert([]byte(keyA)), "a key is no certificate")
	assert.Nil(t, k.Lookup([]byte("cert:Alice Smith")), "nor is a certificate's name a key")
	assert.Nil(t, k.Lookup([]byte("")))
	assert.Equal(t, uint64(2), k.Refused(), "LookupCert counts nothing")

	for _, tc := range []struct{ file, want string }{
		{"a cert:\n", "line 1: the key (field 2) is cert: without a certificate's name"},
		{"a cert:%zz\n", "line 1: the key (field 2) is cert: without a certificate's name"},
		{"a cert:alice\nb cert:alice\n", "line 2: its certificate is line 1's too"},
		{"a cert:al\u00e9\n", "line 1: the key (field 2) holds a character that is not printable ASCII"},
	} {
		_, err := Parse([]byte(tc.file))
		assert.ErrorContains(t, err, tc.want, tc.file)
	}
	_, err = Parse([]byte("a cert:alice\nb " + keyA + "\nc " + keyB + "\n"))
	assert.NoError(t, err, "certificate entries and keys side by side")
}

func TestKeysFindTheirClients(t *testing.T) {
	var k Keys
	assert.False(t, k.On())
	assert.Nil(t, k.Clients())
	k.Set([]Entry{{Name: "team-a", Key: keyA}, {Name: "batch", Key: keyB, MaxInflight: 2}})
	require.True(t, k.On())
	assert.Equal(t, "team-a", k.Lookup([]byte(keyA)).Name())
	assert.Equal(t, "batch", k.Lookup([]byte(keyB)).Name())
	assert.Nil(t, k.Lookup([]byte(keyA[:len(keyA)-1])))
	assert.Nil(t, k.Lookup(nil))
	assert.Equal(t, uint64(2), k.Refused())
	names := []string{}
	for _, c := range k.Clients() {
		names = append(names, c.Name())
	}
	assert.Equal(t, []string{"batch", "team-a"}, names)
	k.Set(nil)
	assert.False(t, k.On())
	assert.Nil(t, k.Lookup([]byte(keyA)))
}

func TestAClientsCapRefusesAndItsSlotsComeBack(t *testing.T) {
	var k Keys
	k.Set([]Entry{{Name: "batch", Key: keyB, MaxInflight: 2}})
	c := k.Lookup([]byte(keyB))
	require.True(t, c.Admit(time.Now()) == Admitted)
	require.True(t, c.Admit(time.Now()) == Admitted)
	assert.False(t, c.Admit(time.Now()) == Admitted)
	assert.Equal(t, int64(2), c.Inflight())
	c.Release()
	assert.True(t, c.Admit(time.Now()) == Admitted)
	c.Release()
	c.Release()
	assert.Equal(t, int64(0), c.Inflight())
	assert.Equal(t, uint64(3), c.Admitted())
	assert.Equal(t, uint64(1), c.Limited(OverInflight))
}

// A reload that keeps a name keeps its client: the requests it has in
// flight count against the new cap and release into it; a new key for the
// name replaces the old one.
func TestASetKeepsTheClientsOfNamesThatStay(t *testing.T) {
	var k Keys
	k.Set([]Entry{{Name: "team-a", Key: keyA}, {Name: "batch", Key: keyB, MaxInflight: 3}})
	batch := k.Lookup([]byte(keyB))
	require.True(t, batch.Admit(time.Now()) == Admitted)
	require.True(t, batch.Admit(time.Now()) == Admitted)
	rotated := "sk-batch-rotated-0123456789"
	k.Set([]Entry{{Name: "batch", Key: rotated, MaxInflight: 2}})
	assert.Nil(t, k.Lookup([]byte(keyB)), "the old key is gone")
	assert.Nil(t, k.Lookup([]byte(keyA)), "so is the client left out")
	same := k.Lookup([]byte(rotated))
	require.Same(t, batch, same)
	assert.False(t, same.Admit(time.Now()) == Admitted, "two in flight already, and the cap is now 2")
	same.Release()
	same.Release()
	assert.Equal(t, int64(0), same.Inflight())
	assert.Equal(t, int64(2), same.MaxInflight())

	k.Set([]Entry{{Name: "batch", Key: rotated, Priority: 5, HasPriority: true}})
	p, ok := same.Priority()
	assert.True(t, ok)
	assert.Equal(t, int64(5), p)
	k.Set([]Entry{{Name: "batch", Key: rotated}})
	_, ok = same.Priority()
	assert.False(t, ok, "no priority=: the requests' own")
}

func TestTheKeyComesFromBearerOrXAPIKey(t *testing.T) {
	for _, tc := range []struct{ auth, xkey, want string }{
		{"Bearer " + keyA, "", keyA},
		{"bearer  " + keyA, "", keyA},
		{"BEARER " + keyA, keyB, keyA},
		{"", keyB, keyB},
		{"Basic dXNlcjpwYXNz", keyB, keyB},
		{"Basic dXNlcjpwYXNz", "", ""},
		{"Bearer", "", ""},
		{"", "", ""},
	} {
		assert.Equal(t, tc.want, string(FromHeaders([]byte(tc.auth), []byte(tc.xkey))), tc)
	}
}

func TestACheckAllocatesNothing(t *testing.T) {
	var k Keys
	k.Set([]Entry{{Name: "batch", Key: keyB, MaxInflight: 2}})
	auth := []byte("Bearer " + keyB)
	allocs := testing.AllocsPerRun(1000, func() {
		c := k.Lookup(FromHeaders(auth, nil))
		if c.Admit(time.Now()) == Admitted {
			c.Release()
		}
	})
	assert.Zero(t, allocs)
}

func TestAdmissionsAndReloadsRace(t *testing.T) {
	var k Keys
	entries := []Entry{{Name: "batch", Key: keyB, MaxInflight: 4}}
	k.Set(entries)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 2000 {
				if c := k.Lookup([]byte(keyB)); c != nil && c.Admit(time.Now()) == Admitted {
					c.Release()
				}
			}
		})
	}
	wg.Go(func() {
		for i := range 200 {
			entries[0].MaxInflight = 1 + i%4
			k.Set(entries)
		}
	})
	wg.Wait()
	c := k.Lookup([]byte(keyB))
	assert.Equal(t, int64(0), c.Inflight())
	assert.Equal(t, uint64(16000), c.Admitted()+c.Limited(OverInflight))
}

// BenchmarkCheck is what a request with a key costs the front end beyond
// one without: the key's lookup by digest, its admission and release.
func BenchmarkCheck(b *testing.B) {
	var k Keys
	entries := make([]Entry, 1000)
	for i := range entries {
		entries[i] = Entry{Name: "client-" + strconv.Itoa(i), Key: "sk-client-key-" + strconv.Itoa(1e6+i), MaxInflight: 64}
	}
	k.Set(entries)
	auth := []byte("Bearer sk-client-key-1000500")
	b.ReportAllocs()
	for b.Loop() {
		c := k.Lookup(FromHeaders(auth, nil))
		if c.Admit(time.Now()) == Admitted {
			c.Release()
		}
	}
}

// tokens_per_minute refuses a key once its answers reported that many
// tokens over the last minute, and admits it again as they leave the
// minute; a request refused takes no slot.
func TestAKeysTokensPerMinute(t *testing.T) {
	var k Keys
	k.Set([]Entry{{Name: "batch", Key: keyB, TokensPerMinute: 100}})
	c := k.Lookup([]byte(keyB))
	t0 := epoch.Add(10 * time.Second)
	require.Equal(t, Admitted, c.Admit(t0))
	c.AddTokens(t0, 30, 30)
	c.Release()
	require.Equal(t, Admitted, c.Admit(t0.Add(20*time.Second)))
	c.AddTokens(t0.Add(20*time.Second), 10, 30)
	c.Release()
	assert.Equal(t, uint64(100), c.RecentTokens(t0.Add(20*time.Second)))
	assert.Equal(t, OverTokens, c.Admit(t0.Add(25*time.Second)))
	assert.Equal(t, int64(0), c.Inflight(), "a refused request holds no slot")
	assert.Equal(t, 35*time.Second, c.RetryAfter(t0.Add(25*time.Second), OverTokens), "the first 60 leave the minute at t0+60s")
	assert.Equal(t, OverTokens, c.Admit(t0.Add(59*time.Second)))
	assert.Equal(t, Admitted, c.Admit(t0.Add(60*time.Second)), "40 left in the minute")
	c.Release()
	assert.Equal(t, uint64(40), c.RecentTokens(t0.Add(60*time.Second)))
	assert.Zero(t, c.RecentTokens(t0.Add(80*time.Second)))
	assert.Equal(t, uint64(2), c.Limited(OverTokens))
	p, out := c.Tokens()
	assert.Equal(t, uint64(40), p)
	assert.Equal(t, uint64(60), out)

	k.Set([]Entry{{Name: "batch", Key: keyB}})
	c.AddTokens(t0.Add(90*time.Second), 500, 500)
	assert.Equal(t, Admitted, c.Admit(t0.Add(90*time.Second)), "no cap after the reload")
	c.Release()
}

// A bucket that a later second took keeps its count: a charge older than
// the window is dropped, not added to the later second's.
func TestAWindowsBucketsTurnOver(t *testing.T) {
	var w window
	w.add(5, 7)
	w.add(5, 3)
	assert.Equal(t, uint64(10), w.sum(5))
	w.add(65, 2) // the same bucket, a minute later
	assert.Equal(t, uint64(2), w.sum(65))
	w.add(5, 100) // late: the bucket counts second 65 now
	assert.Equal(t, uint64(2), w.sum(65))
	w.add(66, 1<<40)
	assert.Equal(t, uint64(1<<32-1+2), w.sum(66), "saturated, not wrapped")
	assert.Zero(t, w.sum(200))
}

func TestTokenChargesAndAdmissionsRace(t *testing.T) {
	var k Keys
	k.Set([]Entry{{Name: "batch", Key: keyB, TokensPerMinute: 1 << 40}})
	c := k.Lookup([]byte(keyB))
	now := time.Now()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				if c.Admit(now) == Admitted {
					c.AddTokens(now, 2, 1)
					c.Release()
				}
			}
		})
	}
	wg.Wait()
	assert.Equal(t, uint64(24000), c.RecentTokens(now), "no charge lost")
	assert.Equal(t, int64(0), c.Inflight())
}

func TestAKeyLimitedToModelsAllowsOnlyThem(t *testing.T) {
	var k Keys
	k.Set([]Entry{{Name: "ops", Key: keyA, Models: []string{"qwen", "sql-lora"}}, {Name: "batch", Key: keyB}})
	ops, batch := k.Lookup([]byte(keyA)), k.Lookup([]byte(keyB))
	assert.True(t, ops.Allows([]byte("qwen")))
	assert.True(t, ops.Allows([]byte("sql-lora")))
	assert.False(t, ops.Allows([]byte("llama")))
	assert.False(t, ops.Allows(nil))
	assert.True(t, batch.Allows([]byte("llama")))
	assert.Nil(t, batch.Models())
	model := []byte("qwen")
	assert.Zero(t, testing.AllocsPerRun(100, func() { ops.Allows(model) }))
	k.Set([]Entry{{Name: "ops", Key: keyA}})
	assert.True(t, ops.Allows([]byte("llama")), "a reload without models= opens them all")
}

func TestAKeyExpires(t *testing.T) {
	var k Keys
	at := time.Date(2026, 12, 24, 17, 0, 0, 0, time.UTC)
	k.Set([]Entry{{Name: "temp", Key: keyA, Expires: at}, {Name: "ops", Key: keyB}})
	temp, ops := k.Lookup([]byte(keyA)), k.Lookup([]byte(keyB))
	assert.Equal(t, at, temp.Expires().UTC())
	assert.False(t, temp.Expired(func() time.Time { return at.Add(-time.Nanosecond) }))
	assert.True(t, temp.Expired(func() time.Time { return at }))
	assert.Equal(t, uint64(1), temp.Limited(Expired))
	assert.True(t, ops.Expires().IsZero())
	assert.False(t, ops.Expired(func() time.Time { t.Fatal("a key that does not expire reads no clock"); return time.Time{} }))
	k.Set([]Entry{{Name: "temp", Key: keyA}})
	assert.False(t, temp.Expired(time.Now), "a reload without expires= lifts it")
}

// A key's requests_per_minute refuses its requests once that many were
// admitted over the last minute (the other replicas' shared ones
// counted), until the oldest leave it; refused ones count nothing.
func TestAKeysRequestsPerMinute(t *testing.T) {
	entries, err := Parse([]byte("batch " + keyB + " requests_per_minute=3\n"))
	require.NoError(t, err)
	require.Equal(t, int64(3), entries[0].RequestsPerMinute)
	var k Keys
	k.Set(entries)
	c := k.Lookup([]byte(keyB))
	t0 := epoch.Add(10 * time.Second)
	for _, at := range []time.Duration{0, 10 * time.Second, 20 * time.Second} {
		require.Equal(t, Admitted, c.Admit(t0.Add(at)))
		c.Release()
	}
	assert.Equal(t, uint64(3), c.RecentRequests(t0.Add(20*time.Second)))
	assert.Equal(t, OverRequests, c.Admit(t0.Add(30*time.Second)))
	assert.Equal(t, uint64(3), c.RecentRequests(t0.Add(30*time.Second)), "a refused request counts nothing")
	assert.Equal(t, 30*time.Second, c.RetryAfter(t0.Add(30*time.Second), OverRequests), "the first leaves the minute at t0+60s")
	assert.Equal(t, Admitted, c.Admit(t0.Add(60*time.Second)))
	c.Release()
	assert.Equal(t, uint64(1), c.Limited(OverRequests))

	k.SetPeerUsage([]Usage{{Name: "batch", Requests: 1}})
	assert.Equal(t, OverRequests, c.Admit(t0.Add(61*time.Second)), "2 here and 1 elsewhere: 3, the cap")
	assert.Equal(t, []Usage{{Name: "batch", Requests: 3}}, k.Usage(t0.Add(60*time.Second)))
	k.SetPeerUsage([]Usage{{Name: "batch", Requests: 3}})
	assert.Equal(t, 60*time.Second, c.RetryAfter(t0.Add(61*time.Second), OverRequests), "the others alone reach the cap")
}
