package dialer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// resolver answers every name with the addresses it holds, counting the
// lookups; err, when set, fails them.
type resolver struct {
	mu      sync.Mutex
	addrs   []string
	err     error
	lookups atomic.Int32
}

func (r *resolver) set(err error, addrs ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.addrs, r.err = addrs, err
}

func (r *resolver) LookupIPAddr(context.Context, string) ([]net.IPAddr, error) {
	r.lookups.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return nil, r.err
	}
	var out []net.IPAddr
	for _, a := range r.addrs {
		out = append(out, net.IPAddr{IP: net.ParseIP(a)})
	}
	return out, nil
}

// live listens on ip:port ("0": any free port), accepting every
// connection and writing ip to it, until the test ends; it returns the
// port.
func live(t testing.TB, ip, port string) string {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, port))
	if err != nil {
		t.Skipf("cannot listen on %s: %v", ip, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte(ip))
			_ = c.Close()
		}
	}()
	_, p, _ := net.SplitHostPort(ln.Addr().String())
	return p
}

// swallowing listens on ip:port with an accept queue of one that is kept
// full, so that every later connect's SYN is dropped and the connect
// waits, as one to an address whose route goes nowhere does.
func swallowing(t *testing.T, ip, port string) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	require.NoError(t, err)
	t.Cleanup(func() { syscall.Close(fd) })
	p, err := net.LookupPort("tcp", port)
	require.NoError(t, err)
	a := netip.MustParseAddr(ip).As4()
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: p, Addr: a}); err != nil {
		t.Skipf("cannot bind %s:%s: %v", ip, port, err)
	}
	require.NoError(t, syscall.Listen(fd, 0))
	filler, err := net.DialTimeout("tcp", net.JoinHostPort(ip, port), time.Second)
	require.NoError(t, err, "the queue's one place")
	t.Cleanup(func() { filler.Close() })
	if c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, port), 200*time.Millisecond); err == nil {
		c.Close()
		t.Skip("this kernel does not drop connects to a full accept queue")
	}
}

// read returns what the listener wrote to c, and closes it.
func read(t *testing.T, c net.Conn) string {
	t.Helper()
	defer c.Close()
	b := make([]byte, 32)
	n, _ := c.Read(b)
	return string(b[:n])
}

// A name whose first address swallows connects is reached at its next
// one a quarter of a second later, not after the connect timeout; an
// address that refuses passes its turn at once; a name whose every
// address swallows times out as fasthttp's dialer does.
func TestAnAddressThatSwallowsConnectsCostsOneAttemptDelay(t *testing.T) {
	port := live(t, "127.0.0.1", "0")
	swallowing(t, "127.0.0.2", port)
	var r resolver
	d := &Dialer{Resolver: &r, CacheTime: time.Minute}
	addr := net.JoinHostPort("engine.test", port)

	r.set(nil, "127.0.0.2", "127.0.0.1")
	for turn := range 2 { // the first address turns: from each of the two
		start := time.Now()
		c, err := d.Dial(addr, 5*time.Second)
		require.NoError(t, err, "turn %d", turn)
		assert.Equal(t, "127.0.0.1", read(t, c))
		assert.Less(t, time.Since(start), 2*time.Second, "not the connect timeout")
	}

	d2 := &Dialer{Resolver: &r}
	r.set(nil, "127.0.0.3", "127.0.0.1") // nothing listens on .3: refused
	start := time.Now()
	c, err := d2.Dial(addr, 5*time.Second)
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1", read(t, c))
	assert.Less(t, time.Since(start), DefaultAttemptDelay, "a refusal passes its turn at once")

	r.set(nil, "127.0.0.2")
	start = time.Now()
	_, err = d2.Dial(addr, 300*time.Millisecond)
	assert.ErrorIs(t, err, fasthttp.ErrDialTimeout)
	assert.Contains(t, err.Error(), addr)
	assert.Less(t, time.Since(start), 2*time.Second)

	_, err = d2.Dial(net.JoinHostPort("127.0.0.3", port), time.Second)
	var op *net.OpError
	assert.True(t, errors.As(err, &op) && op.Op == "dial", "a refused address literal: %v", err)
}

// A name's addresses take turns from dial to dial, and are looked up
// again once CacheTime old; a failed lookup keeps the last good addresses.
func TestNamesAreCachedAndTheirAddressesTakeTurns(t *testing.T) {
	port := live(t, "127.0.0.1", "0")
	live(t, "127.0.0.2", port)
	var r resolver
	r.set(nil, "127.0.0.1", "127.0.0.2")
	d := &Dialer{Resolver: &r, CacheTime: 300 * time.Millisecond}
	addr := net.JoinHostPort("engine.test", port)
	dial := func() string {
		c, err := d.Dial(addr, time.Second)
		require.NoError(t, err)
		return read(t, c)
	}
	assert.Equal(t, []string{"127.0.0.1", "127.0.0.2", "127.0.0.1", "127.0.0.2"}, []string{dial(), dial(), dial(), dial()})
	assert.Equal(t, int32(1), r.lookups.Load(), "looked up once")

	r.set(nil, "127.0.0.2")
	time.Sleep(400 * time.Millisecond)
	assert.Equal(t, []string{"127.0.0.2", "127.0.0.2"}, []string{dial(), dial()}, "looked up again")
	assert.Equal(t, int32(2), r.lookups.Load())

	r.set(errors.New("name server down"))
	time.Sleep(400 * time.Millisecond)
	assert.Equal(t, "127.0.0.2", dial(), "the last good addresses")

	fresh := &Dialer{Resolver: &r}
	_, err := fresh.Dial(addr, time.Second)
	assert.ErrorContains(t, err, "name server down", "nothing to fall back on")
	r.set(nil)
	_, err = fresh.Dial(addr, time.Second)
	var dnsErr *net.DNSError
	assert.ErrorAs(t, err, &dnsErr, "a name without addresses")
}

// The families take turns after the first address, each family's
// addresses in their turn's order.
func TestOrderInterleavesTheFamilies(t *testing.T) {
	addrs := func(s ...string) []netip.Addr {
		out := make([]netip.Addr, len(s))
		for i, a := range s {
			out[i] = netip.MustParseAddr(a)
		}
		return out
	}
	both := addrs("fd00::1", "fd00::2", "10.0.0.1", "10.0.0.2", "10.0.0.3")
	for turn, want := range [][]netip.Addr{
		addrs("fd00::1", "10.0.0.1", "fd00::2", "10.0.0.2", "10.0.0.3"),
		addrs("fd00::2", "10.0.0.1", "fd00::1", "10.0.0.2", "10.0.0.3"),
		addrs("10.0.0.1", "fd00::1", "10.0.0.2", "fd00::2", "10.0.0.3"),
	} {
		assert.Equal(t, want, Order(both, turn), "turn %d", turn)
	}
	assert.Equal(t, addrs("10.0.0.2", "10.0.0.1"), Order(addrs("10.0.0.1", "10.0.0.2"), 3))
	assert.Equal(t, fmt.Sprint(Order(both, 7)), fmt.Sprint(Order(both, 2)), "modulo their number")
}

// Many dials at once to a name whose first address swallows connects all
// connect, each losing attempt called off or closed.
func TestDialsAtOnce(t *testing.T) {
	port := live(t, "127.0.0.1", "0")
	swallowing(t, "127.0.0.2", port)
	var r resolver
	r.set(nil, "127.0.0.2", "127.0.0.1")
	d := &Dialer{Resolver: &r, CacheTime: time.Minute, AttemptDelay: 20 * time.Millisecond}
	var wg sync.WaitGroup
	var ok atomic.Int32
	for range 32 {
		wg.Go(func() {
			if c, err := d.Dial(net.JoinHostPort("engine.test", port), 5*time.Second); err == nil {
				if read(t, c) == "127.0.0.1" {
					ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	assert.Equal(t, int32(32), ok.Load())
}

// BenchmarkDialOneAddress dials a worker named by its one address, as
// most are: the connect a stream burst makes per stream.
func BenchmarkDialOneAddress(b *testing.B) {
	addr := net.JoinHostPort("127.0.0.1", live(b, "127.0.0.1", "0"))
	var d Dialer
	b.ReportAllocs()
	for b.Loop() {
		c, err := d.Dial(addr, time.Second)
		if err != nil {
			b.Fatal(err)
		}
		_ = c.Close()
	}
}
