package retry_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/retry"
	"github.com/idemq/idemq/topology"
)

// loopWindow is how long a test waits for the outcome of a republish that
// cannot succeed. With PublishRetryAfter 50ms the old code ran the handler
// dozens of times in it.
const loopWindow = 10 * time.Second

// settle waits until cond holds and fails with the number of handler runs
// when it does not: a delivery that loops shows up as many runs and no
// outcome.
func settle(t *testing.T, c *calls, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(loopWindow)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no outcome after %v waiting for %s: the handler ran %d times (a republish loop)", loopWindow, what, c.n())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A delivery without a message ID (its ID came from a header or an
// extractor, or it has none) cannot be republished to a retry queue under
// its own ID. The old policy returned Requeue(PublishRetryAfter) and the
// handler ran again and again; now the failure is dead-lettered at once
// (a fresh ID, reason missing-id), never looped.
func TestRetryWithoutMessageIDIsDeadLetteredNotLooped(t *testing.T) {
	p := declare(t, topology.Queue{RetryDelays: []time.Duration{100 * time.Millisecond}})
	var c calls
	cons := consume(t, p.Queue, retry.Config{Sender: publisher(t), Delays: p.Delays, QuickAttempts: 1,
		PublishRetryAfter: 50 * time.Millisecond},
		func(ctx context.Context, d *idemq.Delivery) error {
			c.add(d)
			return errors.New("database is down")
		})
	testenv.Publish(t, "", p.Queue, amqp.Publishing{Body: []byte("no id"), Headers: amqp.Table{"order-id": "o-7"}})
	var dls []amqp.Delivery
	settle(t, &c, "the dead letter", func() bool {
		dls = append(dls, testenv.Drain(t, p.DLQ)...)
		return len(dls) == 1
	})
	dl := dls[0]
	if got := hs(dl.Headers, idemq.HeaderReason); got != idemq.ReasonMissingID {
		t.Fatalf("reason %q, want %q", got, idemq.ReasonMissingID)
	}
	if !strings.Contains(hs(dl.Headers, idemq.HeaderError), "database is down") {
		t.Fatalf("error text %q lost the handler's error", hs(dl.Headers, idemq.HeaderError))
	}
	if idemq.ValidateID(dl.MessageId) != nil || string(dl.Body) != "no id" || hs(dl.Headers, "order-id") != "o-7" {
		t.Fatalf("dead letter id %q body %q headers %v", dl.MessageId, dl.Body, dl.Headers)
	}
	testenv.Eventually(t, wait, "work queue empty", func() bool { n, _ := testenv.QueueCounts(t, p.Queue); return n == 0 })
	if c.n() != 1 {
		t.Fatalf("handler ran %d times, want 1", c.n())
	}
	if n := cons.Counters().Get(idemq.CountRequeued); n != 0 {
		t.Fatalf("%d requeues", n)
	}
}

// `dlq: "-"` in the topology means no dead-letter queue. The old policy
// still published to "<queue>.dlq", got it back as unroutable, and
// requeued the delivery every PublishRetryAfter for ever; now the policy
// rejects it to the broker (no dead-letter exchange: the broker drops it),
// logs and counts it.
func TestNoDLQTopologyRejectsInsteadOfLooping(t *testing.T) {
	tests := []struct {
		name  string
		q     topology.Queue
		err   error
		calls int
	}{
		{"permanent", topology.Queue{DLQ: "-", NoRetry: true}, idemq.Permanent(errors.New("card declined")), 1},
		{"max attempts", topology.Queue{DLQ: "-", RetryDelays: []time.Duration{100 * time.Millisecond}}, errors.New("flaky"), 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := tt.q
			q.Name = testenv.Name(t, "q")
			p := declare(t, q)
			if p.DLQ != "" {
				t.Fatalf("plan has DLQ %q", p.DLQ)
			}
			var c calls
			cons := consume(t, p.Queue, retry.ForTopology(q, retry.Config{Sender: publisher(t), QuickAttempts: 1,
				PublishRetryAfter: 50 * time.Millisecond}),
				func(ctx context.Context, d *idemq.Delivery) error {
					c.add(d)
					return tt.err
				})
			testenv.Publish(t, "", p.Queue, amqp.Publishing{MessageId: "nodlq-1"})
			settle(t, &c, "the rejection", func() bool { return cons.Counters().Get(idemq.CountRejected) == 1 })
			testenv.Eventually(t, wait, "work queue empty", func() bool { n, _ := testenv.QueueCounts(t, p.Queue); return n == 0 })
			if c.n() != tt.calls {
				t.Fatalf("handler ran %d times, want %d", c.n(), tt.calls)
			}
			if n := cons.Counters().Get(retry.CountNoDeadLetterQueue); n != 1 {
				t.Fatalf("%s = %d, want 1", retry.CountNoDeadLetterQueue, n)
			}
		})
	}
}

// A dead-letter queue that is deleted (the topology says it exists), or
// unavailable (a classic DLQ whose node is down), makes the dead letter
// unroutable. The policy used to reject the delivery to the broker, whose
// dead-letter route leads to the same queue, so the message was dropped.
// Now it is held back — through a retry queue, or the work queue itself
// when that is gone too — and dead-lettered as soon as the queue is back,
// without running the handler again.
func TestUnroutableDLQHoldsTheDeadLetter(t *testing.T) {
	tests := []struct {
		name        string
		deleteRetry bool
		err         error
		reason      string
	}{
		{"permanent", false, idemq.Permanent(errors.New("bad")), idemq.ReasonPermanent},
		{"retry queue and DLQ gone", true, errors.New("flaky"), idemq.ReasonHandlerError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := declare(t, topology.Queue{RetryDelays: []time.Duration{100 * time.Millisecond}})
			testenv.DeleteQueue(p.DLQ)
			if tt.deleteRetry {
				testenv.DeleteQueue(p.Retries[0].Name)
			}
			var c calls
			cons := consume(t, p.Queue, retry.Config{Sender: publisher(t), Delays: p.Delays, QuickAttempts: 1,
				PublishRetryAfter: 50 * time.Millisecond},
				func(ctx context.Context, d *idemq.Delivery) error {
					c.add(d)
					return tt.err
				})
			testenv.Publish(t, "", p.Queue, amqp.Publishing{MessageId: "gone-1"})
			settle(t, &c, "several holds", func() bool { return cons.Counters().Get(retry.CountDeadLetterHeld) >= 4 })
			if n := cons.Counters().Get(idemq.CountRejected); n != 0 {
				t.Fatalf("%d rejected: the broker would drop it", n)
			}
			if _, err := testenv.Channel(t).QueueDeclare(p.DLQ, true, false, false, false, p.DLQArgs); err != nil {
				t.Fatal(err)
			}
			dl := waitDLQ(t, p.DLQ, 1)[0]
			if dl.MessageId != "gone-1" || hs(dl.Headers, idemq.HeaderReason) != tt.reason ||
				!strings.Contains(hs(dl.Headers, idemq.HeaderError), tt.err.Error()) {
				t.Fatalf("dead letter %q reason %q error %q", dl.MessageId, hs(dl.Headers, idemq.HeaderReason), hs(dl.Headers, idemq.HeaderError))
			}
			if _, marked := dl.Headers[idemq.HeaderDeadLetterHeld]; marked {
				t.Fatalf("dead letter still marked held: %v", dl.Headers)
			}
			testenv.Eventually(t, wait, "work queue empty", func() bool { n, _ := testenv.QueueCounts(t, p.Queue); return n == 0 })
			if c.n() != 1 {
				t.Fatalf("handler ran %d times, want 1 (a held dead letter does not run again)", c.n())
			}
			if n := cons.Counters().Get(idemq.CountDeadLettered); n != 1 {
				t.Fatalf("%s = %d, want 1", idemq.CountDeadLettered, n)
			}
		})
	}
}

// A dead letter whose publish fails for a reason that passes (the broker
// connection is down) is not acked and not rejected: the delivery stays and
// is dead-lettered once the publisher gets through.
func TestDeadLetterTransientPublishFailureKeepsTheDelivery(t *testing.T) {
	p := declare(t, topology.Queue{NoRetry: true})
	proxy, url := testenv.AMQPProxy(t)
	pub, err := idemq.NewPublisher(idemq.PublisherConfig{URL: url, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	proxy.Pause()
	var c calls
	cons := consume(t, p.Queue, retry.Config{Sender: pub, Delays: []time.Duration{}, PublishRetryAfter: 50 * time.Millisecond,
		PublishTimeout: 200 * time.Millisecond},
		func(ctx context.Context, d *idemq.Delivery) error {
			c.add(d)
			return idemq.Permanent(errors.New("bad"))
		})
	testenv.Publish(t, "", p.Queue, amqp.Publishing{MessageId: "keep-1"})
	testenv.Eventually(t, wait, "several failed dead-letter attempts", func() bool { return c.n() >= 3 })
	proxy.Resume()
	dl := waitDLQ(t, p.DLQ, 1)[0]
	if dl.MessageId != "keep-1" || hs(dl.Headers, idemq.HeaderReason) != idemq.ReasonPermanent {
		t.Fatalf("dead letter %q reason %q", dl.MessageId, hs(dl.Headers, idemq.HeaderReason))
	}
	testenv.Eventually(t, wait, "work queue empty", func() bool {
		n, _ := testenv.QueueCounts(t, p.Queue)
		return n == 0
	})
	if n := cons.Counters().Get(idemq.CountRejected); n != 0 {
		t.Fatalf("%d rejected: a passing publish failure must not reject", n)
	}
}

// A handler error of hundreds of KiB with a generous ErrorTextLimit used to
// make the dead letter's header frame larger than the broker's frame_max:
// the broker closed the publisher's connection, every publish attempt
// failed the same way and the delivery came back for ever. The error text
// is now capped at MaxErrorTextLimit whatever the configuration says.
func TestHugeErrorTextIsDeadLetteredNotLooped(t *testing.T) {
	p := declare(t, topology.Queue{NoRetry: true})
	var c calls
	consume(t, p.Queue, retry.Config{Sender: publisher(t), Delays: []time.Duration{}, ErrorTextLimit: 1 << 20,
		PublishTimeout: 2 * time.Second, PublishRetryAfter: 50 * time.Millisecond},
		func(ctx context.Context, d *idemq.Delivery) error {
			c.add(d)
			return idemq.Permanent(errors.New(strings.Repeat("stack frame ", 30_000)))
		})
	testenv.Publish(t, "", p.Queue, amqp.Publishing{MessageId: "huge-1"})
	var dls []amqp.Delivery
	settle(t, &c, "the dead letter", func() bool {
		dls = append(dls, testenv.Drain(t, p.DLQ)...)
		return len(dls) == 1
	})
	e := hs(dls[0].Headers, idemq.HeaderError)
	if len(e) > retry.MaxErrorTextLimit || !strings.HasPrefix(e, "permanent: stack frame") {
		t.Fatalf("error header %d bytes: %.80q", len(e), e)
	}
	if c.n() != 1 {
		t.Fatalf("handler ran %d times", c.n())
	}
}
