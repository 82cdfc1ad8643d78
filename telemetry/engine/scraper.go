package engine

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fastroute/fastroute/internal/bearer"
	"github.com/fastroute/fastroute/internal/every"
	"github.com/fastroute/fastroute/internal/workerclient"
	"github.com/valyala/fasthttp"
)

// StaleAfter is how many intervals a reading stays valid while no scrape of
// its engine is under way; after that the worker's Stats are withdrawn and
// routing falls back to the router's own signals.
const StaleAfter = 3

// AsleepHeldFor is how many intervals a reading that said its engine
// sleeps stays while no scrape of it is under way (StaleAfter for any
// other). A sleeping engine's health answers 200: withdrawn, the reading
// put the worker back in rotation to meet the engine's refusals, while the
// likelier cause of a lost reading is the router's own (a scrape that
// failed once, a loaded host that ran none for a few intervals). A
// wake-up, a call to the engine, shows in the next good reading; bounded,
// so that an engine woken whose metrics then fail is judged by its health
// probes after that time (5 s at DefaultInterval).
const AsleepHeldFor = 100

// Defaults of Options.
const (
	DefaultInterval = 50 * time.Millisecond
	DefaultTimeout  = time.Second
)

// Target is one engine to poll.
type Target struct {
	ID    uint64
	URL   string // the metrics URL
	Slots int    // configured max_inflight; 0: learn the batch size
	// Socket is the unix socket URL's connections are dialed to ("":
	// URL's host).
	Socket string
	// Relayed, when set, says what the router itself sees of the worker
	// (RelayedCounts). A worker whose engine gives no metrics (its page
	// answers 404 or 501, or holds no engine's load series) is read from
	// it instead: a Reading of DialectRouter.
	Relayed func() RelayedCounts
}

// RelayedCounts is what the router itself sees of a worker: its requests
// in flight, and counters of the tokens of the answers it relayed from it
// and of the gaps between two tokens of its streams, and their time in
// all (a reading's TokenGaps and TokenGapSeconds).
type RelayedCounts struct {
	InFlight int64
	Tokens   uint64
	Gaps     uint64
	Spanned  time.Duration
}

// DialectRouter is the Dialect of a reading the router took of a worker
// whose engine gives no metrics: Running is the router's requests in
// flight on it, Tokens those it relayed from it; nothing waits, as far
// as the router knows.
const DialectRouter = "router"

// errNoMetrics says an engine answered its metrics page with a status
// that says it has none: 404 (SGLang without --enable-metrics, Ollama) or
// 501 (llama-server without --metrics).
var errNoMetrics = errors.New("the engine serves no metrics")

// Options configures a Scraper.
type Options struct {
	Interval time.Duration // poll period (DefaultInterval)
	Timeout  time.Duration // one scrape (DefaultTimeout)
	Logger   *slog.Logger
	// Targets lists the engines to poll; it is called once per tick.
	Targets func() []Target
	// Publish hands over a worker's new Stats, or nil when its reading
	// went stale (one that said its engine sleeps after AsleepHeldFor
	// intervals) or a scrape failed before any reading. It is called from
	// the scraping goroutines, one call per worker at a time.
	Publish func(id uint64, st *Stats)
	// APIKey, when set, goes as "Authorization: Bearer <key>" on every
	// scrape; a reload may change it.
	APIKey *bearer.Token
	// TLS is the configuration of scrapes of https:// workers (nil: the
	// system's roots).
	TLS *tls.Config
	// Dial connects to a worker's host:port over TCP (nil: fasthttp's
	// dialer).
	Dial func(addr string, timeout time.Duration) (net.Conn, error)
	// StallAfter, when positive, marks an engine's Stats Stalled once it
	// has had requests running for that long without generating a token
	// (Stats.StillFor); SetStallAfter changes it.
	StallAfter time.Duration
}

// Scraper polls every target's metrics concurrently each interval.
type Scraper struct {
	o         Options                         // its Timeout and TLS as they are now (SetTiming, SetTLS) guarded by mu
	every     *every.Period                   // Options.Interval as it is now (SetTiming)
	client    atomic.Pointer[fasthttp.Client] // keeps its connections alive; a socket's target has its own; SetTLS replaces it
	mu        sync.Mutex                      // guards state and o; never taken on the request path
	state     map[uint64]*target
	fallbacks atomic.Uint64
	conns     openConns
	stall     atomic.Int64 // StallAfter as it is now, in nanoseconds
}

type target struct {
	Target
	busy    atomic.Bool          // a scrape is under way
	learner Learner              // guarded by Scraper.mu
	relayed Learner              // of the router's own readings (DialectRouter); guarded by Scraper.mu
	last    *Stats               // last published, nil when stale; guarded by Scraper.mu
	lastAt  time.Time            // time of the last good reading
	reason  string               // why there is no fresh reading ("" when there is)
	stalled bool                 // the last reading's Stats.Stalled, for the log's changes; guarded by Scraper.mu
	client  *fasthttp.HostClient // Socket's; nil: the Scraper's
	timeout time.Duration        // the Timeout client was made with
	// kept is what Parse read of the last page that parsed (the lines of
	// the series it reads), and parsed what it read there: a page whose
	// lines are the same (an idle engine's) is not parsed again. Used by
	// the scrape under way only.
	kept   []byte
	parsed Reading
}

// New returns a Scraper; Run starts it.
func New(o Options) *Scraper {
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Dial == nil {
		o.Dial = fasthttp.DialTimeout
	}
	s := &Scraper{o: o, state: map[uint64]*target{}, conns: openConns{set: map[*openConn]struct{}{}}, every: every.NewPeriod(o.Interval)}
	s.SetStallAfter(o.StallAfter)
	s.client.Store(s.tcpClient())
	return s
}

// tcpClient is a client of the engines over TCP, speaking TLS to https://
// ones, under the options as they are now. The caller holds mu, or is New.
func (s *Scraper) tcpClient() *fasthttp.Client {
	dial := s.o.Dial
	return workerclient.TCP(s.clientOptions(), s.o.TLS, func(addr string, timeout time.Duration) (net.Conn, error) {
		return s.conns.track(dial(addr, timeout))
	})
}

// SetTLS replaces Options.TLS (a reload): the next scrape of an https://
// engine connects under conf, and the connections kept under the old one
// close (workerclient.Retire).
func (s *Scraper) SetTLS(conf *tls.Config) {
	s.mu.Lock()
	s.o.TLS = conf
	s.renewClient(s.o.Timeout)
	s.mu.Unlock()
}

// SetTiming changes Options.Interval and Timeout (0: their defaults) (a
// reload): the next tick comes one new interval from now (every.Period),
// a reading goes stale after StaleAfter new intervals, and each scrape
// from the next on waits the new timeout.
func (s *Scraper) SetTiming(interval, timeout time.Duration) {
	s.mu.Lock()
	was := s.o.Timeout
	s.o.Timeout = cmp.Or(timeout, DefaultTimeout)
	s.renewClient(max(was, s.o.Timeout)) // its own read and write timeouts; a socket's, at its next scrape (tick)
	s.mu.Unlock()
	s.every.Set(cmp.Or(interval, DefaultInterval))
}

// renewClient replaces the client of the engines over TCP with one made
// under the options as they are now, the old one retired once its scrapes
// under way ended, each within timeout (workerclient.Retire). The caller
// holds mu.
func (s *Scraper) renewClient(timeout time.Duration) {
	workerclient.Retire(s.client.Swap(s.tcpClient()), timeout)
}

// SetStallAfter changes Options.StallAfter from the next reading on (a
// reload): an engine still is marked stalled, or back, by the new bound.
func (s *Scraper) SetStallAfter(d time.Duration) { s.stall.Store(int64(d)) }

// Prime scrapes every target once and returns when each of those scrapes
// ended (each within Timeout), so that a router taking requests after it
// prices its engines from its first request on, where one serving at once
// routes the requests of its first interval on its own signals. Run goes
// on from there.
func (s *Scraper) Prime(ctx context.Context) {
	var round sync.WaitGroup
	s.tick(ctx, &round, time.Now())
	round.Wait()
}

// Run polls every Interval until ctx ends, then closes the scrapes'
// connections, which ends the scrapes under way, and waits for them.
func (s *Scraper) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	defer s.conns.closeAll()
	s.every.Loop(ctx, func() { s.tick(ctx, &wg, time.Now()) })
}

// tick starts a scrape of every target that has none under way and
// withdraws readings gone stale.
func (s *Scraper) tick(ctx context.Context, wg *sync.WaitGroup, now time.Time) {
	targets, interval := s.o.Targets(), s.every.Get()
	s.mu.Lock()
	keep := make(map[uint64]*target, len(targets))
	for _, tg := range targets {
		st := s.state[tg.ID]
		if st == nil || st.URL != tg.URL || st.Socket != tg.Socket {
			st = &target{Target: tg, reason: "no reading yet", client: s.socketClient(tg.Socket), timeout: s.o.Timeout}
		}
		st.Slots, st.Relayed = tg.Slots, tg.Relayed
		keep[tg.ID] = st
		// A reading whose next scrape is still under way is not withdrawn:
		// an engine busy enough to answer its metrics page slowly (more
		// than the intervals a reading stays fresh, within the scrape's
		// timeout) would otherwise lose its reading between every two
		// scrapes, and with it the fleet its engine costs. A scrape that
		// fails, or times out, leaves it to go at the next tick.
		if st.last != nil && !st.busy.Load() {
			switch age := now.Sub(st.lastAt); {
			case age <= StaleAfter*interval:
			case st.last.Asleep && age <= AsleepHeldFor*interval:
				// Held: the failed scrapes' reason stands.
			default:
				st.last = nil
				s.note(st, "reading is stale")
				s.o.Publish(st.ID, nil)
			}
		}
		if st.busy.CompareAndSwap(false, true) {
			if st.client != nil && st.timeout != s.o.Timeout { // none of its scrapes under way
				workerclient.Retire(st.client, st.timeout)
				st.client, st.timeout = s.socketClient(st.Socket), s.o.Timeout
			}
			var sent int64 // the router's requests in flight as the scrape leaves (Stats.Occupancy)
			if st.Relayed != nil {
				sent = st.Relayed().InFlight
			}
			timeout := s.o.Timeout
			wg.Go(func() { s.scrape(ctx, st, sent, timeout) })
		}
	}
	for id, st := range s.state {
		if st.client != nil && keep[id] != st { // its worker left, or moved
			st.client.CloseIdleConnections()
		}
	}
	s.state = keep
	s.mu.Unlock()
}

// openConns are the scrapes' connections, open until closeAll: fasthttp's
// client takes no context, so a scrape under way when Run ends (of an
// engine slow to answer its metrics) ends by its connection's close, not
// at its timeout.
type openConns struct {
	mu     sync.Mutex
	set    map[*openConn]struct{}
	closed bool
}

type openConn struct {
	net.Conn
	in *openConns
}

// track keeps c until it is closed; once closeAll ran, it closes c and
// refuses it.
func (o *openConns) track(c net.Conn, err error) (net.Conn, error) {
	if err != nil {
		return nil, err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		_ = c.Close()
		return nil, errScraperStopped
	}
	oc := &openConn{Conn: c, in: o}
	o.set[oc] = struct{}{}
	return oc, nil
}

func (c *openConn) Close() error {
	c.in.mu.Lock()
	delete(c.in.set, c)
	c.in.mu.Unlock()
	return c.Conn.Close()
}

// closeAll closes every connection, idle or in use, and any dialed after.
func (o *openConns) closeAll() {
	o.mu.Lock()
	o.closed = true
	all := o.set
	o.set = nil
	o.mu.Unlock()
	for c := range all {
		_ = c.Conn.Close()
	}
}

var errScraperStopped = errors.New("the scraper stopped")

// socketClient is a client whose connections go to the unix socket sock,
// or nil for none. The caller holds mu, or is New.
func (s *Scraper) socketClient(sock string) *fasthttp.HostClient {
	if sock == "" {
		return nil
	}
	timeout := s.o.Timeout
	return workerclient.Socket(s.clientOptions(), "localhost", func(string) (net.Conn, error) {
		return s.conns.track(net.DialTimeout("unix", sock, timeout))
	})
}

// clientOptions are the scrapes' clients': a page over MaxPageBytes fails.
// The caller holds mu, or is New.
func (s *Scraper) clientOptions() workerclient.Options {
	return workerclient.Options{Name: "fastroute-metrics", Timeout: s.o.Timeout, MaxBody: MaxPageBytes, IdleFor: time.Minute}
}

// scrape reads st's engine within timeout and publishes what it learned;
// sent is the router's requests in flight on the worker as it left
// (Stats.Occupancy).
func (s *Scraper) scrape(ctx context.Context, st *target, sent int64, timeout time.Duration) {
	defer st.busy.Store(false)
	r, err := s.fetch(st, timeout)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		s.note(st, err.Error())
		if st.Relayed != nil && (errors.Is(err, errNoMetrics) || errors.Is(err, ErrNoLoadSeries)) {
			s.readRelayed(st)
		} else if st.last == nil {
			// Whatever stood in for the worker's first reading goes:
			// its engine gives none.
			s.o.Publish(st.ID, nil)
		}
		return
	}
	stats := st.learner.Observe(r, st.Slots)
	stats.Occupancy = sent
	stall := time.Duration(s.stall.Load())
	stats.Stalled = stall > 0 && stats.StillFor >= stall
	if stats.Stalled != st.stalled {
		if stats.Stalled {
			s.o.Logger.Warn("engine stalled: requests running, no token generated; out of rotation", "worker", st.ID,
				"running", stats.Running, "still_for", stats.StillFor)
		} else {
			s.o.Logger.Info("engine no longer stalled (it generated, or runs nothing); back in rotation", "worker", st.ID)
		}
		st.stalled = stats.Stalled
	}
	st.last, st.lastAt = &stats, r.At
	s.note(st, "")
	s.o.Publish(st.ID, st.last)
}

// readRelayed publishes the router's own reading of a worker whose engine
// gives no metrics: its requests in flight as running, the tokens it
// relayed from it as generated, from which its speed is learned as an
// engine's is. A request the router sent counts as running while the
// engine may queue it, so a speed learned while it queues is lower (and
// the worker dearer) than the engine's own; a non-streamed answer's
// tokens count once it ended, so its requests are never taken for
// stalled. The caller holds mu.
func (s *Scraper) readRelayed(st *target) {
	c := st.Relayed()
	r := Reading{At: time.Now(), Dialect: DialectRouter, Running: float64(c.InFlight), Tokens: float64(c.Tokens),
		PrefixQueries: -1, PrefixHits: -1, PrefixHitRate: -1, TokenGaps: float64(c.Gaps), TokenGapSeconds: c.Spanned.Seconds()}
	stats := st.relayed.Observe(r, st.Slots)
	stats.StillFor = 0
	st.last, st.lastAt = &stats, r.At
	s.o.Publish(st.ID, st.last)
}

// fetch reads st's page, following redirects, within timeout.
func (s *Scraper) fetch(st *target, timeout time.Duration) (Reading, error) {
	var client interface {
		DoDeadline(*fasthttp.Request, *fasthttp.Response, time.Time) error
	} = s.client.Load()
	if st.client != nil {
		client = st.client
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	url := st.URL
	req.SetRequestURI(url)
	if auth := s.o.APIKey.Header(); auth != nil {
		req.Header.SetBytesV(fasthttp.HeaderAuthorization, auth)
	}
	deadline := time.Now().Add(timeout)
	origin := string(req.URI().Scheme()) + "://" + string(req.URI().Host())
	for hops := 0; ; hops++ {
		if err := client.DoDeadline(req, resp, deadline); err != nil {
			if errors.Is(err, fasthttp.ErrBodyTooLarge) {
				return Reading{}, ErrPageTooLarge
			}
			return Reading{}, err
		}
		if !fasthttp.StatusCodeIsRedirect(resp.StatusCode()) || hops == maxRedirects {
			break
		}
		location := resp.Header.Peek(fasthttp.HeaderLocation)
		if len(location) == 0 {
			break
		}
		req.URI().UpdateBytes(location)
		if string(req.URI().Scheme())+"://"+string(req.URI().Host()) != origin {
			// The worker's API key goes to the worker alone.
			return Reading{}, fmt.Errorf("GET %s: redirected to %s, not %s: not followed", url, location, origin)
		}
	}
	switch resp.StatusCode() {
	case fasthttp.StatusOK:
	case fasthttp.StatusNotFound, fasthttp.StatusNotImplemented:
		return Reading{}, fmt.Errorf("GET %s: status %d: %w", url, resp.StatusCode(), errNoMetrics)
	default:
		return Reading{}, fmt.Errorf("GET %s: status %d", url, resp.StatusCode())
	}
	return st.parse(resp.Body(), time.Now())
}

// parse is Parse, but a page whose lines of the series Parse reads are
// those of st's last page that parsed gives that page's reading, at at.
func (st *target) parse(page []byte, at time.Time) (Reading, error) {
	kept := keepRead(page)
	if st.kept != nil && bytes.Equal(kept, st.kept) {
		r := st.parsed
		r.At = at
		return r, nil
	}
	r, err := parseKept(kept, at)
	if err != nil {
		st.kept = nil
		return r, err
	}
	st.kept, st.parsed = append(st.kept[:0], kept...), r
	return r, nil
}

// maxRedirects is how many redirects a scrape follows, each to the
// worker's own scheme, host and port.
const maxRedirects = 3

// note records why a target has no fresh reading ("" when it has one),
// counting and logging each change once. The caller holds mu.
func (s *Scraper) note(st *target, reason string) {
	if reason == st.reason {
		return
	}
	if reason == "" {
		s.o.Logger.Info("engine metrics available", "worker", st.ID, "url", st.URL)
	} else {
		if st.reason == "" || st.reason == "no reading yet" {
			s.fallbacks.Add(1)
		}
		s.o.Logger.Warn("engine metrics unavailable; routing on the router's own signals", "worker", st.ID, "reason", reason)
	}
	st.reason = reason
}

// Describe adds a worker's engine view to info (GET /workers).
func (s *Scraper) Describe(id uint64, info map[string]any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.state[id]
	if st == nil {
		return
	}
	if st.last == nil {
		info["engine_source"] = "none"
		info["engine_reason"] = st.reason
		return
	}
	l := st.last
	info["engine_source"] = l.Dialect
	if l.Dialect != DialectRouter {
		info["engine_kv_usage"] = l.KVUsage
	}
	if st.reason != "" {
		// Why the router reads it itself (its KV cache unseen), or why the
		// reading is not fresh: a scrape failed, or one held asleep.
		info["engine_reason"] = st.reason
	}
	info["engine_running"] = l.Running
	info["engine_waiting"] = l.Waiting
	info["engine_age_seconds"] = time.Since(l.At).Seconds()
	info["engine_slots"] = l.Slots
	if l.Admit > 0 {
		info["engine_admit_limit"] = l.Admit
	}
	info["engine_token_rate"] = l.TokenRate
	if l.TokenRate > 0 {
		info["engine_token_rate_source"] = "learned"
		if l.RateFromGaps {
			info["engine_token_rate_source"] = "inter-token latency"
		}
	}
	if l.StillFor > 0 {
		info["engine_still_seconds"] = l.StillFor.Seconds()
	}
	if l.PrefixHitRatio >= 0 {
		info["engine_prefix_cache_hit_ratio"] = l.PrefixHitRatio
	}
	if len(l.Adapters) > 0 {
		info["engine_loras"] = l.Adapters
	}
}

// Counts returns how many times a worker lost its engine reading, and how
// many workers have none now (the router's own readings are none).
func (s *Scraper) Counts() (fallbacks uint64, without int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.state {
		if st.last == nil || st.last.Dialect == DialectRouter {
			without++
		}
	}
	return s.fallbacks.Load(), without
}
