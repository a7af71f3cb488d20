package retry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/retry"
	"github.com/idemq/idemq/topology"
)

// The attempt count comes from x-idemq-attempt only, never from x-death
// (RabbitMQ 4.0 stopped updating and interpreting a client-republished
// x-death, so an x-death-based count would freeze there). Against the
// broker: a message goes through a real retry queue carrying an x-death
// whose count disagrees with x-idemq-attempt — the broker dead-letters it
// back and (on 3.x) adds to that x-death — and the policy's decision
// follows its own header both ways.
func TestAttemptCountIgnoresXDeathOnTheBroker(t *testing.T) {
	tests := []struct {
		name      string
		attempt   int64 // x-idemq-attempt on the way in
		deathN    int64 // x-death count on the way in
		wantRetry bool  // a failure is retried (else dead-lettered, max-attempts)
	}{
		{"x-death high, own attempt low: retried", 1, 50, true},
		{"x-death low, own attempt at the maximum: dead-lettered", 3, 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := declare(t, topology.Queue{RetryDelays: []time.Duration{100 * time.Millisecond}})
			var c calls
			failed := make(chan amqp.Table, 1)
			cons := consume(t, p.Queue, retry.Config{Sender: publisher(t), Delays: p.Delays, QuickAttempts: 1, MaxAttempts: 3},
				func(ctx context.Context, d *idemq.Delivery) error {
					if c.add(d) == 1 {
						failed <- d.Headers
						return errors.New("dependency hiccup")
					}
					return nil
				})
			death := []any{amqp.Table{"count": tt.deathN, "reason": "expired", "queue": p.Retries[0].Name,
				"exchange": "", "routing-keys": []any{p.Retries[0].Name}, "time": time.Now().Truncate(time.Second)}}
			testenv.Publish(t, "", p.Retries[0].Name, amqp.Publishing{MessageId: "xd-1", Headers: amqp.Table{
				idemq.HeaderAttempt: tt.attempt, idemq.HeaderQueue: p.Queue, idemq.HeaderDeath: death}})
			var h amqp.Table
			select {
			case h = <-failed:
			case <-time.After(wait):
				t.Fatal("the message never came back from the retry queue")
			}
			if got := retry.Attempt(h); got != int(tt.attempt) {
				t.Fatalf("delivery carries attempt %d, want %d", got, tt.attempt)
			}
			deaths := retry.ParseXDeath(h[idemq.HeaderDeath])
			t.Logf("x-death as delivered: %+v", deaths)
			if len(deaths) == 0 {
				t.Fatalf("no x-death on the delivery: the test would prove nothing")
			}
			if tt.wantRetry {
				testenv.Eventually(t, wait, "the retry applied", func() bool { return cons.Counters().Get(idemq.CountProcessed) == 1 })
				if c.n() != 2 {
					t.Fatalf("handler ran %d times, want 2", c.n())
				}
				c.mu.Lock()
				second := c.dels[1]
				c.mu.Unlock()
				if got := retry.Attempt(second.Headers); got != int(tt.attempt)+1 {
					t.Fatalf("retry carries attempt %d, want %d", got, tt.attempt+1)
				}
				if n, _ := testenv.QueueCounts(t, p.DLQ); n != 0 {
					t.Fatalf("%d dead letters", n)
				}
				return
			}
			dl := waitDLQ(t, p.DLQ, 1)[0]
			if r := hs(dl.Headers, idemq.HeaderReason); r != idemq.ReasonMaxAttempts {
				t.Fatalf("dead-letter reason %q, want %q", r, idemq.ReasonMaxAttempts)
			}
			if n := hi(t, dl.Headers, idemq.HeaderAttempts); n != tt.attempt {
				t.Fatalf("attempts %d, want %d", n, tt.attempt)
			}
			if c.n() != 1 {
				t.Fatalf("handler ran %d times, want 1", c.n())
			}
		})
	}
}
