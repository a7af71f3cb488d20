package retry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/headerval"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/retry"
	"github.com/idemq/idemq/topology"
)

// A producer can set any header. x-idemq-* headers on a message that did
// not come through idemq's own retry path are dropped before the policy
// reads them: the dead letter's original route is the delivery's own (a
// forged x-idemq-original-exchange would steer `idemq dlq replay`), a forged
// x-idemq-attempt does not use up attempts, a forged first-failure time is
// not kept. The old policy kept all of them.
func TestForgedIdemqHeadersAreIgnored(t *testing.T) {
	forged := amqp.Table{
		idemq.HeaderOriginalExchange:   "amq.fanout",
		idemq.HeaderOriginalRoutingKey: "payments",
		idemq.HeaderAttempt:            int64(99),
		idemq.HeaderFirstFailure:       "1999-01-01T00:00:00Z",
		idemq.HeaderReason:             "forged",
		"x-idemq-anything":             "forged",
		"custom":                       "kept",
	}
	tests := []struct {
		name   string
		viaEx  bool   // published to a business exchange
		marker bool   // forged x-idemq-queue marker too
		wantRK string // "" means the queue name
	}{
		{"business exchange with marker", true, true, "order.created"},
		{"default exchange without marker", false, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := topology.Queue{Name: testenv.Name(t, "q"), RetryDelays: []time.Duration{100 * time.Millisecond}}
			p := declare(t, q)
			ex := ""
			key := p.Queue
			if tt.viaEx {
				ex = testenv.Name(t, "x")
				key = tt.wantRK
				ch := testenv.Channel(t)
				if err := ch.ExchangeDeclare(ex, "topic", false, true, false, false, nil); err != nil {
					t.Fatal(err)
				}
				if err := ch.QueueBind(p.Queue, "order.*", ex, false, nil); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = testenv.Channel(t).ExchangeDelete(ex, false, false) })
			}
			h := amqp.Table{}
			for k, v := range forged {
				h[k] = v
			}
			if tt.marker {
				h[idemq.HeaderQueue] = p.Queue
			}
			var c calls
			start := time.Now()
			consume(t, p.Queue, retry.ForTopology(q, retry.Config{Sender: publisher(t), QuickAttempts: 1}),
				func(ctx context.Context, d *idemq.Delivery) error {
					c.add(d)
					return errors.New("flaky")
				})
			testenv.Publish(t, ex, key, amqp.Publishing{MessageId: "forged-1", Headers: h})
			dl := waitDLQ(t, p.DLQ, 1)[0]
			wantRK := tt.wantRK
			if wantRK == "" {
				wantRK = p.Queue
			}
			if got := hs(dl.Headers, idemq.HeaderOriginalExchange); got != ex {
				t.Errorf("original exchange %q, want %q (the delivery's own)", got, ex)
			}
			if got := hs(dl.Headers, idemq.HeaderOriginalRoutingKey); got != wantRK {
				t.Errorf("original routing key %q, want %q", got, wantRK)
			}
			if c.n() != 2 {
				t.Errorf("handler ran %d times, want 2 (the forged attempt 99 must not count)", c.n())
			}
			if a := retry.Attempt(c.dels[0].Headers); a != 1 {
				t.Errorf("the handler saw attempt %d on the first delivery, want 1", a)
			}
			first, err := time.Parse(headerval.TimeFormat, hs(dl.Headers, idemq.HeaderFirstFailure))
			if err != nil || first.Before(start.Add(-time.Minute)) {
				t.Errorf("first failure %q kept from the producer", hs(dl.Headers, idemq.HeaderFirstFailure))
			}
			if hs(dl.Headers, idemq.HeaderReason) != idemq.ReasonMaxAttempts {
				t.Errorf("reason %q", hs(dl.Headers, idemq.HeaderReason))
			}
			if _, ok := dl.Headers["x-idemq-anything"]; ok {
				t.Errorf("forged x-idemq-anything kept")
			}
			if hs(dl.Headers, "custom") != "kept" {
				t.Errorf("the producer's own header was dropped: %v", dl.Headers)
			}
		})
	}
}

// A message published straight into a retry queue without a valid ID
// (not parked by idemq, whose retries keep theirs) is handed back when
// due and dead-lettered with its reason before any handler runs; the one
// with an ID next to it is handled as a retry. Nothing is dropped or
// left behind.
func TestReleasedWithoutValidIDIsDeadLettered(t *testing.T) {
	q := topology.Queue{Name: testenv.Name(t, "q"), RetryDelays: []time.Duration{200 * time.Millisecond}}
	p := declare(t, q)
	var c calls
	consume(t, p.Queue, retry.ForTopology(q, retry.Config{Sender: publisher(t), QuickAttempts: 1}),
		func(ctx context.Context, d *idemq.Delivery) error {
			c.add(d)
			return nil
		})
	retryQ := p.Retries[0].Name
	testenv.Publish(t, "", retryQ,
		amqp.Publishing{Body: []byte("no id")},
		amqp.Publishing{MessageId: "bad\x01id", Body: []byte("bad id")},
		amqp.Publishing{MessageId: "good-1", Body: []byte("good")})
	dls := waitDLQ(t, p.DLQ, 2)
	reasons := map[string]string{}
	for _, d := range dls {
		reasons[string(d.Body)] = hs(d.Headers, idemq.HeaderReason)
		if _, ok := d.Headers[idemq.HeaderDue]; ok {
			t.Errorf("dead letter %q still carries %s", d.Body, idemq.HeaderDue)
		}
	}
	if reasons["no id"] != idemq.ReasonMissingID || reasons["bad id"] != idemq.ReasonInvalidID {
		t.Fatalf("dead-letter reasons %v, want missing-id and invalid-id", reasons)
	}
	for _, d := range dls {
		if string(d.Body) == "bad id" && hs(d.Headers, idemq.HeaderOriginalMessageID) != "bad\x01id" {
			t.Errorf("invalid ID not kept: %v", d.Headers[idemq.HeaderOriginalMessageID])
		}
	}
	testenv.Eventually(t, 10*time.Second, "good-1 handled", func() bool { return c.n() == 1 })
	testenv.Eventually(t, 10*time.Second, "retry queue empty", func() bool { n, _ := testenv.QueueCounts(t, retryQ); return n == 0 })
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.dels) != 1 || c.dels[0].MessageID != "good-1" {
		t.Fatalf("handler ran %d times, want for good-1 only", len(c.dels))
	}
}
