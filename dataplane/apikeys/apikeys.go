// Package apikeys holds the API keys clients present to the front end
// (api_keys_file): each has a name, which the metrics and the access log
// show in its place, and may cap the requests it has in flight at once
// and the tokens its answers report over a minute, order its requests in
// the wait queue, name the only models it may use and expire. A key is
// checked against SHA-256 digests, so the set keeps no key and a check
// takes the same time however much of a wrong key is right. An entry may
// name a client certificate instead of a key (mutual TLS): a request
// without a key, from a client that showed that certificate, is its.
// Checks, admissions and releases lock and allocate nothing; a reload
// swaps the set whole.
package apikeys

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Entry is one line of a keys file.
type Entry struct {
	Name string
	Key  string
	// Cert, set in place of Key, names the client certificate whose
	// requests are the entry's ("cert:NAME" in the file): its subject's
	// common name, else its first URI name (a SPIFFE ID), else its first
	// DNS name, as the access log names it.
	Cert string
	// MaxInflight caps the key's requests in flight at once (0: no cap).
	MaxInflight int
	// TokensPerMinute caps the tokens the key's answers may report over a
	// minute (0: no cap): once they reach it, its requests are refused
	// until older ones leave the minute.
	TokensPerMinute int64
	// RequestsPerMinute caps the key's requests admitted over a minute (0:
	// no cap).
	RequestsPerMinute int64
	// Priority, when HasPriority, orders the key's requests in the
	// router's wait queue in place of their bodies' priority field (lower
	// is sooner).
	Priority    int64
	HasPriority bool
	// Models, when set, are the only models the key's requests may name
	// (base models or adapters, as the body's model field names them).
	Models []string
	// Expires, when not zero, is when the key stops opening the router.
	Expires time.Time
}

// MinKeyBytes is the shortest key a keys file may give: one a client could
// guess in a few million tries is no key.
const MinKeyBytes = 16

// maxNameBytes bounds a name, which labels metrics.
const maxNameBytes = 64

// Parse reads a keys file: one key a line, "NAME KEY" and optionally
// "max_inflight=N", "tokens_per_minute=N", "requests_per_minute=N",
// "priority=P", "models=a;b" and "expires=T", separated by spaces or
// tabs; blank lines and lines starting with # are skipped. A name is 1 to
// 64 letters, digits, '.', '_' or '-'; a key at least MinKeyBytes of
// printable ASCII without spaces, or "cert:" and a client certificate's
// name (Entry.Cert), printable ASCII with %20 for a space (and %25 for a
// %). Errors give the line and the field, and
// quote nothing but a model name: a key written in the wrong place is
// never shown.
func Parse(data []byte) ([]Entry, error) {
	var entries []Entry
	names := map[string]int{}
	digests := map[[sha256.Size]byte]int{}
	certs := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		e, err := parseLine(strings.Fields(line))
		if err != nil {
			return nil, fmt.Errorf("line %d: %v", n, err)
		}
		if first, ok := names[e.Name]; ok {
			return nil, fmt.Errorf("line %d: its name is line %d's too", n, first)
		}
		if e.Cert != "" {
			if first, ok := certs[e.Cert]; ok {
				return nil, fmt.Errorf("line %d: its certificate is line %d's too", n, first)
			}
			certs[e.Cert] = n
		} else {
			d := sha256.Sum256([]byte(e.Key))
			if first, ok := digests[d]; ok {
				return nil, fmt.Errorf("line %d: its key is line %d's too", n, first)
			}
			digests[d] = n
		}
		names[e.Name] = n
		entries = append(entries, e)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(entries) == 0 {
		return nil, fmt.Errorf("no key in it")
	}
	return entries, nil
}

func parseLine(fields []string) (Entry, error) {
	if len(fields) < 2 || len(fields) > 8 {
		return Entry{}, fmt.Errorf("want NAME KEY [max_inflight=N] [tokens_per_minute=N] [requests_per_minute=N] [priority=P] [models=a;b] [expires=T], got %d fields", len(fields))
	}
	e := Entry{Name: fields[0], Key: fields[1]}
	if !validName(e.Name) {
		return Entry{}, fmt.Errorf("the name (field 1) is not 1 to %d letters, digits, '.', '_' or '-'", maxNameBytes)
	}
	if cert, ok := strings.CutPrefix(e.Key, certPrefix); ok {
		name, err := url.PathUnescape(cert)
		if err != nil || name == "" {
			return Entry{}, errors.New("the key (field 2) is cert: without a certificate's name (%20 for a space, %25 for a %)")
		}
		e.Key, e.Cert = "", name
	} else if len(e.Key) < MinKeyBytes {
		return Entry{}, fmt.Errorf("the key (field 2) is shorter than %d characters", MinKeyBytes)
	}
	for i := 0; i < len(fields[1]); i++ {
		if c := fields[1][i]; c <= ' ' || c > '~' {
			return Entry{}, errors.New("the key (field 2) holds a character that is not printable ASCII")
		}
	}
	seen := map[string]bool{}
	for i, f := range fields[2:] {
		name, v, _ := strings.Cut(f, "=")
		n, err := strconv.ParseInt(v, 10, 64)
		switch {
		case seen[name]:
			return Entry{}, fmt.Errorf("%s is given twice", name)
		case name == "max_inflight" && err == nil && n >= 0 && n <= math.MaxInt32:
			e.MaxInflight = int(n)
		case name == "models":
			if e.Models, err = parseModels(v); err != nil {
				return Entry{}, err
			}
		case name == "expires":
			if e.Expires, err = parseExpiry(v); err != nil {
				return Entry{}, fmt.Errorf("field %d: expires= wants a date (2027-01-31, midnight UTC) or an RFC 3339 time", i+3)
			}
		case name == "tokens_per_minute" && err == nil && n >= 0:
			e.TokensPerMinute = n
		case name == "requests_per_minute" && err == nil && n >= 0:
			e.RequestsPerMinute = n
		case name == "priority" && err == nil:
			e.Priority, e.HasPriority = n, true
		default:
			return Entry{}, fmt.Errorf("field %d is none of max_inflight=N, tokens_per_minute=N, requests_per_minute=N (whole numbers of 0 or more), priority=P (a whole number), models=a;b and expires=T", i+3)
		}
		seen[name] = true
	}
	return e, nil
}

// certPrefix marks a keys file's KEY field that names a client certificate.
const certPrefix = "cert:"

// parseExpiry reads an expires= time, in UTC: a date (midnight UTC) or
// an RFC 3339 time.
func parseExpiry(v string) (time.Time, error) {
	if t, err := time.Parse(time.DateOnly, v); err == nil {
		return t, nil
	}
	t, err := time.Parse(time.RFC3339, v)
	return t.UTC(), err
}

// parseModels reads a models= list: model names separated by ';'.
func parseModels(list string) ([]string, error) {
	models := strings.Split(list, ";")
	for i, m := range models {
		if m == "" {
			return nil, errors.New("models= names an empty model")
		}
		if slices.Contains(models[:i], m) {
			return nil, fmt.Errorf("models= names %q twice", m)
		}
	}
	return models, nil
}

func validName(name string) bool {
	if name == "" || len(name) > maxNameBytes {
		return false
	}
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// Client is the holder of one key, named in the keys file. It outlives a
// reload that keeps its name, so its counts go on.
type Client struct {
	name     string
	max      atomic.Int64             // MaxInflight; 0: no cap
	tpm      atomic.Int64             // TokensPerMinute; 0: no cap
	rpm      atomic.Int64             // RequestsPerMinute; 0: no cap
	priority atomic.Pointer[int64]    // Priority; nil: none
	models   atomic.Pointer[[]string] // Models; nil: any
	cert     atomic.Pointer[string]   // Cert; nil: a key
	expires  atomic.Int64             // Expires in Unix nanoseconds; 0: never
	inflight atomic.Int64
	admitted atomic.Uint64
	limited  [numRefusals]atomic.Uint64
	prompt   atomic.Uint64 // tokens its answers reported (AddTokens)
	output   atomic.Uint64
	recent   window // the tokens of the last minute, for tpm
	requests window // the requests admitted over the last minute, for rpm
	// The other replicas' tokens and requests over their last minute and
	// requests in flight, as they last reported them (Keys.SetPeerUsage):
	// added to this replica's own in Admit.
	peerTokens   atomic.Uint64
	peerRequests atomic.Uint64
	peerInflight atomic.Int64
}

// Refusal says why Admit refused a request; Admitted: it did not.
type Refusal uint8

const (
	Admitted     Refusal = iota
	OverInflight         // the client has MaxInflight requests in flight
	OverTokens           // its answers reported TokensPerMinute tokens or more over the last minute
	Expired              // its key expired (Expired)
	OverRequests         // it had RequestsPerMinute requests admitted over the last minute
	numRefusals
)

// Name is the client's name in the keys file.
func (c *Client) Name() string { return c.name }

// MaxInflight is the cap on the client's requests in flight (0: none).
func (c *Client) MaxInflight() int64 { return c.max.Load() }

// TokensPerMinute is the cap on the tokens the client's answers may report
// over a minute (0: none).
func (c *Client) TokensPerMinute() int64 { return c.tpm.Load() }

// RequestsPerMinute is the cap on the client's requests admitted over a
// minute (0: none).
func (c *Client) RequestsPerMinute() int64 { return c.rpm.Load() }

// Priority is the priority the client's requests wait with in the
// router's queue; false: theirs.
func (c *Client) Priority() (int64, bool) {
	if p := c.priority.Load(); p != nil {
		return *p, true
	}
	return 0, false
}

// Cert is the name of the client certificate whose requests are the
// client's ("" for a key's client).
func (c *Client) Cert() string {
	if p := c.cert.Load(); p != nil {
		return *p
	}
	return ""
}

// Expires is when the client's key stops opening the router; zero: never.
func (c *Client) Expires() time.Time {
	if ns := c.expires.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// Expired reports, and counts, that the client's key had expired at the
// time now returns; now is called only for a key that expires.
func (c *Client) Expired(now func() time.Time) bool {
	ns := c.expires.Load()
	if ns == 0 || now().UnixNano() < ns {
		return false
	}
	c.limited[Expired].Add(1)
	return true
}

// Models are the only models the client's requests may name; nil: any.
func (c *Client) Models() []string {
	if m := c.models.Load(); m != nil {
		return *m
	}
	return nil
}

// Allows reports whether the client's requests may name model.
func (c *Client) Allows(model []byte) bool {
	m := c.models.Load()
	if m == nil {
		return true
	}
	for _, name := range *m {
		if name == string(model) {
			return true
		}
	}
	return false
}

// Inflight is how many of the client's requests are admitted and not yet
// released.
func (c *Client) Inflight() int64 { return c.inflight.Load() }

// Admitted counts the client's requests let through.
func (c *Client) Admitted() uint64 { return c.admitted.Load() }

// Limited counts the client's requests refused for reason r.
func (c *Client) Limited(r Refusal) uint64 { return c.limited[r].Load() }

// AddTokens charges the client, at now, the prompt and completion tokens
// an answer to it reported.
func (c *Client) AddTokens(now time.Time, prompt, completion uint64) {
	c.prompt.Add(prompt)
	c.output.Add(completion)
	c.recent.add(second(now), prompt+completion)
}

// Tokens returns the prompt and completion tokens charged to the client.
func (c *Client) Tokens() (prompt, completion uint64) { return c.prompt.Load(), c.output.Load() }

// RecentTokens returns the tokens charged to the client over the minute
// up to now.
func (c *Client) RecentTokens(now time.Time) uint64 { return c.recent.sum(second(now)) }

// RecentRequests returns the client's requests admitted over the minute
// up to now.
func (c *Client) RecentRequests(now time.Time) uint64 { return c.requests.sum(second(now)) }

// Admit takes one of the client's slots at now, unless it has MaxInflight
// requests in flight already, its answers reported TokensPerMinute tokens
// over the minute before now, or it had RequestsPerMinute requests
// admitted over that minute (with the other replicas' requests and
// tokens, when they share them: SetPeerUsage): then nothing is taken, and
// the refusal says which. Admissions at once may all pass a
// requests_per_minute that has room for one: it is checked, then counted.
// An admitted request is released (Release) exactly once when it ends.
func (c *Client) Admit(now time.Time) Refusal {
	sec := second(now)
	if tpm := c.tpm.Load(); tpm > 0 && c.recent.sum(sec)+c.peerTokens.Load() >= uint64(tpm) {
		c.limited[OverTokens].Add(1)
		return OverTokens
	}
	rpm := c.rpm.Load()
	if rpm > 0 && c.requests.sum(sec)+c.peerRequests.Load() >= uint64(rpm) {
		c.limited[OverRequests].Add(1)
		return OverRequests
	}
	n := c.inflight.Add(1)
	if max := c.max.Load(); max > 0 && n+c.peerInflight.Load() > max {
		c.inflight.Add(-1)
		c.limited[OverInflight].Add(1)
		return OverInflight
	}
	if rpm > 0 {
		c.requests.add(sec, 1)
	}
	c.admitted.Add(1)
	return Admitted
}

// RetryAfter is how long from now until the client's tokens over the last
// minute fall below TokensPerMinute (r OverTokens) or its requests below
// RequestsPerMinute (OverRequests), to the second (at least one). The
// other replicas' are taken to stay: when they alone reach the cap, a
// whole minute.
func (c *Client) RetryAfter(now time.Time, r Refusal) time.Duration {
	w, limit, peers := &c.recent, uint64(c.tpm.Load()), c.peerTokens.Load()
	if r == OverRequests {
		w, limit, peers = &c.requests, uint64(c.rpm.Load()), c.peerRequests.Load()
	}
	if peers >= limit {
		return windowSeconds * time.Second
	}
	return time.Duration(w.secondsUntilBelow(second(now), limit-peers)) * time.Second
}

// Release gives back the slot Admit took.
func (c *Client) Release() { c.inflight.Add(-1) }

// epoch is where the windows' seconds count from.
var epoch = time.Now()

// second numbers the second of now from epoch, from 1 (0: an empty bucket).
func second(now time.Time) uint64 {
	d := now.Sub(epoch)
	if d < 0 {
		return 1
	}
	return uint64(d/time.Second) + 1
}

// windowSeconds is the length of a token window.
const windowSeconds = 60

// window counts tokens over the last windowSeconds seconds, a bucket a
// second. A bucket is one word, the second it counts above the tokens of
// that second (saturated at 2^32-1), so a charge and the bucket's reuse
// for a later second are one compare-and-swap: no lock, no lost count.
type window struct {
	buckets [windowSeconds]atomic.Uint64
}

const tokenBits = 32

// add charges n tokens at second sec.
func (w *window) add(sec, n uint64) {
	if n == 0 {
		return
	}
	b := &w.buckets[sec%windowSeconds]
	for {
		old := b.Load()
		next := sec<<tokenBits | min(n, 1<<tokenBits-1)
		if old>>tokenBits == sec {
			next = sec<<tokenBits | min(old&(1<<tokenBits-1)+n, 1<<tokenBits-1)
		} else if old>>tokenBits > sec {
			return // a later second took the bucket: this charge is older than the window
		}
		if b.CompareAndSwap(old, next) {
			return
		}
	}
}

// sum is the tokens of the window ending at second sec.
func (w *window) sum(sec uint64) uint64 {
	var total uint64
	for i := range w.buckets {
		v := w.buckets[i].Load()
		if s := v >> tokenBits; s <= sec && s+windowSeconds > sec {
			total += v & (1<<tokenBits - 1)
		}
	}
	return total
}

// secondsUntilBelow is how many seconds after sec the window's sum falls
// below limit as its buckets leave it (at least 1): one pass, a second
// later taking out the one bucket that leaves then, the one of its second
// a minute before.
func (w *window) secondsUntilBelow(sec, limit uint64) uint64 {
	total := w.sum(sec)
	for wait := uint64(1); wait < windowSeconds; wait++ {
		if v := w.buckets[(sec+wait)%windowSeconds].Load(); v>>tokenBits+windowSeconds == sec+wait {
			total -= v & (1<<tokenBits - 1)
		}
		if total < limit {
			return wait
		}
	}
	return windowSeconds
}

// set is one version of the keys: by digest, by certificate, and the
// clients by name.
type set struct {
	byDigest map[[sha256.Size]byte]*Client
	byCert   map[string]*Client
	clients  []*Client // sorted by name
}

// Keys is the running set of keys; the zero value has none, and checks
// nothing (On is false).
type Keys struct {
	cur     atomic.Pointer[set]
	refused atomic.Uint64
}

// Set makes entries the keys from now on; a client whose name stays keeps
// its counts (and the requests it has in flight), a new cap applying to
// its next admissions. No entries: no keys, nothing checked.
func (k *Keys) Set(entries []Entry) {
	if len(entries) == 0 {
		k.cur.Store(nil)
		return
	}
	old := map[string]*Client{}
	if s := k.cur.Load(); s != nil {
		for _, c := range s.clients {
			old[c.name] = c
		}
	}
	next := &set{byDigest: make(map[[sha256.Size]byte]*Client, len(entries)), byCert: map[string]*Client{}}
	for _, e := range entries {
		c := old[e.Name]
		if c == nil {
			c = &Client{name: e.Name}
		}
		c.max.Store(int64(e.MaxInflight))
		c.tpm.Store(e.TokensPerMinute)
		c.rpm.Store(e.RequestsPerMinute)
		if e.HasPriority {
			c.priority.Store(&e.Priority)
		} else {
			c.priority.Store(nil)
		}
		if e.Models != nil {
			c.models.Store(&e.Models)
		} else {
			c.models.Store(nil)
		}
		if e.Cert != "" {
			c.cert.Store(&e.Cert)
		} else {
			c.cert.Store(nil)
		}
		if e.Expires.IsZero() {
			c.expires.Store(0)
		} else {
			c.expires.Store(e.Expires.UnixNano())
		}
		if e.Cert != "" {
			next.byCert[e.Cert] = c
		} else {
			next.byDigest[sha256.Sum256([]byte(e.Key))] = c
		}
		next.clients = append(next.clients, c)
	}
	slices.SortFunc(next.clients, func(a, b *Client) int { return strings.Compare(a.name, b.name) })
	k.cur.Store(next)
}

// On reports whether clients must present a key.
func (k *Keys) On() bool { return k.cur.Load() != nil }

// Lookup returns the client whose key is key; nil, counted as refused,
// when none has it.
func (k *Keys) Lookup(key []byte) *Client {
	if s := k.cur.Load(); s != nil {
		if c := s.byDigest[sha256.Sum256(key)]; c != nil {
			return c
		}
	}
	k.refused.Add(1)
	return nil
}

// LookupCert returns the client of the entry that names the client
// certificate name; nil when none does (not counted: the request may
// still present a key, or be refused by Lookup).
func (k *Keys) LookupCert(name []byte) *Client {
	if s := k.cur.Load(); s != nil && len(name) > 0 {
		return s.byCert[string(name)]
	}
	return nil
}

// Refused counts the requests whose key no client has (or that had none).
func (k *Keys) Refused() uint64 { return k.refused.Load() }

// Clients returns the clients of the current keys, sorted by name.
func (k *Keys) Clients() []*Client {
	if s := k.cur.Load(); s != nil {
		return s.clients
	}
	return nil
}

// FromHeaders returns the key a request presents: the credentials of an
// "Authorization: Bearer" header (the scheme in any case), as OpenAI's
// clients send it, else an x-api-key header's value, as Anthropic's send
// it; nil: neither.
func FromHeaders(authorization, xAPIKey []byte) []byte {
	const bearer = "bearer "
	if len(authorization) > len(bearer) && strings.EqualFold(string(authorization[:len(bearer)]), bearer) {
		return bytes.TrimLeft(authorization[len(bearer):], " ")
	}
	if len(xAPIKey) > 0 {
		return xAPIKey
	}
	return nil
}
