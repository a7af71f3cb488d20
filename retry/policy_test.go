package retry_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/headerval"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/retry"
	"github.com/idemq/idemq/topology"
)

const wait = 45 * time.Second

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// declare creates q (named for the test) with its DLQ and retry queues,
// deleted at cleanup.
func declare(t *testing.T, q topology.Queue) topology.Plan {
	t.Helper()
	if q.Name == "" {
		q.Name = testenv.Name(t, "q")
	}
	p := topology.ForQueue(q)
	t.Cleanup(func() {
		names := []string{p.Queue, p.DLQ}
		for _, r := range p.Retries {
			names = append(names, r.Name)
		}
		testenv.DeleteQueue(names...)
	})
	if err := topology.DeclareQueue(context.Background(), testenv.Channel(t), q); err != nil {
		t.Fatal(err)
	}
	return p
}

func publisher(t *testing.T) *idemq.Publisher {
	t.Helper()
	p, err := idemq.NewPublisher(idemq.PublisherConfig{URL: testenv.RequireAMQP(t), Dial: testenv.Dial, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func consume(t *testing.T, queue string, cfg retry.Config, h idemq.HandlerFunc) *idemq.Consumer {
	t.Helper()
	policy, err := retry.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c, err := idemq.NewConsumer(idemq.ConsumerConfig{
		URL: testenv.RequireAMQP(t), Dial: testenv.Dial, Queue: queue, Group: "g1", Logger: quiet(), AckBatch: 1,
		Pipeline: idemq.Pipeline{Policy: policy, Handler: h},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-c.Ready():
	case <-time.After(wait):
		t.Fatal("consumer not ready")
	}
	return c
}

// calls records handler invocations.
type calls struct {
	mu    sync.Mutex
	times []time.Time
	dels  []*idemq.Delivery
}

func (c *calls) add(d *idemq.Delivery) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.times = append(c.times, time.Now())
	c.dels = append(c.dels, d)
	return len(c.times)
}

func (c *calls) n() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.times)
}

// waitDLQ waits for n dead letters and returns them (acked).
func waitDLQ(t *testing.T, dlq string, n int) []amqp.Delivery {
	t.Helper()
	var got []amqp.Delivery
	testenv.Eventually(t, wait, "dead letters in "+dlq, func() bool {
		got = append(got, testenv.Drain(t, dlq)...)
		return len(got) >= n
	})
	return got
}

func hs(h amqp.Table, k string) string {
	switch v := h[k].(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return ""
}

func hi(t *testing.T, h amqp.Table, k string) int64 {
	t.Helper()
	n, ok := headerval.Count(h[k])
	if !ok {
		t.Fatalf("header %s = %#v, want a number", k, h[k])
	}
	return n
}

func TestRetryThenSucceed(t *testing.T) {
	p := declare(t, topology.Queue{RetryDelays: []time.Duration{100 * time.Millisecond, 300 * time.Millisecond}})
	var c calls
	done := make(chan *idemq.Delivery, 1)
	consume(t, p.Queue, retry.ForTopology(topology.Queue{Name: p.Queue, RetryDelays: p.Delays},
		retry.Config{Sender: publisher(t), QuickAttempts: 2}),
		func(ctx context.Context, d *idemq.Delivery) error {
			if c.add(d) <= 3 {
				return errors.New("blip")
			}
			done <- d
			return nil
		})
	testenv.Publish(t, "", p.Queue, amqp.Publishing{MessageId: "order-1", Body: []byte("b"), Headers: amqp.Table{"custom": "kept"}})
	var d *idemq.Delivery
	select {
	case d = <-done:
	case <-time.After(wait):
		t.Fatalf("not processed; %d calls", c.n())
	}
	// calls 1,2: attempt 1 (quick retry); 3,4: attempt 2 after the 100ms delay.
	if got := retry.Attempt(d.Headers); got != 2 {
		t.Fatalf("succeeded on attempt %d, want 2", got)
	}
	if d.MessageID != "order-1" || string(d.Body) != "b" || hs(d.Headers, "custom") != "kept" {
		t.Fatalf("message changed on retry: %+v", d)
	}
	gap := c.times[2].Sub(c.times[1])
	t.Logf("delayed retry gap: %v (delay 100ms)", gap)
	if gap < 100*time.Millisecond {
		t.Fatalf("retried after %v, before the 100ms delay", gap)
	}
	if n, _ := testenv.QueueCounts(t, p.DLQ); n != 0 {
		t.Fatalf("%d dead letters", n)
	}
	testenv.Eventually(t, wait, "work queue empty", func() bool { n, _ := testenv.QueueCounts(t, p.Queue); return n == 0 })
	if c.n() != 4 {
		t.Fatalf("%d handler calls, want 4", c.n())
	}
}

func TestRetryUntilDeadLetter(t *testing.T) {
	delays := []time.Duration{100 * time.Millisecond, 300 * time.Millisecond}
	q := topology.Queue{Name: testenv.Name(t, "q"), RetryDelays: delays}
	p := declare(t, q)
	var c calls
	cons := consume(t, p.Queue, retry.ForTopology(q, retry.Config{Sender: publisher(t), QuickAttempts: 1}),
		func(ctx context.Context, d *idemq.Delivery) error {
			c.add(d)
			return errors.New("database is down")
		})
	testenv.Publish(t, "", p.Queue, amqp.Publishing{MessageId: "order-2", Body: []byte("body"), ContentType: "text/plain",
		Headers: amqp.Table{"custom": "kept"}})
	dl := waitDLQ(t, p.DLQ, 1)[0]
	if c.n() != 3 {
		t.Fatalf("%d attempts, want 3 (MaxAttempts = len(Delays)+1)", c.n())
	}
	for i, want := range delays {
		gap := c.times[i+1].Sub(c.times[i])
		t.Logf("attempt %d -> %d: %v (delay %v)", i+1, i+2, gap, want)
		if gap < want {
			t.Fatalf("attempt %d came after %v, before its %v delay", i+2, gap, want)
		}
	}
	h := dl.Headers
	checks := map[string]string{
		idemq.HeaderReason: idemq.ReasonMaxAttempts, idemq.HeaderErrorClass: idemq.ReasonHandlerError,
		idemq.HeaderError: "database is down", idemq.HeaderOriginalExchange: "", idemq.HeaderOriginalRoutingKey: p.Queue,
		idemq.HeaderGroup: "g1", idemq.HeaderQueue: p.Queue, "custom": "kept",
	}
	for k, want := range checks {
		if got := hs(h, k); got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}
	if n := hi(t, h, idemq.HeaderAttempts); n != 3 {
		t.Errorf("attempts header %d, want 3", n)
	}
	first, err1 := time.Parse(headerval.TimeFormat, hs(h, idemq.HeaderFirstFailure))
	last, err2 := time.Parse(headerval.TimeFormat, hs(h, idemq.HeaderLastFailure))
	if err1 != nil || err2 != nil || last.Sub(first) < 400*time.Millisecond {
		t.Errorf("first/last failure %v / %v (%v %v), want >= 400ms apart", first, last, err1, err2)
	}
	if dl.MessageId != "order-2" || string(dl.Body) != "body" || dl.ContentType != "text/plain" {
		t.Errorf("dead letter changed the message: id %q body %q type %q", dl.MessageId, dl.Body, dl.ContentType)
	}
	if _, ok := h[idemq.HeaderAttempt]; ok {
		t.Errorf("dead letter still carries %s", idemq.HeaderAttempt)
	}
	// The consumer released the retries (no TTL, no broker dead-lettering
	// on the default retry queues): no x-death, no due time left.
	if deaths := retry.ParseXDeath(h[idemq.HeaderDeath]); len(deaths) != 0 {
		t.Errorf("x-death %v: the retries went through the broker's dead-letter path", deaths)
	}
	if v, ok := h[idemq.HeaderDue]; ok {
		t.Errorf("dead letter still carries %s = %v", idemq.HeaderDue, v)
	}
	testenv.Eventually(t, wait, "work queue empty", func() bool { n, _ := testenv.QueueCounts(t, p.Queue); return n == 0 })
	testenv.Eventually(t, wait, "counters", func() bool {
		cs := cons.Counters()
		return cs.Get(idemq.CountRetried) == 2 && cs.Get(idemq.CountDeadLettered) == 1 && cs.Get(idemq.CountAcked) == 3
	})
	if n := cons.Counters().Get(idemq.CountRejected); n != 0 {
		t.Fatalf("%d rejected: the policy must take every failure", n)
	}
}

// Delays that have no retry queue cannot wait: the delivery is dead-lettered
// with reason handler-error rather than requeued in a loop.
func TestMissingRetryQueueDeadLettersAsHandlerError(t *testing.T) {
	p := declare(t, topology.Queue{RetryDelays: []time.Duration{100 * time.Millisecond}})
	var c calls
	consume(t, p.Queue, retry.Config{Sender: publisher(t), Delays: []time.Duration{250 * time.Millisecond}, QuickAttempts: 1},
		func(ctx context.Context, d *idemq.Delivery) error {
			c.add(d)
			return errors.New("flaky")
		})
	testenv.Publish(t, "", p.Queue, amqp.Publishing{MessageId: "he-1"})
	dl := waitDLQ(t, p.DLQ, 1)[0]
	if got := hs(dl.Headers, idemq.HeaderReason); got != idemq.ReasonHandlerError {
		t.Fatalf("reason %q, want %q", got, idemq.ReasonHandlerError)
	}
	if !strings.Contains(hs(dl.Headers, idemq.HeaderError), "retry queue") {
		t.Fatalf("error text %q does not explain", hs(dl.Headers, idemq.HeaderError))
	}
	if c.n() != 1 {
		t.Fatalf("%d calls", c.n())
	}
}

func TestErrorTextIsBounded(t *testing.T) {
	p := declare(t, topology.Queue{NoRetry: true})
	consume(t, p.Queue, retry.Config{Sender: publisher(t), Delays: []time.Duration{}, ErrorTextLimit: 64},
		func(ctx context.Context, d *idemq.Delivery) error {
			return idemq.Permanent(errors.New(strings.Repeat("é", 1000)))
		})
	testenv.Publish(t, "", p.Queue, amqp.Publishing{MessageId: "long-1"})
	dl := waitDLQ(t, p.DLQ, 1)[0]
	if e := hs(dl.Headers, idemq.HeaderError); len(e) > 64 || len(e) < 60 || !utf8.ValidString(e) {
		t.Fatalf("error header %d bytes: %q", len(e), e)
	}
}

func TestDeadLetterReasons(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		reason string
		noID   bool
	}{
		{"permanent", idemq.Permanent(errors.New("card declined")), idemq.ReasonPermanent, false},
		{"missing-id", idemq.Reject(idemq.ReasonMissingID, idemq.ErrMissingMessageID), idemq.ReasonMissingID, true},
		{"invalid-id", idemq.Reject(idemq.ReasonInvalidID, idemq.ErrInvalidMessageID), idemq.ReasonInvalidID, false},
		{"unparseable", idemq.Reject(idemq.ReasonUnparseable, errors.New("json: unexpected end")), idemq.ReasonUnparseable, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := declare(t, topology.Queue{RetryDelays: []time.Duration{100 * time.Millisecond}})
			var c calls
			consume(t, p.Queue, retry.Config{Sender: publisher(t), Delays: p.Delays}, func(ctx context.Context, d *idemq.Delivery) error {
				c.add(d)
				return tt.err
			})
			id := "m-" + tt.name
			if tt.noID {
				id = ""
			}
			testenv.Publish(t, "", p.Queue, amqp.Publishing{MessageId: id, Body: []byte(tt.name)})
			dl := waitDLQ(t, p.DLQ, 1)[0]
			if got := hs(dl.Headers, idemq.HeaderReason); got != tt.reason {
				t.Fatalf("reason %q, want %q", got, tt.reason)
			}
			if c.n() != 1 {
				t.Fatalf("handler ran %d times; a permanent failure is never retried", c.n())
			}
			if hi(t, dl.Headers, idemq.HeaderAttempts) != 1 {
				t.Fatalf("attempts %v", dl.Headers[idemq.HeaderAttempts])
			}
			if tt.noID {
				if idemq.ValidateID(dl.MessageId) != nil {
					t.Fatalf("dead letter of an ID-less message has ID %q", dl.MessageId)
				}
			} else if dl.MessageId != id {
				t.Fatalf("ID %q, want %q", dl.MessageId, id)
			}
			if string(dl.Body) != tt.name {
				t.Fatalf("body %q", dl.Body)
			}
		})
	}
}

func TestPanicIsRetriedThenDeadLettered(t *testing.T) {
	p := declare(t, topology.Queue{RetryDelays: []time.Duration{100 * time.Millisecond}})
	var c calls
	consume(t, p.Queue, retry.Config{Sender: publisher(t), Delays: p.Delays, QuickAttempts: 1},
		func(ctx context.Context, d *idemq.Delivery) error {
			c.add(d)
			panic("nil map")
		})
	testenv.Publish(t, "", p.Queue, amqp.Publishing{MessageId: "p-1"})
	dl := waitDLQ(t, p.DLQ, 1)[0]
	if hs(dl.Headers, idemq.HeaderReason) != idemq.ReasonMaxAttempts || hs(dl.Headers, idemq.HeaderErrorClass) != idemq.ReasonPanic {
		t.Fatalf("reason %q class %q", hs(dl.Headers, idemq.HeaderReason), hs(dl.Headers, idemq.HeaderErrorClass))
	}
	if c.n() != 2 {
		t.Fatalf("%d calls, want 2", c.n())
	}
}

func TestDeliveryLimitQuorum(t *testing.T) {
	q := topology.Queue{Name: testenv.Name(t, "q"), Type: topology.Quorum, DeliveryLimit: 3,
		RetryDelays: []time.Duration{100 * time.Millisecond}}
	p := declare(t, q)
	testenv.Publish(t, "", p.Queue, amqp.Publishing{MessageId: "poison-1", Body: []byte("crash me")})
	// Three consumers "crash" holding it: the broker counts the returns.
	ch := testenv.Channel(t)
	for i := 0; i < 3; i++ {
		var d amqp.Delivery
		testenv.Eventually(t, wait, "message back in the queue", func() bool {
			var ok bool
			var err error
			d, ok, err = ch.Get(p.Queue, false)
			if err != nil {
				t.Fatal(err)
			}
			return ok
		})
		if err := d.Nack(false, true); err != nil {
			t.Fatal(err)
		}
	}
	var c calls
	consume(t, p.Queue, retry.ForTopology(q, retry.Config{Sender: publisher(t)}), func(ctx context.Context, d *idemq.Delivery) error {
		c.add(d)
		return nil
	})
	dl := waitDLQ(t, p.DLQ, 1)[0]
	if got := hs(dl.Headers, idemq.HeaderReason); got != idemq.ReasonDeliveryLimit {
		t.Fatalf("reason %q, want %q (headers %v)", got, idemq.ReasonDeliveryLimit, dl.Headers)
	}
	if c.n() != 0 {
		t.Fatalf("handler ran %d times on a poison delivery", c.n())
	}
	// The quorum DLQ (it declares a delivery limit) sets its own
	// x-delivery-count, from 0; the work queue's 3 must not come along.
	if n, ok := retry.DeliveryCount(dl.Headers); ok && n != 0 {
		t.Fatalf("dead letter still carries the work queue's x-delivery-count: %v", dl.Headers)
	}
	if dl.MessageId != "poison-1" {
		t.Fatalf("id %q", dl.MessageId)
	}
}

func TestRequeueErrorIsDelayedNotCounted(t *testing.T) {
	p := declare(t, topology.Queue{RetryDelays: []time.Duration{100 * time.Millisecond, 300 * time.Millisecond}})
	var c calls
	done := make(chan *idemq.Delivery, 1)
	consume(t, p.Queue, retry.Config{Sender: publisher(t), Delays: p.Delays, QuickAttempts: 3},
		func(ctx context.Context, d *idemq.Delivery) error {
			if c.add(d) <= 2 {
				return idemq.Requeue(150*time.Millisecond, "in-flight", errors.New("another consumer holds the lease"))
			}
			done <- d
			return nil
		})
	testenv.Publish(t, "", p.Queue, amqp.Publishing{MessageId: "r-1"})
	var d *idemq.Delivery
	select {
	case d = <-done:
	case <-time.After(wait):
		t.Fatalf("not processed; %d calls", c.n())
	}
	if retry.Attempt(d.Headers) != 1 {
		t.Fatalf("attempt %d after requeues, want 1 (not counted)", retry.Attempt(d.Headers))
	}
	if n := hi(t, d.Headers, idemq.HeaderRequeues); n != 2 {
		t.Fatalf("requeues %d, want 2", n)
	}
	for i := 1; i < 3; i++ {
		// After is 150ms: the 300ms retry queue is the smallest that waits long enough.
		if gap := c.times[i].Sub(c.times[i-1]); gap < 300*time.Millisecond {
			t.Fatalf("requeue %d came back after %v, want >= 300ms", i, gap)
		}
	}
}

// An in-place RequeueError (the guard's in-flight deferral) is not parked
// in a retry queue: the consumer nacks it with requeue after After, so it
// never leaves the work queue (a retry queue's TTL dead-lettering can drop
// it in a broker restart).
func TestRequeueInPlaceStaysInTheWorkQueue(t *testing.T) {
	p := declare(t, topology.Queue{RetryDelays: []time.Duration{100 * time.Millisecond}})
	var c calls
	done := make(chan *idemq.Delivery, 1)
	consume(t, p.Queue, retry.Config{Sender: publisher(t), Delays: p.Delays, QuickAttempts: 3},
		func(ctx context.Context, d *idemq.Delivery) error {
			if c.add(d) <= 2 {
				return idemq.RequeueInPlace(150*time.Millisecond, "in-flight", errors.New("another consumer holds the lease"))
			}
			done <- d
			return nil
		})
	testenv.Publish(t, "", p.Queue, amqp.Publishing{MessageId: "in-place-1"})
	var d *idemq.Delivery
	select {
	case d = <-done:
	case <-time.After(wait):
		t.Fatalf("not processed; %d calls", c.n())
	}
	// Redelivered by the broker from the work queue, not republished: no
	// requeue header, the redelivered flag set.
	if _, ok := d.Headers[idemq.HeaderRequeues]; ok {
		t.Fatalf("delivery carries %s: it was republished, want requeued in place", idemq.HeaderRequeues)
	}
	if !d.Redelivered {
		t.Fatal("the delivery is not flagged redelivered: it did not come back from the work queue")
	}
	for i := 1; i < 3; i++ {
		if gap := c.times[i].Sub(c.times[i-1]); gap < 150*time.Millisecond {
			t.Fatalf("requeue %d came back after %v, want >= 150ms", i, gap)
		}
	}
}

// In-place deferrals count as deliveries on a quorum queue: past half the
// delivery limit the policy republishes the delivery to the work queue
// (which starts the count again; never through a retry queue's TTL
// dead-lettering), so a message deferred more often than the limit is
// never dead-lettered for it.
func TestRequeueInPlaceRepublishesNearTheDeliveryLimit(t *testing.T) {
	p := declare(t, topology.Queue{Type: topology.Quorum, DeliveryLimit: 4, RetryDelays: []time.Duration{100 * time.Millisecond}})
	var c calls
	done := make(chan *idemq.Delivery, 1)
	consume(t, p.Queue, retry.Config{Sender: publisher(t), Delays: p.Delays, DeliveryLimit: p.DeliveryLimit},
		func(ctx context.Context, d *idemq.Delivery) error {
			if c.add(d) <= 8 { // twice the limit
				return idemq.RequeueInPlace(20*time.Millisecond, "in-flight", errors.New("another consumer holds the lease"))
			}
			done <- d
			return nil
		})
	testenv.Publish(t, "", p.Queue, amqp.Publishing{MessageId: "near-limit-1"})
	select {
	case <-done:
	case <-time.After(wait):
		t.Fatalf("not processed; %d calls", c.n())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	parked := 0
	for i, d := range c.dels {
		n, _ := retry.DeliveryCount(d.Headers)
		if n >= int64(p.DeliveryLimit) {
			t.Fatalf("call %d saw x-delivery-count %d, the limit is %d", i+1, n, p.DeliveryLimit)
		}
		if _, ok := d.Headers[idemq.HeaderRequeues]; ok {
			parked++
		}
		if _, ok := d.Headers["x-death"]; ok {
			t.Fatalf("call %d came through a retry queue (x-death set): %v", i+1, d.Headers["x-death"])
		}
	}
	if parked == 0 {
		t.Fatal("never republished: the delivery count was left to grow")
	}
	if n, _ := testenv.QueueCounts(t, p.DLQ); n != 0 {
		t.Fatalf("%d dead letters, want none", n)
	}
}

// Without a publisher the policy returns the error: the consumer rejects and
// the work queue's dead-letter arguments route it to the DLQ.
func TestNoPublisherFallsBackToBrokerDeadLettering(t *testing.T) {
	p := declare(t, topology.Queue{NoRetry: true})
	consume(t, p.Queue, retry.Config{QuickAttempts: 2}, func(ctx context.Context, d *idemq.Delivery) error {
		return errors.New("boom")
	})
	testenv.Publish(t, "", p.Queue, amqp.Publishing{MessageId: "np-1"})
	dl := waitDLQ(t, p.DLQ, 1)[0]
	deaths := retry.ParseXDeath(dl.Headers[idemq.HeaderDeath])
	if len(deaths) != 1 || deaths[0].Reason != "rejected" || deaths[0].Queue != p.Queue {
		t.Fatalf("x-death %+v", deaths)
	}
}
