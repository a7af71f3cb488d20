package e2etest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/internal/testenv"
)

// A publisher that resends (lost confirms) delivers each ID several times:
// the handler runs once per ID, every copy is acked, the extra copies are
// counted as duplicates.
func TestPublisherResendsRunOnce(t *testing.T) {
	testenv.RequireAMQP(t)
	for _, sk := range storeKinds {
		t.Run(sk.name, func(t *testing.T) {
			queue := testenv.Queue(t, nil)
			const ids, copies = 10, 3
			var all []string
			for c := 0; c < copies; c++ {
				for i := 0; i < ids; i++ {
					all = append(all, fmt.Sprintf("order-%d", i))
				}
			}
			publishIDs(t, queue, all...)
			tr := newTracker()
			c, _ := runConsumer(t, idemq.ConsumerConfig{
				Queue: queue, Workers: 4, Prefetch: 50,
				Pipeline: idemq.Pipeline{Guard: mustGuard(sk.new(t), dedup.Config{
					Logger: quiet(), InFlightRetryAfter: 100 * time.Millisecond,
				})},
			}, idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
				tr.add(d.MessageID)
				return nil
			}))
			cnt := c.Counters()
			testenv.Eventually(t, wait, "every copy acked", func() bool { return cnt.Get(idemq.CountAcked) == ids*copies })
			for id, n := range tr.snapshot() {
				if n != 1 {
					t.Errorf("%s handled %d times, want 1", id, n)
				}
			}
			if got := len(tr.snapshot()); got != ids {
				t.Errorf("%d IDs handled, want %d", got, ids)
			}
			if p, d := cnt.Get(idemq.CountProcessed), cnt.Get(idemq.CountDuplicates); p != ids || d != ids*(copies-1) {
				t.Errorf("processed %d duplicates %d, want %d and %d", p, d, ids, ids*(copies-1))
			}
			if ready, _ := testenv.QueueCounts(t, queue); ready != 0 {
				t.Errorf("%d messages left in the queue", ready)
			}
		})
	}
}

// naiveSETNX is the recipe copied from blogs: mark the ID seen, then
// process. Kept here only to show that it loses messages.
func naiveSETNX(rdb redis.UniversalClient, prefix string) idemq.Middleware {
	return func(next idemq.Handler) idemq.Handler {
		return idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
			first, err := rdb.SetNX(ctx, prefix+":naive:"+d.MessageID, 1, time.Hour).Result()
			if err != nil {
				return err
			}
			if !first {
				return nil // "duplicate": ack and skip
			}
			return next.Handle(ctx, d)
		})
	}
}

// A handler that fails once after the claim must see the message again and
// apply it. The failed delivery comes back the honest way: the consumer
// rejects it without requeue (what it does with a plain handler error when
// no retry policy is installed) and the queue's dead-letter exchange routes
// it back into the same queue — a stand-in for the retry package's delay
// queue, using only broker behaviour.
//
// The naive SETNX-first middleware, given the same failure, acks the
// redelivery as a "duplicate": the effect is never applied. The guard
// released its claim when the handler failed, so the redelivery runs.
func TestHandlerFailureAfterClaimIsRedelivered(t *testing.T) {
	testenv.RequireAMQP(t)
	const n = 5
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("pay-%d", i)
	}
	// failOnce returns the handler and the tracker of applied effects.
	failOnce := func() (idemq.Handler, *tracker, *tracker) {
		attempts, applied := newTracker(), newTracker()
		return idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
			if attempts.add(d.MessageID) == 1 {
				return errTransient
			}
			applied.add(d.MessageID)
			return nil
		}), attempts, applied
	}

	t.Run("naive-setnx-loses-the-message", func(t *testing.T) {
		queue := selfDeadLetteringQueue(t)
		rdb, prefix := testenv.Redis(t)
		h, attempts, applied := failOnce()
		publishIDs(t, queue, ids...)
		c, _ := runConsumer(t, idemq.ConsumerConfig{
			Queue: queue, Pipeline: idemq.Pipeline{Middleware: []idemq.Middleware{naiveSETNX(rdb, prefix)}},
		}, h)
		cnt := c.Counters()
		// Each message: rejected once (dead-lettered back), then acked.
		testenv.Eventually(t, wait, "the redeliveries to be acked", func() bool {
			return cnt.Get(idemq.CountRejected) == n && cnt.Get(idemq.CountAcked) == n
		})
		if ready, _ := testenv.QueueCounts(t, queue); ready != 0 {
			t.Fatalf("%d messages still queued", ready)
		}
		if attempts.total() != n || applied.total() != 0 {
			t.Fatalf("attempts %d applied %d; the naive recipe was expected to lose all %d", attempts.total(), applied.total(), n)
		}
		t.Logf("naive SETNX: %d of %d messages acked and never applied", n-applied.total(), n)
	})

	for _, sk := range storeKinds {
		t.Run("guard-"+sk.name, func(t *testing.T) {
			queue := selfDeadLetteringQueue(t)
			h, _, applied := failOnce()
			publishIDs(t, queue, ids...)
			c, _ := runConsumer(t, idemq.ConsumerConfig{
				Queue: queue, Pipeline: idemq.Pipeline{Guard: mustGuard(sk.new(t), dedup.Config{Logger: quiet()})},
			}, h)
			cnt := c.Counters()
			testenv.Eventually(t, wait, "every message applied", func() bool { return applied.total() == n })
			testenv.Eventually(t, wait, "every redelivery acked", func() bool { return cnt.Get(idemq.CountAcked) == n })
			for _, id := range ids {
				if got := applied.snapshot()[id]; got != 1 {
					t.Errorf("%s applied %d times, want 1", id, got)
				}
			}
			if r, p, d := cnt.Get(idemq.CountRejected), cnt.Get(idemq.CountProcessed), cnt.Get(idemq.CountDuplicates); r != n || p != n || d != 0 {
				t.Errorf("rejected %d processed %d duplicates %d, want %d, %d and 0", r, p, d, n, n)
			}
		})
	}
}

// Two consumers receive copies of one ID at the same time: one runs the
// handler; the other's claim finds a live lease, so its copy is deferred
// (requeued with a delay, not acked) and, once the first has completed,
// acked as a duplicate.
func TestConcurrentDeliveriesOfOneID(t *testing.T) {
	testenv.RequireAMQP(t)
	for _, sk := range storeKinds {
		t.Run(sk.name, func(t *testing.T) {
			queue := testenv.Queue(t, nil)
			publishIDs(t, queue, "same-1", "same-1")
			store := sk.new(t)
			var c1, c2 idemq.Counters
			inflight := func() int64 { return c1.Get(idemq.CountInFlight) + c2.Get(idemq.CountInFlight) }
			sum := func(name string) int64 { return c1.Get(name) + c2.Get(name) }
			runs := newTracker()
			h := idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
				runs.add(d.MessageID)
				// Hold the lease until the other consumer has seen it.
				deadline := time.Now().Add(wait)
				for inflight() == 0 {
					if time.Now().After(deadline) {
						return fmt.Errorf("the other copy was never deferred")
					}
					time.Sleep(10 * time.Millisecond)
				}
				return nil
			})
			for _, rec := range []*idemq.Counters{&c1, &c2} {
				runConsumer(t, idemq.ConsumerConfig{
					Queue: queue, Group: "g", Prefetch: 1, Workers: 1, Recorder: rec,
					Pipeline: idemq.Pipeline{Guard: mustGuard(store, dedup.Config{
						Logger: quiet(), InFlightRetryAfter: 200 * time.Millisecond,
					})},
				}, h)
			}
			testenv.Eventually(t, wait, "both copies acked", func() bool { return sum(idemq.CountAcked) == 2 })
			if n := runs.total(); n != 1 {
				t.Fatalf("handler ran %d times, want 1", n)
			}
			if inflight() < 1 || sum(idemq.CountRequeued) < 1 {
				t.Fatalf("in-flight deferrals %d, requeues %d; want at least 1 each", inflight(), sum(idemq.CountRequeued))
			}
			if p, d := sum(idemq.CountProcessed), sum(idemq.CountDuplicates); p != 1 || d != 1 {
				t.Fatalf("processed %d duplicates %d, want 1 and 1", p, d)
			}
		})
	}
}

// The Redis store dies. Fail-closed: the handler does not run and the
// delivery is not acked; it keeps coming back (with a delay) and is
// processed once Redis is back. Fail-open: the handler runs unguarded.
func TestStoreUnavailable(t *testing.T) {
	testenv.RequireAMQP(t)
	t.Run("fail-closed", func(t *testing.T) {
		r := testenv.StartPrivateRedis(t, false)
		rdb := r.Client()
		t.Cleanup(func() { rdb.Close() })
		store, err := redisstore.New(rdb, redisstore.Config{})
		if err != nil {
			t.Fatal(err)
		}
		r.Kill()

		queue := testenv.Queue(t, nil)
		publishIDs(t, queue, "job-1")
		runs := newTracker()
		c, _ := runConsumer(t, idemq.ConsumerConfig{
			Queue: queue,
			Pipeline: idemq.Pipeline{Guard: mustGuard(store, dedup.Config{
				Logger: quiet(), StoreRetryAfter: 200 * time.Millisecond,
			})},
		}, idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
			runs.add(d.MessageID)
			return nil
		}))
		cnt := c.Counters()
		// The guard's probe (idemq.Prober) joins the breaker: the first
		// store error pauses the consumer, the delivery goes back, and the
		// probe — not a trial delivery — watches the store.
		testenv.Eventually(t, wait, "the consumer paused for the store, the delivery given back", func() bool {
			return cnt.Get(idemq.CountStoreErrors) >= 1 && cnt.Get(idemq.CountRequeued) >= 1 &&
				cnt.Get(idemq.CountDependencyOutages) >= 1 && c.Paused()
		})
		if runs.total() != 0 || cnt.Get(idemq.CountAcked) != 0 || cnt.Get(idemq.CountRejected) != 0 {
			t.Fatalf("store down: runs %d acked %d rejected %d, want 0 0 0", runs.total(), cnt.Get(idemq.CountAcked), cnt.Get(idemq.CountRejected))
		}

		r.Start()
		testenv.Eventually(t, wait, "the message processed after Redis came back", func() bool {
			return cnt.Get(idemq.CountAcked) == 1
		})
		if runs.total() != 1 {
			t.Fatalf("handler ran %d times, want 1", runs.total())
		}
		rec, ok, err := store.Get(context.Background(), dedup.Key("idemq", queue, "job-1"))
		if err != nil || !ok || rec.State != dedup.StateDone {
			t.Fatalf("record %+v ok=%v err=%v, want done", rec, ok, err)
		}
	})

	t.Run("fail-open", func(t *testing.T) {
		r := testenv.StartPrivateRedis(t, false)
		rdb := r.Client()
		t.Cleanup(func() { rdb.Close() })
		store, err := redisstore.New(rdb, redisstore.Config{})
		if err != nil {
			t.Fatal(err)
		}
		r.Kill()

		queue := testenv.Queue(t, nil)
		publishIDs(t, queue, "job-1")
		runs := newTracker()
		c, _ := runConsumer(t, idemq.ConsumerConfig{
			Queue:    queue,
			Pipeline: idemq.Pipeline{Guard: mustGuard(store, dedup.Config{Logger: quiet(), FailOpen: true})},
		}, idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
			runs.add(d.MessageID)
			return nil
		}))
		cnt := c.Counters()
		testenv.Eventually(t, wait, "the message processed unguarded", func() bool { return cnt.Get(idemq.CountAcked) == 1 })
		if runs.total() != 1 || cnt.Get(idemq.CountFailOpen) != 1 || cnt.Get(idemq.CountStoreErrors) != 1 {
			t.Fatalf("runs %d fail_open %d store_errors %d, want 1 1 1", runs.total(), cnt.Get(idemq.CountFailOpen), cnt.Get(idemq.CountStoreErrors))
		}
	})
}
