package frontend

import (
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// A failed try is classed by what failed: a real connect to a port nobody
// listens on, fasthttp's connect timeout and a connect that waited too
// long for its turn are connect failures; a read that timed out is a
// timeout; anything else on the connection is a transport failure.
func TestFailuresAreClassedByWhatFailed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	_, refused := fasthttp.DialTimeout(addr, time.Second)
	require.Error(t, refused)

	peer, c := net.Pipe()
	defer peer.Close()
	require.NoError(t, c.SetReadDeadline(time.Now()))
	_, timedOut := c.Read(make([]byte, 1))
	require.Error(t, timedOut)

	for err, want := range map[error]failure{
		refused:                 failConnect,
		fasthttp.ErrDialTimeout: failConnect,
		errDialQueue:            failConnect,
		timedOut:                failTimeout,
		fmt.Errorf("wrapped: %w", fasthttp.ErrTimeout): failTimeout,
		io.EOF:                       failTransport,
		fasthttp.ErrConnectionClosed: failTransport,
		&answerBroke{err: errors.New("x"), unreadable: true}: failTransport,
	} {
		assert.Equal(t, failureNames[want], failureNames[failureOf(err)], "%v", err)
	}
}

// Counting a worker's answer or failure allocates nothing, and answers go
// to their status class.
func TestCountingAWorkersAnswersDoesNotAllocate(t *testing.T) {
	reg := dataplane.NewRegistry()
	w, err := reg.Add(dataplane.WorkerSpec{ID: 1, URL: "http://127.0.0.1:1"})
	require.NoError(t, err)
	sel, err := dataplane.NewSelector(reg, "round-robin", 0)
	require.NoError(t, err)
	s := New(Options{Selector: sel})
	assert.Same(t, noStats, s.statsOf(w), "no request went to it yet")
	s.upstreamOf(w)
	st := s.statsOf(w)
	require.NotSame(t, noStats, st)
	assert.Zero(t, testing.AllocsPerRun(1000, func() {
		s.statsOf(w).answered(200, time.Millisecond)
		s.statsOf(w).failed(failCut)
	}))
	st.answered(503, time.Millisecond)
	st.answered(99, time.Millisecond) // not HTTP's: the lowest class
	st.answered(700, time.Millisecond)
	assert.EqualValues(t, 1001, st.answers[1].Value())
	assert.EqualValues(t, 1, st.answers[0].Value())
	assert.EqualValues(t, 2, st.answers[4].Value())
	assert.EqualValues(t, 1001, st.failures[failCut].Value())
	assert.EqualValues(t, 1004, st.firstByte.Count())
}
