package idemq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq/internal/deadline"
)

// One delivery, in a worker:
//
//	expired   a delivery no longer worth running is given back (a Decision)
//	decide    the failure policy admits it, the chain runs (under the
//	          handler deadline, the breaker asking the dependencies about
//	          unknown failures), the policy decides (a Decision)
//	carry     the executor carries the decision out (settle.go)

// process runs one delivery: unless it expired, the failure policy
// decides (after as many runs of the chain as it wants); the executor
// carries the decision out, whichever made it.
func (c *Consumer) process(ctx context.Context, x *executor, j job) {
	dec, expired := c.expired(ctx, j)
	var handler time.Duration // how long the chain ran; 0: it did not
	if !expired {
		defer c.watch.Track(j.del, deadline.Item{MessageID: j.del.MessageID, DeliveryTag: j.del.DeliveryTag,
			Redelivered: j.del.Redelivered, ReceivedAt: j.del.ReceivedAt})()
		start := time.Now()
		dec = c.decide(ctx, j.del)
		handler = time.Since(start)
	}
	x.carry(ctx, j.del, j.d.DeliveryTag, dec, handler)
}

// expired decides to give back, without running it, a delivery that is
// no longer worth running: the consumer is stopping (its context ended),
// or it waited in the client until less than one margin is left before
// the ConsumerTimeout bound (a prefetch much larger than the workers can
// handle in time). ok is false when the delivery should run; the
// executor carries the decision out like any other.
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

// decide asks the policy to admit d, runs the chain, and asks the policy
// what next until it stops asking for another run.
func (c *Consumer) decide(ctx context.Context, d *Delivery) Decision {
	return decide(ctx, c.policy, d, func(ctx context.Context, d *Delivery) error {
		// An error in a shape nobody listed is an outage when the
		// dependency says so (BreakerConfig.AskTimeout).
		return c.brk.Ask(ctx, c.run(ctx, d))
	}, func(err error) {
		if err != nil && !IsDuplicate(err) {
			c.rec.Add(CountFailed, 1)
		}
	}, c.brk.Report)
}

// run runs the chain once. A panic in a layer outside Recover (a
// middleware, the guard) is a failed run, not a dead worker.
func (c *Consumer) run(ctx context.Context, d *Delivery) error {
	err := runChain(ctx, c.handler, d)
	var pe *PanicError
	if errors.As(err, &pe) {
		c.rec.Add(CountPanics, 1)
		c.log.Error("idemq: handler panicked", "message_id", d.LogID(), "panic", fmt.Sprint(pe.Value), "stack", string(pe.Stack))
	}
	return err
}

// askable says whether a failed run's error leaves open whether a
// dependency is down (see [BreakerConfig.AskTimeout]): not a duplicate,
// an outage, permanent, rejected, a deferral or a panic.
func askable(err error) bool {
	var rq *RequeueError
	var rj *RejectError
	var pe *PanicError
	switch {
	case IsDuplicate(err), IsUnavailable(err), IsPermanent(err):
		return false
	case errors.As(err, &rq), errors.As(err, &rj), errors.As(err, &pe):
		return false
	}
	return true
}

// dependencyOf names the dependency an outage error reports (logs).
func dependencyOf(err error) string {
	var u *UnavailableError
	if errors.As(err, &u) {
		return u.Dependency
	}
	return "?"
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

// queueTimeoutRead hears the consumer timeout the broker shows for the
// queue (an x-consumer-timeout argument, a consumer-timeout policy; 0:
// none), read with its delivery limit: when it is shorter than
// ConsumerTimeout it bounds the handlers and the watchdog from now on
// (timeouts), and it is warned about once per value when it is shorter
// than HandlerTimeout or ConsumerTimeout.
func (c *Consumer) queueTimeoutRead(d time.Duration, source string) {
	c.watch.SetTimeouts(c.timeouts())
	if d == 0 {
		return
	}
	if (c.cfg.ConsumerTimeout > 0 && d < c.cfg.ConsumerTimeout) || c.cfg.HandlerTimeout > d {
		c.log.Warn("idemq: the broker applies a shorter consumer timeout to the queue than the consumer was given; handlers are bounded below it",
			"queue", c.cfg.Queue, "consumer_timeout", d, "source", source,
			"ConsumerTimeout", c.cfg.ConsumerTimeout, "HandlerTimeout", c.cfg.HandlerTimeout, "bound", d-c.timeouts().Margin)
		return
	}
	c.log.Info("idemq: queue consumer timeout", "queue", c.cfg.Queue, "consumer_timeout", d, "source", source)
}
