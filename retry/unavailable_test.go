package retry_test

import (
	"context"
	"errors"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/retry"
)

// A dependency outage is not an attempt: the handler runs once (no quick
// retries), and the delivery is given back in place, still an unavailable
// error, its attempt header unchanged — never dead-lettered, whatever
// attempt it is on.
func TestPolicyUnavailableIsNotAnAttempt(t *testing.T) {
	for _, attempt := range []int64{1, 3, 10} {
		runs := 0
		h := idemq.Chain(idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
			runs++
			return idemq.Unavailable("database", errors.New("connection refused"))
		}), retry.Policy(retry.Config{QuickAttempts: 3, MaxAttempts: 3}))
		// As it comes back from a retry queue (idemq's own retry path:
		// default exchange, routing key = the queue, the queue marker),
		// so its attempt header is trusted.
		d := &idemq.Delivery{MessageID: "m", Queue: "q", RoutingKey: "q",
			Headers: amqp.Table{idemq.HeaderAttempt: attempt, idemq.HeaderQueue: "q"}}
		err := h.Handle(context.Background(), d)
		var rq *idemq.RequeueError
		if !errors.As(err, &rq) || !rq.InPlace || rq.After <= 0 {
			t.Fatalf("attempt %d: err = %v, want an in-place requeue", attempt, err)
		}
		if !idemq.IsUnavailable(err) {
			t.Fatalf("attempt %d: the requeue no longer says unavailable: %v", attempt, err)
		}
		if runs != 1 {
			t.Fatalf("attempt %d: handler ran %d times, want 1 (no quick retries)", attempt, runs)
		}
		if got, _ := retry.Int(d.Headers[idemq.HeaderAttempt]); got != attempt {
			t.Fatalf("attempt header changed to %d", got)
		}
	}
}
