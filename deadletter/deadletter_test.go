package deadletter_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/deadletter"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/topology"
)

func TestWorkQueue(t *testing.T) {
	for _, c := range []struct {
		dlq, want string
		ok        bool
	}{
		{"orders.dlq", "orders", true},
		{"a.b.dlq", "a.b", true},
		{".dlq", "", false},
		{"orders", "", false},
		{"orders.DLQ", "", false},
	} {
		if got, ok := deadletter.WorkQueue(c.dlq); got != c.want && ok || ok != c.ok {
			t.Errorf("WorkQueue(%q) = %q, %v; want %q, %v", c.dlq, got, ok, c.want, c.ok)
		}
	}
}

func TestReadKey(t *testing.T) {
	plain := deadletter.Read(1, &amqp.Delivery{MessageId: "m-1", Headers: amqp.Table{idemq.HeaderQueue: "orders"}}, false)
	copyOf := deadletter.Read(2, &amqp.Delivery{MessageId: "m-1", Headers: amqp.Table{idemq.HeaderQueue: "orders"}}, false)
	otherQueue := deadletter.Read(3, &amqp.Delivery{MessageId: "m-1", Headers: amqp.Table{idemq.HeaderQueue: "payments"}}, false)
	freshA := deadletter.Read(4, &amqp.Delivery{MessageId: "fresh-a", Headers: amqp.Table{idemq.HeaderQueue: "orders", idemq.HeaderOriginalMessageID: "bad\x01"}}, false)
	freshB := deadletter.Read(5, &amqp.Delivery{MessageId: "fresh-b", Headers: amqp.Table{idemq.HeaderQueue: "orders", idemq.HeaderOriginalMessageID: "bad\x01"}}, false)
	noID := deadletter.Read(6, &amqp.Delivery{}, false)
	broker := deadletter.Read(7, &amqp.Delivery{MessageId: "m-1", Headers: amqp.Table{idemq.HeaderDeath: []any{
		amqp.Table{"queue": "orders", "reason": "rejected", "exchange": "", "routing-keys": []any{"orders"}, "count": int64(1)},
	}}}, false)
	switch {
	case plain.Key() == "" || plain.Key() != copyOf.Key():
		t.Errorf("two copies, keys %q and %q", plain.Key(), copyOf.Key())
	case plain.Key() == otherQueue.Key():
		t.Errorf("one ID from two work queues collapsed")
	case freshA.Key() != freshB.Key():
		t.Errorf("dead letters with fresh IDs and one original ID: keys %q, %q", freshA.Key(), freshB.Key())
	case noID.Key() != "":
		t.Errorf("no ID, key %q", noID.Key())
	case broker.Key() != plain.Key() || broker.Queue != "orders" || broker.Reason != "broker:rejected":
		t.Errorf("broker dead letter %+v", broker)
	}
}

func TestRepublishStripsFailureHeaders(t *testing.T) {
	d := &amqp.Delivery{MessageId: "m-1", Body: []byte("b"), Headers: amqp.Table{
		"tenant": "acme", idemq.HeaderAttempt: int64(3), idemq.HeaderReason: "permanent",
		idemq.HeaderOriginalExchange: "evil", idemq.HeaderDeath: []any{}, idemq.HeaderDeliveryCount: int64(2),
		"x-first-death-queue": "q",
	}}
	m := deadletter.Republish(d, "", "orders", time.Unix(0, 0))
	if m.ID != "m-1" || m.Exchange != "" || m.RoutingKey != "orders" || m.Headers["tenant"] != "acme" || len(m.Headers) != 2 {
		t.Fatalf("republished %+v", m)
	}
	if _, ok := m.Headers[idemq.HeaderReplayedAt]; !ok {
		t.Fatal("no replayed-at header")
	}
}

// TestReplayCopiesOfAFailedDeadLetterStay: the copies of a dead letter
// that cannot be replayed stay with it (not retried, not dropped); a dry
// run counts the copies it would drop and changes nothing.
func TestReplayCopiesOfAFailedDeadLetterStay(t *testing.T) {
	testenv.RequireRealBroker(t, "deadletter.Open dials with amqp.Dial itself (it has no Dial option to point it at the fake)")
	url := testenv.RequireAMQP(t)
	q := topology.Queue{Name: testenv.Name(t, "q"), NoRetry: true}
	p := topology.ForQueue(q)
	t.Cleanup(func() { testenv.DeleteQueue(p.Queue, p.DLQ) })
	if err := topology.DeclareQueue(context.Background(), testenv.Channel(t), q); err != nil {
		t.Fatal(err)
	}
	dl := func(id, queue string) amqp.Publishing {
		return amqp.Publishing{MessageId: id, Body: []byte(id), Headers: amqp.Table{idemq.HeaderReason: idemq.ReasonPermanent, idemq.HeaderQueue: queue}}
	}
	testenv.Publish(t, "", p.DLQ, dl("a", p.Queue), dl("stray", "payments"), dl("a", p.Queue), dl("stray", "payments"))

	c, err := deadletter.Open(url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	dry, err := c.Replay(ctx, deadletter.ReplayOptions{DLQ: p.DLQ, DryRun: true})
	if !errors.Is(err, deadletter.ErrNotReplayed) || len(dry.Replayed) != 1 || len(dry.Duplicates) != 1 || len(dry.Failed) != 1 || dry.DuplicatesLeft != 1 {
		t.Fatalf("dry run: %+v, %v", dry, err)
	}
	c.Close()
	testenv.Eventually(t, 30*time.Second, "the dry run's messages back", func() bool { n, _ := testenv.QueueCounts(t, p.DLQ); return n == 4 })

	c, err = deadletter.Open(url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pub, err := idemq.NewPublisher(idemq.PublisherConfig{URL: url, Dial: testenv.Dial, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	res, err := c.Replay(ctx, deadletter.ReplayOptions{DLQ: p.DLQ, Publisher: pub})
	if !errors.Is(err, deadletter.ErrNotReplayed) || len(res.Replayed) != 1 || len(res.Duplicates) != 1 || len(res.Failed) != 1 || res.DuplicatesLeft != 1 {
		t.Fatalf("replay: %+v, %v", res, err)
	}
	c.Close()
	testenv.Eventually(t, 30*time.Second, "the strays back in the DLQ, a in the work queue", func() bool {
		n, _ := testenv.QueueCounts(t, p.DLQ)
		w, _ := testenv.QueueCounts(t, p.Queue)
		return n == 2 && w == 1
	})
	for _, d := range testenv.Drain(t, p.DLQ) {
		if d.MessageId != "stray" {
			t.Fatalf("left in the DLQ: %q", d.MessageId)
		}
	}
}
