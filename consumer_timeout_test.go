package idemq_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/testenv"
)

// logBuffer collects a consumer's log lines for assertions.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// lines returns the log lines containing every one of parts.
func (b *logBuffer) lines(parts ...string) []string {
	var out []string
	for _, l := range strings.Split(b.String(), "\n") {
		ok := l != ""
		for _, p := range parts {
			ok = ok && strings.Contains(l, p)
		}
		if ok {
			out = append(out, l)
		}
	}
	return out
}

func (b *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }

// HandlerTimeout gives the handler's context a deadline whose cause is
// ErrHandlerTimeout; the failed handler is a failed attempt (without a
// failure policy: rejected, dead-lettered), counted and logged once.
func TestHandlerTimeoutCancelsTheHandlerContext(t *testing.T) {
	testenv.RequireAMQP(t)
	dlq := testenv.Queue(t, nil)
	queue := testenv.Queue(t, amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
	publishN(t, queue, 1, "ht")
	var logs logBuffer
	type seen struct {
		hasDeadline bool
		left        time.Duration
		cause       error
	}
	got := make(chan seen, 1)
	c, _ := runConsumer(t, idemq.ConsumerConfig{Queue: queue, HandlerTimeout: 300 * time.Millisecond, Logger: logs.logger()},
		idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
			dl, ok := ctx.Deadline()
			s := seen{hasDeadline: ok, left: time.Until(dl)}
			<-ctx.Done() // a slow call that honours its context
			s.cause = context.Cause(ctx)
			got <- s
			return ctx.Err()
		}))
	var s seen
	select {
	case s = <-got:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler's context was never cancelled")
	}
	if !s.hasDeadline || s.left > 300*time.Millisecond {
		t.Fatalf("handler context deadline: set %v, %v left at start; want at most 300ms", s.hasDeadline, s.left)
	}
	if !errors.Is(s.cause, idemq.ErrHandlerTimeout) {
		t.Fatalf("context cause %v, want ErrHandlerTimeout", s.cause)
	}
	testenv.Eventually(t, 10*time.Second, "the timed-out delivery dead-lettered", func() bool { r, _ := testenv.QueueCounts(t, dlq); return r == 1 })
	if n := c.Counters().Get(idemq.CountHandlerTimeouts); n != 1 {
		t.Fatalf("handler_timeouts = %d, want 1", n)
	}
	if l := logs.lines("handler timed out; its context", "message_id=ht-0"); len(l) != 1 {
		t.Fatalf("want one timeout log line with the message ID, got %q", l)
	}
}

// A handler still running after StuckHandlerAfter is logged with its
// message ID and age, once per threshold (then at every doubling), and
// counted once.
func TestStuckHandlerIsLoggedWithItsAge(t *testing.T) {
	testenv.RequireAMQP(t)
	queue := testenv.Queue(t, nil)
	publishN(t, queue, 1, "stuck")
	var logs logBuffer
	release := make(chan struct{})
	c, _ := runConsumer(t, idemq.ConsumerConfig{Queue: queue, StuckHandlerAfter: 100 * time.Millisecond, Logger: logs.logger()},
		idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
			<-release
			return nil
		}))
	testenv.Eventually(t, 10*time.Second, "two stuck-handler warnings (at 100ms and 200ms)", func() bool {
		return len(logs.lines("handler still running", "message_id=stuck-0", "age=")) >= 2
	})
	close(release)
	testenv.Eventually(t, 10*time.Second, "acked", func() bool { return c.Counters().Get(idemq.CountAcked) == 1 })
	if n := c.Counters().Get(idemq.CountStuckHandlers); n != 1 {
		t.Fatalf("stuck_handlers = %d, want 1 (one per handler)", n)
	}
	// Once per threshold: the warnings' count grows with the doublings
	// (100ms, 200ms, 400ms, ...), not with the watchdog's ticks.
	l := logs.lines("handler still running")
	if len(l) > 8 {
		t.Fatalf("%d stuck warnings for one handler: not once per threshold", len(l))
	}
}

// The ConsumerTimeout bound: a handler that would outlive the broker's
// consumer_timeout is cancelled below it (here against the consumer's
// belief of a 2s timeout; TestFaultConsumerTimeout checks the real broker
// side with a private node), warned about as it nears the bound, and —
// with no failure policy — given back to the queue rather than rejected;
// its redelivery runs once.
func TestConsumerTimeoutBoundsHandlers(t *testing.T) {
	testenv.RequireAMQP(t)
	queue := testenv.Queue(t, nil)
	publishN(t, queue, 1, "ct")
	var logs logBuffer
	var runs atomic.Int64
	var firstDeadline atomic.Int64 // ns from receipt to the context's deadline
	var firstCause atomic.Value
	c, _ := runConsumer(t, idemq.ConsumerConfig{
		Queue: queue, ConsumerTimeout: 2 * time.Second, ConsumerTimeoutMargin: 500 * time.Millisecond,
		StuckHandlerAfter: -1, Logger: logs.logger(),
	}, idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
		if runs.Add(1) == 1 {
			dl, _ := ctx.Deadline()
			firstDeadline.Store(int64(dl.Sub(d.ReceivedAt)))
			<-ctx.Done()
			firstCause.Store(context.Cause(ctx))
			return ctx.Err()
		}
		return nil
	}))
	testenv.Eventually(t, 20*time.Second, "the redelivery acked", func() bool { return c.Counters().Get(idemq.CountAcked) == 1 })
	if dl := time.Duration(firstDeadline.Load()); dl != 1500*time.Millisecond {
		t.Fatalf("first run's deadline %v after receipt; want 1.5s (timeout 2s - margin 0.5s)", dl)
	}
	if err, _ := firstCause.Load().(error); !errors.Is(err, idemq.ErrHandlerTimeout) {
		t.Fatalf("first run's context cause %v, want ErrHandlerTimeout", err)
	}
	if runs.Load() != 2 || c.Counters().Get(idemq.CountRejected) != 0 || c.Counters().Get(idemq.CountRequeued) != 1 {
		t.Fatalf("runs %d rejected %d requeued %d; want 2, 0, 1", runs.Load(), c.Counters().Get(idemq.CountRejected), c.Counters().Get(idemq.CountRequeued))
	}
	if l := logs.lines("nears the broker's consumer_timeout", "message_id=ct-0"); len(l) != 1 {
		t.Fatalf("want one near-timeout warning, got %q", l)
	}
}

// Deliveries that wait in the consumer (prefetch larger than the workers
// can handle within the timeout) until too close to the ConsumerTimeout
// bound are given back without running — not run with no time left and
// counted as failed attempts — and each message is still handled once.
func TestExpiredDeliveriesAreGivenBack(t *testing.T) {
	testenv.RequireAMQP(t)
	queue := testenv.Queue(t, nil)
	const n = 5
	ids := publishN(t, queue, n, "exp")
	tr := newTracker()
	var first atomic.Bool
	c, _ := runConsumer(t, idemq.ConsumerConfig{
		Queue: queue, Workers: 1, Prefetch: n, ConsumerTimeout: 2 * time.Second, ConsumerTimeoutMargin: 500 * time.Millisecond,
		StuckHandlerAfter: -1,
	}, idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
		if first.CompareAndSwap(false, true) {
			<-ctx.Done() // holds the only worker until the bound
			return ctx.Err()
		}
		tr.add(d.MessageID)
		return nil
	}))
	testenv.Eventually(t, 30*time.Second, "every message handled", func() bool { return tr.distinct() == n })
	if e := c.Counters().Get(idemq.CountExpiredDeliveries); e < 1 {
		t.Fatalf("expired_deliveries = %d, want >= 1 (the deliveries behind the slow one waited past the bound)", e)
	}
	for _, id := range ids {
		if k := tr.count(id); k != 1 {
			t.Fatalf("%s handled %d times, want 1", id, k)
		}
	}
	if f := c.Counters().Get(idemq.CountFailed); f != 1 {
		t.Fatalf("failed = %d, want 1 (only the slow handler; expired ones never ran)", f)
	}
}

func TestTimeoutConfigValidation(t *testing.T) {
	h := idemq.HandlerFunc(func(context.Context, *idemq.Delivery) error { return nil })
	for _, tc := range []struct {
		name string
		cfg  idemq.ConsumerConfig
		ok   bool
	}{
		{"defaults", idemq.ConsumerConfig{Queue: "q"}, true},
		{"negative handler timeout", idemq.ConsumerConfig{Queue: "q", HandlerTimeout: -time.Second}, false},
		{"margin too large", idemq.ConsumerConfig{Queue: "q", ConsumerTimeout: 4 * time.Second, ConsumerTimeoutMargin: 2 * time.Second}, false},
		{"negative margin", idemq.ConsumerConfig{Queue: "q", ConsumerTimeoutMargin: -time.Second}, false},
		{"no broker timeout", idemq.ConsumerConfig{Queue: "q", ConsumerTimeout: -1, HandlerTimeout: time.Minute}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Pipeline.Handler = h
			_, err := idemq.NewConsumer(tc.cfg)
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}
