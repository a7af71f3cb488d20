package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/dedup/storetest"
	"github.com/idemq/idemq/internal/redistest"
	"github.com/idemq/idemq/internal/testenv"
)

// The store passes the conformance suite through go-redis' failover client
// (a primary found through three Sentinels, two replicas): plain,
// autopipelined, and waiting for a replica on complete (WAIT 1).
func TestConformanceSentinel(t *testing.T) {
	cl := testenv.StartCluster(t, testenv.ClusterConfig{Redis: true})
	rdb := cl.FailoverClient()
	for _, v := range []struct {
		name string
		cfg  redisstore.Config
	}{
		{"plain", redisstore.Config{}},
		{"autopipeline", redisstore.Config{AutoPipeline: true}},
		{"wait1", redisstore.Config{WaitReplicas: 1, WaitTimeout: time.Second}},
	} {
		t.Run(v.name, func(t *testing.T) {
			storetest.Run(t, storetest.Suite{
				New: func(t *testing.T) dedup.Store {
					cfg := v.cfg
					cfg.KeyPrefix = testenv.Name(t, "t") + ":"
					return redistest.Store(t, rdb, cfg)
				},
			})
		})
	}

	// WAIT on the same connection as the write: with the two replicas
	// up, WAIT 2 is met (no shortfall, and the record is on both); WAIT
	// 3 cannot be, and each Complete counts a shortfall after the timeout.
	ctx := context.Background()
	for _, c := range []struct {
		replicas  int
		shortfall bool
	}{{2, false}, {3, true}} {
		st, err := redisstore.New(rdb, redisstore.Config{KeyPrefix: testenv.Name(t, "w") + ":", WaitReplicas: c.replicas, WaitTimeout: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		for i, key := range []string{"a", "b"} {
			if _, err := st.Claim(ctx, key, "tok", time.Minute); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if err := st.Complete(ctx, key, "tok", time.Hour); err != nil {
				t.Fatalf("WAIT %d: Complete: %v", c.replicas, err)
			}
			took := time.Since(start)
			if got, want := st.WaitShortfalls(), map[bool]int64{false: 0, true: int64(i + 1)}[c.shortfall]; got != want {
				t.Fatalf("WAIT %d: %d shortfalls after %d completes (took %v), want %d", c.replicas, got, i+1, took, want)
			}
			if c.shortfall && took < 500*time.Millisecond {
				t.Fatalf("WAIT 3 with 2 replicas returned after %v, before its 500ms timeout", took)
			}
		}
	}
}
