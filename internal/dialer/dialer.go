// Package dialer connects to a worker's host:port as a proxy should when
// its name has several addresses: looked up again once its addresses are
// CacheTime old (a worker that moved is found), its addresses taken in
// turn from dial to dial (a name over several hosts shares their load),
// and tried as RFC 8305's Happy Eyeballs tries them: the next one begins
// AttemptDelay after the one before it, or at once when that one failed,
// the address families taking turns, and the first to connect wins. An
// address that swallows connects (an IPv6 route that goes nowhere, a host
// gone from the network) then costs a quarter of a second, not the whole
// connect timeout and a failed request.
//
// fasthttp's own dialer tries a name's addresses one after the other,
// each with the whole timeout left, and gives up at the first timeout.
package dialer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// DefaultAttemptDelay is RFC 8305's recommended Connection Attempt Delay.
const DefaultAttemptDelay = 250 * time.Millisecond

// Dialer connects to host:port addresses. The zero value is ready: names
// are looked up by net.DefaultResolver, at most every dial.
type Dialer struct {
	// Resolver looks names up (nil: net.DefaultResolver).
	Resolver fasthttp.Resolver
	// CacheTime is how long a name's addresses are used before it is
	// looked up again (0: every dial).
	CacheTime time.Duration
	// AttemptDelay is how long an attempt has before the next address's
	// begins beside it (0: DefaultAttemptDelay).
	AttemptDelay time.Duration

	names sync.Map // host → *name
}

// name is what a host name was last looked up to.
type name struct {
	mu    sync.Mutex
	addrs []netip.Addr
	at    time.Time     // when they were looked up
	turn  atomic.Uint32 // the dial whose turn it is, for the first address
}

// Dial connects to addr (host:port) within timeout. A timeout is
// fasthttp.ErrDialTimeout, as fasthttp's dialer has it; any other failure
// is the last address's error.
func (d *Dialer) Dial(addr string, timeout time.Duration) (net.Conn, error) {
	deadline := time.Now().Add(timeout)
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	var order []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		order = []netip.Addr{ip}
	} else if order, err = d.lookUp(host, deadline); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	c, err := d.race(ctx, order, port)
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() || err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("%w: %s", fasthttp.ErrDialTimeout, addr)
	}
	return c, err
}

// lookUp returns host's addresses in the order this dial tries them
// (Order): from the cache while they are younger than CacheTime, else
// looked up again. A failed lookup falls back on the addresses of the last
// good one: a name server down does not cut the workers it named off.
func (d *Dialer) lookUp(host string, deadline time.Time) ([]netip.Addr, error) {
	v, _ := d.names.LoadOrStore(host, &name{})
	n := v.(*name)
	n.mu.Lock()
	if n.addrs == nil || time.Since(n.at) >= d.CacheTime {
		addrs, err := d.resolve(host, deadline)
		switch {
		case err == nil:
			n.addrs, n.at = addrs, time.Now()
		case n.addrs == nil:
			n.mu.Unlock()
			return nil, err
		}
	}
	addrs := n.addrs
	n.mu.Unlock()
	return Order(addrs, int(n.turn.Add(1)-1)), nil
}

func (d *Dialer) resolve(host string, deadline time.Time) ([]netip.Addr, error) {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	var r fasthttp.Resolver = net.DefaultResolver
	if d.Resolver != nil {
		r = d.Resolver
	}
	found, err := r.LookupIPAddr(ctx, host)
	if err != nil {
		return nil, err
	}
	addrs := make([]netip.Addr, 0, len(found))
	for _, a := range found {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && a.Zone == "" {
			addrs = append(addrs, ip.Unmap())
		}
	}
	if len(addrs) == 0 {
		return nil, &net.DNSError{Err: "no address", Name: host, IsNotFound: true}
	}
	return addrs, nil
}

// Order is the order a dial tries addrs in: from the turn-th (modulo their
// number) on, round the list, with the address families taking turns
// after it (RFC 8305's interleaving), each family's addresses in that
// order.
func Order(addrs []netip.Addr, turn int) []netip.Addr {
	n := len(addrs)
	var first, other []netip.Addr
	for i := range n {
		a := addrs[(turn+i)%n]
		if a.Is4() == addrs[turn%n].Is4() {
			first = append(first, a)
		} else {
			other = append(other, a)
		}
	}
	out := make([]netip.Addr, 0, n)
	for i := 0; i < len(first) || i < len(other); i++ {
		if i < len(first) {
			out = append(out, first[i])
		}
		if i < len(other) {
			out = append(out, other[i])
		}
	}
	return out
}

// attempt is one connect's outcome.
type attempt struct {
	c   net.Conn
	err error
}

// race tries the addresses in order on port until one connects or ctx
// ends: each begins AttemptDelay after the one before it, or at once when
// an attempt failed. The first connection is returned and the attempts
// still under way are called off (one that connects anyway is closed).
func (d *Dialer) race(ctx context.Context, order []netip.Addr, port string) (net.Conn, error) {
	var nd net.Dialer
	if len(order) == 1 {
		// Nothing to race (a worker named by its address, as most are):
		// connected here, without an attempt's goroutine, channel and
		// timer.
		return nd.DialContext(ctx, "tcp", net.JoinHostPort(order[0].String(), port))
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	delay := d.AttemptDelay
	if delay <= 0 {
		delay = DefaultAttemptDelay
	}
	results := make(chan attempt, len(order))
	next, pending := 0, 0
	begin := func() {
		addr := net.JoinHostPort(order[next].String(), port)
		next++
		pending++
		go func() {
			c, err := nd.DialContext(ctx, "tcp", addr)
			results <- attempt{c, err}
		}()
	}
	begin()
	timer := time.NewTimer(delay)
	defer timer.Stop()
	var last error
	for pending > 0 {
		select {
		case r := <-results:
			pending--
			if r.err == nil {
				cancel()
				go closeLate(results, pending)
				return r.c, nil
			}
			last = r.err
			if next < len(order) { // a failure need not wait its turn
				begin()
				timer.Reset(delay)
			}
		case <-timer.C:
			if next < len(order) {
				begin()
				timer.Reset(delay)
			}
		}
	}
	return nil, last
}

// closeLate closes the connections of the pending attempts that connected
// after another won.
func closeLate(results <-chan attempt, pending int) {
	for range pending {
		if r := <-results; r.err == nil {
			_ = r.c.Close()
		}
	}
}
