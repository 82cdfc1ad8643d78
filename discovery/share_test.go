package discovery

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// sharedSeen records what ShareUsage's apply got last.
type sharedSeen struct {
	mu   sync.Mutex
	last []string
	n    int
}

func (s *sharedSeen) apply(others [][]byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = s.last[:0]
	for _, b := range others {
		s.last = append(s.last, string(b))
	}
	slices.Sort(s.last)
	s.n++
}

func (s *sharedSeen) get() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.last)
}

// Replicas sharing usage see one another's latest values, not their own;
// a replica that stops deletes its key, and the others stop seeing it at
// their next tick; one killed without deleting it is dropped when its
// lease ends.
func TestReplicasShareTheirUsage(t *testing.T) {
	_, o, cli := testClient(t, "/share")
	var a, b sharedSeen
	var value sync.Map
	value.Store("a", "a1")
	ctxA, stopA := context.WithCancel(context.Background())
	ctxB, stopB := context.WithCancel(context.Background())
	aDone := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait() // after stopB, deferred next
	defer stopB()
	read := func(name string) func() []byte {
		return func() []byte { v, _ := value.Load(name); return []byte(v.(string)) }
	}
	value.Store("b", "b1")
	wg.Go(func() { ShareUsage(ctxA, o, "a", 50*time.Millisecond, read("a"), a.apply); close(aDone) })
	wg.Go(func() { ShareUsage(ctxB, o, "b", 50*time.Millisecond, read("b"), b.apply) })
	require.Eventually(t, func() bool { return slices.Equal(a.get(), []string{"b1"}) && slices.Equal(b.get(), []string{"a1"}) },
		5*time.Second, 10*time.Millisecond, "each sees the other, not itself")
	value.Store("a", "a2")
	require.Eventually(t, func() bool { return slices.Equal(b.get(), []string{"a2"}) }, 5*time.Second, 10*time.Millisecond, "the latest value")

	stopA()
	<-aDone // a's ShareUsage returned: its key is gone
	got, err := cli.Get(context.Background(), UsageKey("/share"), clientv3.WithPrefix())
	require.NoError(t, err)
	require.Len(t, got.Kvs, 1, "only b's key is left")
	require.Eventually(t, func() bool { return len(b.get()) == 0 }, 5*time.Second, 10*time.Millisecond, "b stops seeing a")

	// A replica that dies leaves its key to its lease (2 s at least).
	lease, err := cli.Grant(context.Background(), 2)
	require.NoError(t, err)
	_, err = cli.Put(context.Background(), UsageKey("/share")+"dead", "d1", clientv3.WithLease(lease.ID))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return slices.Equal(b.get(), []string{"d1"}) }, 5*time.Second, 10*time.Millisecond)
	start := time.Now()
	require.Eventually(t, func() bool { return len(b.get()) == 0 }, 10*time.Second, 20*time.Millisecond, "the dead one's lease ends")
	assert.Less(t, time.Since(start), 5*time.Second)
}
