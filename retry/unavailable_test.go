package retry_test

import (
	"errors"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/headerval"
	"github.com/idemq/idemq/retry"
)

// A dependency outage is not an attempt: no quick retry, the delivery is
// given back in place, still an unavailable outcome, its attempt header
// unchanged — never dead-lettered, whatever attempt it is on.
func TestPolicyUnavailableIsNotAnAttempt(t *testing.T) {
	p, err := retry.New(retry.Config{QuickAttempts: 3, MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, attempt := range []int64{1, 3, 10} {
		// As it comes back from a retry queue (idemq's own retry path:
		// default exchange, routing key = the queue, the queue marker),
		// so its attempt header is trusted.
		d := &idemq.Delivery{MessageID: "m", Queue: "q", RoutingKey: "q",
			Headers: amqp.Table{idemq.HeaderAttempt: attempt, idemq.HeaderQueue: "q"}}
		if _, ok := p.Admit(d); !ok {
			t.Fatal("not admitted")
		}
		dec := p.Decide(d, idemq.Run{Err: idemq.Unavailable("database", errors.New("connection refused")), N: 1})
		if dec.Action != idemq.ActionRequeue || dec.Outcome != idemq.OutcomeUnavailable || dec.Delay <= 0 {
			t.Fatalf("attempt %d: decision %v, want an in-place requeue (unavailable)", attempt, dec)
		}
		if !idemq.IsUnavailable(dec.Err) {
			t.Fatalf("attempt %d: the decision no longer says unavailable: %v", attempt, dec.Err)
		}
		if got, _ := headerval.Count(d.Headers[idemq.HeaderAttempt]); got != attempt {
			t.Fatalf("attempt header changed to %d", got)
		}
	}
}
