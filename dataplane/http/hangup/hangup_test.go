//go:build linux

package hangup

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type work struct{ name string }

type report struct {
	w   *work
	gen uint32
}

// pair returns both ends of a loopback TCP connection.
func pair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	server, err = ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
	return client, server
}

func start(t *testing.T) (*Watcher[work], chan report) {
	t.Helper()
	got := make(chan report, 8)
	w, err := New(func(wk *work, gen uint32) { got <- report{wk, gen} })
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, w.Close()) })
	return w, got
}

func add(t *testing.T, w *Watcher[work], server net.Conn) Conn {
	t.Helper()
	fd, err := Descriptor(server)
	require.NoError(t, err)
	c, ok := w.Add(fd)
	require.True(t, ok)
	require.NotZero(t, c.Gen())
	return c
}

func quiet(t *testing.T, got chan report, why string) {
	t.Helper()
	select {
	case r := <-got:
		t.Fatalf("%s: reported %v", why, r)
	case <-time.After(150 * time.Millisecond):
	}
}

// begun is a watched connection with work in progress.
func begun(t *testing.T) (w *Watcher[work], got chan report, client, server net.Conn, c Conn, wk *work) {
	t.Helper()
	w, got = start(t)
	client, server = pair(t)
	c = add(t, w, server)
	wk = &work{t.Name()}
	require.True(t, w.Begin(c, wk))
	return w, got, client, server, c, wk
}

func TestPeerCloseReachesTheWorkInProgressOnce(t *testing.T) {
	w, got, client, server, c, wk := begun(t)

	// Bytes from a live client are no hang-up, and are left to read.
	_, err := client.Write([]byte("next request"))
	require.NoError(t, err)
	quiet(t, got, "a live client")
	buf := make([]byte, 64)
	n, err := server.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "next request", string(buf[:n]))

	require.NoError(t, client.Close())
	select {
	case r := <-got:
		require.Equal(t, report{wk, c.Gen()}, r)
	case <-time.After(5 * time.Second):
		t.Fatal("no report after the client closed")
	}
	quiet(t, got, "a second time")
	w.End(c, wk)
	require.False(t, w.Begin(c, &work{"next"}), "a later request on the closed connection")
}

func TestCloseBetweenRequestsIsKeptForTheNext(t *testing.T) {
	w, got, client, _, c, wk := begun(t)
	w.End(c, wk)
	require.NoError(t, client.Close())
	quiet(t, got, "no work in progress")
	require.Eventually(t, func() bool { return !w.Begin(c, wk) }, 5*time.Second, time.Millisecond)
}

func TestRemovedConnectionAndReusedDescriptor(t *testing.T) {
	w, got := start(t)
	client, server := pair(t)
	old := add(t, w, server)
	w.Remove(old)
	require.False(t, w.Begin(old, &work{}), "a removed connection takes no work")
	require.NoError(t, client.Close())
	quiet(t, got, "a removed connection")

	// A later connection on the same descriptor number is a new generation,
	// which a late Remove of the old one leaves alone.
	again, ok := w.Add(int(old.fd))
	require.True(t, ok)
	require.NotEqual(t, old.Gen(), again.Gen())
	w.Remove(old)
	require.Eventually(t, func() bool { return !w.Begin(again, &work{}) }, 5*time.Second, time.Millisecond,
		"the peer of the descriptor's socket closed already")
	for len(got) > 0 { // a Begin that met the close in flight
		require.Equal(t, again.Gen(), (<-got).gen)
	}
}

func TestWhatCannotBeWatched(t *testing.T) {
	w, _ := start(t)
	_, ok := w.Add(-1)
	require.False(t, ok)
	_, ok = w.Add(len(w.slots))
	require.False(t, ok)
	require.True(t, w.Begin(Conn{}, &work{}), "an unwatched connection")
	c1, _ := net.Pipe()
	_, err := Descriptor(c1)
	require.ErrorIs(t, err, errNoFD)
	require.NoError(t, w.Close())
	_, server := pair(t)
	fd, err := Descriptor(server)
	require.NoError(t, err)
	_, ok = w.Add(fd)
	require.False(t, ok, "a closed Watcher watches nothing")
}

func TestBeginAndEndAllocateNothing(t *testing.T) {
	w, _ := start(t)
	_, server := pair(t)
	c := add(t, w, server)
	wk := &work{}
	require.Zero(t, testing.AllocsPerRun(100, func() {
		w.Begin(c, wk)
		w.End(c, wk)
	}))
}

// Closed tells a close the Watcher saw, whether or not work was in
// progress then, and no close before it; a connection not watched is never
// closed to it.
func TestClosedTellsACloseTheWatcherSaw(t *testing.T) {
	w, got := start(t)
	client, server := pair(t)
	c := add(t, w, server)
	require.False(t, w.Closed(c))
	require.NoError(t, client.Close())
	require.Eventually(t, func() bool { return w.Closed(c) }, 2*time.Second, time.Millisecond)
	quiet(t, got, "no work was in progress")
	require.False(t, w.Begin(c, &work{"late"}), "a closed peer stays closed")
	require.False(t, w.Closed(Conn{}))
}
