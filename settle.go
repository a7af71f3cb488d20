package idemq

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/idemq/idemq/internal/acker"
)

// executor carries out decisions on one channel. It is the only place
// that settles a delivery, and it settles only Decisions: the failure
// policy's (Consumer.decide), the give-back of a delivery that expired
// before it ran (Consumer.expired), and the decision taken after a failed
// publish (afterPublishFailed). It publishes what a decision says to
// publish (waiting for the broker's confirm), then acks; or nacks, at
// once or after a delay (the requeuer). It counts every outcome.
type executor struct {
	ack    *acker.Acker
	rq     *acker.Requeuer
	policy FailurePolicy
	rec    Recorder
	obs    Observer // rec, when it is one
	log    *slog.Logger
}

// maxPublishFallbacks bounds the decisions taken after failed publishes
// for one delivery (a policy's PublishFailed always moves towards a
// settle; this is a backstop against a policy that would not).
const maxPublishFallbacks = 4

// errNoSender is the publish error of a decision without a Sender.
var errNoSender = errors.New("idemq: decision to publish without a message or a sender")

// carry carries dec out for d (tag on the executor's channel): it
// publishes what dec says to publish, deciding again after a failed
// publish (publish), then settles d and tells the Observer. handler is
// how long the chain ran (0: it did not run).
func (x *executor) carry(ctx context.Context, d *Delivery, tag uint64, dec Decision, handler time.Duration) {
	dec = x.publish(ctx, d, dec)
	if ctx.Err() != nil && dec.Action == ActionRequeue {
		dec.Delay = 0 // shutting down or the channel is gone: give it back at once
	}
	x.settle(ctx, d, tag, dec)
	x.observe(d, dec, handler)
}

// publish publishes what dec says to publish and returns the decision to
// settle d with: dec once its publish is confirmed (or when it publishes
// nothing), else the decision taken after the failed publish
// (afterPublishFailed), carried out in turn.
func (x *executor) publish(ctx context.Context, d *Delivery, dec Decision) Decision {
	for tries := 0; dec.Action == ActionPublish; tries++ {
		err := errNoSender
		if dec.Sender != nil && dec.Message != nil {
			err = dec.Sender.Publish(ctx, *dec.Message)
		}
		if err == nil {
			break
		}
		next := afterPublishFailed(x.policy, d, dec, err, tries)
		lvl := slog.LevelWarn
		if next.Action == ActionReject || next.Outcome == OutcomeDeadLettered {
			lvl = slog.LevelError
		}
		x.log.Log(ctx, lvl, "idemq: publish for a delivery failed; deciding again",
			"message_id", d.LogID(), "decided", dec.String(), "now", next.String(), "err", err)
		dec = next
	}
	return dec
}

// afterPublishFailed is the decision for d after dec's publish failed
// with err, that delivery's tries-th failed publish (from 0): the
// policy's PublishFailed, unless it asks for yet another publish after
// maxPublishFallbacks failed ones; then the backstop, a requeue (deferred,
// reason "publish-failed").
func afterPublishFailed(policy FailurePolicy, d *Delivery, dec Decision, err error, tries int) Decision {
	next := policy.PublishFailed(d, dec, err)
	if tries >= maxPublishFallbacks && next.Action == ActionPublish {
		next = Decision{Action: ActionRequeue, Outcome: OutcomeDeferred, Reason: "publish-failed", Err: err}
	}
	return next
}

// observe tells the Observer, if any, that d was settled as dec says.
func (x *executor) observe(d *Delivery, dec Decision, handler time.Duration) {
	if x.obs != nil {
		x.obs.Settled(d, Settlement{Decision: dec, Handler: handler, Total: time.Since(d.ReceivedAt)})
	}
}

// settle acks or nacks the delivery as dec says and counts its outcome.
// The outcome is counted first, acked last: a reader that sees acked
// reach n sees the outcomes of those n deliveries counted too (workers
// settle concurrently; counting acked first let a reader see it ahead of
// processed).
func (x *executor) settle(ctx context.Context, d *Delivery, tag uint64, dec Decision) {
	x.count(d, dec)
	switch dec.Action {
	case ActionAck, ActionPublish: // a publish here was confirmed
		x.rec.Add(CountAcked, 1)
		_ = x.ack.Ack(tag)
	case ActionReject:
		x.log.Warn("idemq: delivery rejected without requeue",
			"message_id", d.LogID(), "reason", dec.Reason, "err", dec.Err)
		_ = x.ack.Nack(tag, false)
	default: // ActionRequeue (ActionRunAgain never gets here)
		x.log.Debug("idemq: delivery given back for later", "message_id", d.LogID(),
			"after", dec.Delay, "reason", dec.Reason, "err", dec.Err)
		x.rq.Later(tag, dec.Delay)
	}
}

// count records dec's outcome (the requeuer counts the nack itself).
func (x *executor) count(d *Delivery, dec Decision) {
	published := dec.Action == ActionPublish
	switch dec.Outcome {
	case OutcomeProcessed:
		x.rec.Add(CountProcessed, 1)
	case OutcomeDuplicate:
		x.rec.Add(CountDuplicates, 1)
	case OutcomeRetried, OutcomeDeferred:
		if published {
			x.rec.Add(CountRetried, 1)
		}
		if dec.Outcome == OutcomeRetried && published {
			x.log.Info("idemq: delivery failed; retrying later", "message_id", d.LogID(),
				"attempt", dec.Attempt, "queue", dec.Message.RoutingKey, "err", dec.Err)
		}
	case OutcomeUnavailable:
		x.rec.Add(CountUnavailable, 1)
		if published {
			x.rec.Add(CountRetried, 1)
		}
	case OutcomeDeadLettered:
		if !published {
			break
		}
		x.rec.Add(CountDeadLettered, 1)
		x.log.Warn("idemq: delivery dead-lettered", "message_id", d.LogID(), "queue", d.Queue,
			"dlq", dec.Message.RoutingKey, "reason", dec.Reason, "attempts", dec.Attempt, "err", dec.Err)
	case OutcomeRejected:
		x.rec.Add(CountRejected, 1)
	case OutcomeRouted:
		if published {
			x.log.Warn("idemq: delivery set aside for review", "message_id", d.LogID(),
				"queue", dec.Message.RoutingKey, "reason", dec.Reason)
		}
	}
	for _, name := range dec.Counters {
		x.rec.Add(name, 1)
	}
}
