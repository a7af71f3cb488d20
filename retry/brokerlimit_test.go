package retry_test

import (
	"context"
	"errors"
	"regexp"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/retry"
	"github.com/idemq/idemq/topology"
)

// A policy's delivery-limit (4) below the declared x-delivery-limit (the
// topology's default, 20) is invisible over AMQP. Without a management URL
// the policy requeues in place up to half of 20 and the broker
// dead-letters the message at its 4th requeue, before the handler could
// ever run it; with one, the consumer reads 4 and the policy republishes
// from x-delivery-count 2 on: the message is applied once, nothing is
// dead-lettered. The first sub-test shows the second can fail.
func TestRequeueInPlaceStaysBelowAPolicyDeliveryLimit(t *testing.T) {
	mu := testenv.RequireManagement(t)
	const policyLimit = 4
	const deferrals = 2 * policyLimit // each a requeue in place
	for _, withMgmt := range []bool{false, true} {
		name := "without management URL: the broker dead-letters it"
		if withMgmt {
			name = "with management URL: applied once"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			q := topology.Queue{Name: testenv.Name(t, "q"), Type: topology.Quorum, RetryDelays: []time.Duration{100 * time.Millisecond}}
			testenv.SetPolicy(t, false, q.Name+"-dl", "^"+regexp.QuoteMeta(q.Name)+"$", `{"delivery-limit":4}`, 100)
			p := declare(t, q)
			if p.DeliveryLimit <= policyLimit {
				t.Fatalf("declared x-delivery-limit %d: the test needs one above the policy's %d", p.DeliveryLimit, policyLimit)
			}
			policy, err := retry.New(retry.ForTopology(q, retry.Config{Sender: publisher(t)}))
			if err != nil {
				t.Fatal(err)
			}
			var c calls
			var applied, sawLimit atomic.Int64
			cfg := idemq.ConsumerConfig{
				URL: testenv.RequireAMQP(t), Dial: testenv.Dial, Queue: p.Queue, Group: "g1", Logger: quiet(), AckBatch: 1,
				Pipeline: idemq.Pipeline{Policy: policy, Handler: idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
					sawLimit.Store(int64(d.QueueDeliveryLimit))
					if c.add(d) <= deferrals {
						return idemq.RequeueInPlace(10*time.Millisecond, "in-flight", errors.New("another consumer holds the lease"))
					}
					applied.Add(1)
					return nil
				})},
			}
			if withMgmt {
				cfg.ManagementURL = mu
			}
			cons, err := idemq.NewConsumer(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			stopped := make(chan error, 1)
			go func() { stopped <- cons.Run(ctx) }()
			t.Cleanup(func() { cancel(); <-stopped })
			select {
			case <-cons.Ready():
			case err := <-stopped:
				t.Fatalf("consumer did not start: %v", err)
			case <-time.After(wait):
				t.Fatal("consumer not ready")
			}
			testenv.Publish(t, "", p.Queue, amqp.Publishing{MessageId: "policy-limit-1"})

			if !withMgmt {
				dl := waitDLQ(t, p.DLQ, 1)[0]
				deaths := retry.ParseXDeath(dl.Headers[idemq.HeaderDeath])
				if len(deaths) == 0 || deaths[0].Reason != "delivery_limit" {
					t.Fatalf("dead letter's x-death %+v, want reason delivery_limit", deaths)
				}
				if applied.Load() != 0 || c.n() != policyLimit+1 {
					t.Fatalf("applied %d times in %d calls; want 0 in %d (the broker's limit ended it)", applied.Load(), c.n(), policyLimit+1)
				}
				return
			}
			testenv.Eventually(t, wait, "the message applied", func() bool { return applied.Load() > 0 })
			testenv.Eventually(t, wait, "the work queue empty", func() bool {
				n, _ := testenv.QueueCounts(t, p.Queue)
				return n == 0
			})
			if got := sawLimit.Load(); got != policyLimit {
				t.Fatalf("Delivery.QueueDeliveryLimit = %d, want the policy's %d", got, policyLimit)
			}
			if n := applied.Load(); n != 1 {
				t.Fatalf("applied %d times, want once", n)
			}
			if n, _ := testenv.QueueCounts(t, p.DLQ); n != 0 {
				t.Fatalf("%d dead letters, want none", n)
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			republished := 0
			for i, d := range c.dels {
				n, _ := retry.DeliveryCount(d.Headers)
				if n >= policyLimit/2+1 {
					t.Fatalf("call %d saw x-delivery-count %d: in-place requeues went past half the policy's limit %d", i+1, n, policyLimit)
				}
				if _, ok := d.Headers[idemq.HeaderRequeues]; ok {
					republished++
				}
			}
			if republished == 0 {
				t.Fatal("never republished")
			}
		})
	}
}
