package idemq

import (
	"context"
	"fmt"
	"time"

	"github.com/idemq/idemq/internal/deadline"
)

// Handler time limits, and the broker's consumer_timeout.
//
// RabbitMQ closes a channel (PRECONDITION_FAILED, "delivery acknowledgement
// timed out") when one of its deliveries stays unacknowledged for longer
// than consumer_timeout, and redelivers every unacked delivery of that
// channel — while the first handler may still run. The consumer bounds each
// handler below that timeout, so a slow handler is cancelled and its
// delivery given back through the failure policy before the broker acts.

// DefaultConsumerTimeout is RabbitMQ's default consumer_timeout (since 3.8.15).
const DefaultConsumerTimeout = 30 * time.Minute

// Counter names for handler time limits.
const (
	// CountHandlerTimeouts: handlers whose context reached its deadline
	// (HandlerTimeout or the ConsumerTimeout bound) and that failed.
	CountHandlerTimeouts = "handler_timeouts"
	// CountStuckHandlers: deliveries still being handled after
	// StuckHandlerAfter (counted once each).
	CountStuckHandlers = "stuck_handlers"
	// CountExpiredDeliveries: deliveries given back without running
	// because they waited in the client until too close to the
	// ConsumerTimeout bound.
	CountExpiredDeliveries = "expired_deliveries"
)

// ErrHandlerTimeout is the cause of a handler context cancelled at its
// deadline (see ConsumerConfig.HandlerTimeout and ConsumerTimeout). A
// handler can test context.Cause(ctx) for it; a failed handler's error
// reaches the failure policy as a [*HandlerTimeoutError].
var ErrHandlerTimeout = deadline.ErrHandlerTimeout

// HandlerTimeoutError is what a handler's error becomes when the handler
// failed after its context reached its deadline. It is an ordinary failed
// attempt for the failure policy (retried with delay, then dead-lettered),
// not a shutdown: the delivery is not acked, the dedup guard releases its
// claim and the inbox rolls back, so the redelivery applies it once.
type HandlerTimeoutError struct {
	// Limit is how long the handler was given.
	Limit time.Duration
	// ConsumerTimeout says the limit came from the broker's consumer
	// timeout bound rather than from HandlerTimeout.
	ConsumerTimeout bool
	// Err is what the handler returned.
	Err error
}

func (e *HandlerTimeoutError) Error() string {
	return fmt.Sprintf("%s after %v (%s): %s", ErrHandlerTimeout.Error(), e.Limit, e.source(), errString(e.Err))
}

func (e *HandlerTimeoutError) source() string {
	if e.ConsumerTimeout {
		return "bounded below the broker's consumer_timeout"
	}
	return "HandlerTimeout"
}

// Unwrap returns [ErrHandlerTimeout] and the handler's error.
func (e *HandlerTimeoutError) Unwrap() []error { return []error{ErrHandlerTimeout, e.Err} }

// timeouts are the handler bounds of cfg.
func (cfg *ConsumerConfig) timeouts() deadline.Timeouts {
	t := deadline.Timeouts{Handler: cfg.HandlerTimeout}
	if cfg.ConsumerTimeout > 0 {
		t.Broker, t.Margin = cfg.ConsumerTimeout, cfg.ConsumerTimeoutMargin
	}
	if cfg.StuckHandlerAfter > 0 {
		t.Stuck = cfg.StuckHandlerAfter
	}
	return t
}

// timeouts are the consumer's bounds: its configuration, with the
// broker's consumer timeout for the queue when the management API showed
// a shorter one (limit.go); the margin then stays below a quarter of it.
func (c *Consumer) timeouts() deadline.Timeouts {
	t := c.cfg.timeouts()
	if q := c.limits.ConsumerTimeout(); q > 0 && (t.Broker <= 0 || q < t.Broker) {
		t.Broker = q
		if t.Margin <= 0 || t.Margin > q/4 {
			t.Margin = q / 4
		}
	}
	return t
}

// deadline wraps the user's handler (innermost, inside every middleware):
// its context ends at min(start+HandlerTimeout, the ConsumerTimeout bound).
// The middlewares around it (failure policy, dedup guard, inbox) keep a
// live context, so they can release the claim, roll back and republish
// after a timeout.
func (c *Consumer) deadline(h Handler) Handler {
	if t := c.timeouts(); t.Handler <= 0 && t.Broker <= 0 && c.limits == nil {
		return h
	}
	return HandlerFunc(func(ctx context.Context, d *Delivery) error {
		t := c.timeouts() // per delivery: the broker's may have been read since
		start := time.Now()
		var at time.Time
		fromBroker := false
		if t.Handler > 0 {
			at = start.Add(t.Handler)
		}
		if b, ok := t.Bound(d.ReceivedAt); ok && (at.IsZero() || b.Before(at)) {
			at, fromBroker = b, true
		}
		if at.IsZero() {
			return h.Handle(ctx, d)
		}
		limit := at.Sub(start)
		if limit <= 0 {
			// The bound has passed (a quick retry after a timeout): do
			// not start work that would be cut at once.
			return &HandlerTimeoutError{Limit: 0, ConsumerTimeout: fromBroker, Err: context.DeadlineExceeded}
		}
		hctx := deadline.New(ctx, at, limit)
		defer hctx.End()
		err := h.Handle(hctx, d)
		if err == nil || hctx.Err() == nil || ctx.Err() != nil {
			// Success (even a late one: the effect is applied, ack it),
			// a failure of its own, or the consumer's context ended
			// (shutdown, lost channel: not the handler's fault).
			return err
		}
		RecorderFrom(ctx).Add(CountHandlerTimeouts, 1)
		c.log.Warn("idemq: handler timed out; its context was cancelled and the delivery goes to the failure policy",
			"message_id", d.MessageID, "delivery_tag", d.DeliveryTag, "limit", limit,
			"consumer_timeout_bound", fromBroker, "err", err)
		return &HandlerTimeoutError{Limit: limit, ConsumerTimeout: fromBroker, Err: err}
	})
}

// expired decides to give back, without running it, a delivery that is
// no longer worth running: the consumer is stopping (its context ended),
// or it waited in the client until less than one margin is left before
// the ConsumerTimeout bound (a prefetch much larger than the workers can
// handle in time). ok is false when the delivery should run; the
// executor settles the decision.
func (c *Consumer) expired(ctx context.Context, j job) (dec Decision, ok bool) {
	giveBack := Decision{Action: ActionRequeue, Outcome: OutcomeDeferred, Reason: "expired"}
	if ctx.Err() != nil {
		// Shutdown past ShutdownTimeout, or the channel is gone: give it
		// back (a no-op on a dead channel: the broker redelivers).
		return giveBack, true
	}
	t := c.timeouts()
	b, ok := t.Bound(j.del.ReceivedAt)
	if !ok || time.Until(b) > t.Margin {
		return Decision{}, false
	}
	c.rec.Add(CountExpiredDeliveries, 1)
	c.log.Warn("idemq: delivery waited in the consumer too close to the broker's consumer_timeout; given back without running (lower Prefetch or raise Workers)",
		"message_id", j.del.MessageID, "delivery_tag", j.d.DeliveryTag,
		"waited", time.Since(j.del.ReceivedAt).Round(time.Millisecond), "consumer_timeout", t.Broker)
	return giveBack, true
}
