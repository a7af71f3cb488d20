package retry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/retry"
	"github.com/idemq/idemq/topology"
)

// The policy outside the dedup guard: a delayed retry keeps the message ID,
// so the guard sees one message (released after the failure, claimed again
// on the retry, then done); a later duplicate is suppressed; a message
// without an ID is dead-lettered by the guard's Reject with reason missing-id.
func TestPolicyWithDedupGuard(t *testing.T) {
	q := topology.Queue{Name: testenv.Name(t, "q"), RetryDelays: []time.Duration{100 * time.Millisecond}}
	p := declare(t, q)
	store := dedup.NewMemory(dedup.MemoryConfig{})
	var c calls
	policy, err := retry.New(retry.ForTopology(q, retry.Config{Sender: publisher(t), QuickAttempts: 1}))
	if err != nil {
		t.Fatal(err)
	}
	guard, err := dedup.NewGuard(dedup.Config{Store: store, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	c0, err := idemq.NewConsumer(idemq.ConsumerConfig{
		URL: testenv.RequireAMQP(t), Dial: testenv.Dial, Queue: p.Queue, Logger: quiet(), AckBatch: 1,
		Pipeline: idemq.Pipeline{Policy: policy, Guard: guard,
			Handler: idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
				if c.add(d) == 1 {
					return errors.New("transient")
				}
				return nil
			})},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c0.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	<-c0.Ready()

	testenv.Publish(t, "", p.Queue, amqp.Publishing{MessageId: "g-1"}, amqp.Publishing{Body: []byte("no id")})
	dl := waitDLQ(t, p.DLQ, 1)[0]
	if hs(dl.Headers, idemq.HeaderReason) != idemq.ReasonMissingID {
		t.Fatalf("reason %q", hs(dl.Headers, idemq.HeaderReason))
	}
	testenv.Eventually(t, wait, "g-1 processed on its retry", func() bool { return c0.Counters().Get(idemq.CountProcessed) == 1 })
	testenv.Publish(t, "", p.Queue, amqp.Publishing{MessageId: "g-1"})
	testenv.Eventually(t, wait, "the duplicate suppressed", func() bool { return c0.Counters().Get(idemq.CountDuplicates) == 1 })
	if c.n() != 2 {
		t.Fatalf("handler ran %d times, want 2 (fail, then the retry)", c.n())
	}
	if a := retry.Attempt(c.dels[1].Headers); a != 2 || c.dels[1].MessageID != "g-1" {
		t.Fatalf("retry delivery: attempt %d id %q", a, c.dels[1].MessageID)
	}
}
