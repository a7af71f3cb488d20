//go:build faults

package e2etest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/internal/testenv"
)

// The Redis guard through go-redis' failover client while the primary is
// killed with kill -9 and Sentinel promotes a replica: the guard keeps
// working (fail-closed pauses, no message lost), messages published after
// the failover are never applied twice, and the duplicates the failover
// causes — done records the dead primary had not replicated yet — are
// counted, without and with WAIT 1 on complete.
func TestFaultSentinelFailover(t *testing.T) {
	testenv.RequireAMQP(t)
	for _, waitReplicas := range []int{0, 1} {
		t.Run(fmt.Sprintf("wait%d", waitReplicas), func(t *testing.T) {
			cl := testenv.StartCluster(t, testenv.ClusterConfig{Redis: true})
			rdb := cl.FailoverClient()
			st, err := redisstore.New(rdb, redisstore.Config{KeyPrefix: testenv.Name(t, "t") + ":", WaitReplicas: waitReplicas})
			if err != nil {
				t.Fatal(err)
			}
			queue := testenv.Queue(t, nil)
			tr := newTracker()
			var recs [2]idemq.Counters
			var stops []func()
			for i := range recs {
				guard := mustGuard(st, dedup.Config{Lease: 3 * time.Second, StoreTimeout: 2 * time.Second, StoreRetryAfter: 200 * time.Millisecond, Logger: quiet()})
				_, stop := runConsumer(t, idemq.ConsumerConfig{Queue: queue, Workers: 4, Prefetch: 50, Recorder: &recs[i],
					Pipeline: idemq.Pipeline{Guard: guard}},
					idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
						tr.add(d.MessageID)
						select { // work that takes a while: the kill meets handlers in flight
						case <-time.After(5 * time.Millisecond):
						case <-ctx.Done():
						}
						return nil
					}))
				stops = append(stops, stop)
			}
			const n = 2000
			ids := func(from, to int) []string {
				var out []string
				for i := from; i < to; i++ {
					id := fmt.Sprintf("m-%d", i)
					out = append(out, id, id) // every message sent twice: the guard must drop one
				}
				return out
			}
			publishIDs(t, queue, ids(0, n/2)...)
			testenv.Eventually(t, 2*time.Minute, "a quarter applied", func() bool { return len(tr.snapshot()) >= n/4 })
			before := cl.RedisPrimary()
			cl.Run("redis-failover")
			after := cl.RedisPrimary()
			if after == before {
				t.Fatalf("the primary is still %s after the failover", before)
			}
			publishIDs(t, queue, ids(n/2, n)...)
			testenv.Eventually(t, 3*time.Minute, "every message applied and the queue drained", func() bool {
				if len(tr.snapshot()) < n {
					return false
				}
				ready, _ := testenv.QueueCounts(t, queue)
				return ready == 0
			})
			// Stop the consumers (they finish and ack what they hold), so
			// that every copy is counted.
			for _, stop := range stops {
				stop()
			}
			if ready, _ := testenv.QueueCounts(t, queue); ready != 0 {
				t.Logf("%d copies left in the queue after the stop (their messages were applied)", ready)
			}
			seen := tr.snapshot()
			twiceBefore, twiceAfter := 0, 0
			for i := 0; i < n; i++ {
				if seen[fmt.Sprintf("m-%d", i)] > 1 {
					if i < n/2 {
						twiceBefore++
					} else {
						twiceAfter++
					}
				}
			}
			var dups, storeErrs int64
			for i := range recs {
				s := recs[i].Snapshot()
				dups += s[idemq.CountDuplicates]
				storeErrs += s[idemq.CountStoreErrors]
			}
			t.Logf("WAIT %d: primary %s -> %s; applied %d of %d; applied twice: %d published before the failover, %d after; duplicates suppressed %d; store errors %d; WAIT shortfalls %d",
				waitReplicas, before, after, len(seen), n, twiceBefore, twiceAfter, dups, storeErrs, st.WaitShortfalls())
			if len(seen) != n {
				t.Errorf("lost: %d of %d applied", len(seen), n)
			}
			if twiceAfter != 0 {
				t.Errorf("%d messages published after the failover were applied twice: the guard does not work on the new primary", twiceAfter)
			}
		})
	}
}
