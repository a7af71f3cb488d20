package idemq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/idemq/idemq/backoff"
	"github.com/idemq/idemq/internal/acker"
	"github.com/idemq/idemq/internal/deadline"
)

// process runs one delivery: the failure policy decides (after as many runs
// of the chain as it wants), the executor carries the decision out.
func (c *Consumer) process(ctx context.Context, x *executor, j job) {
	if dec, ok := c.expired(ctx, j); ok {
		x.settle(ctx, j.del, j.d.DeliveryTag, dec)
		x.observe(j.del, dec, 0)
		return
	}
	defer c.watch.Track(j.del, deadline.Item{MessageID: j.del.MessageID, DeliveryTag: j.del.DeliveryTag,
		Redelivered: j.del.Redelivered, ReceivedAt: j.del.ReceivedAt})()
	start := time.Now()
	dec := c.decide(ctx, j.del)
	x.carry(ctx, j.del, j.d.DeliveryTag, dec, time.Since(start))
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

// decide is the consumer's decision loop, shared with [Pipeline.Decide]:
// the policy admits d, run runs the chain, ran (optional) sees every run's
// error, last (optional) the error of the run the final decision was taken
// on.
func decide(ctx context.Context, policy FailurePolicy, d *Delivery, run func(context.Context, *Delivery) error, ran, last func(error)) Decision {
	if dec, ok := policy.Admit(d); !ok {
		return dec
	}
	for n := 1; ; n++ {
		err := run(ctx, d)
		if ran != nil {
			ran(err)
		}
		dec := policy.Decide(d, Run{Err: err, N: n, Stopping: ctx.Err() != nil})
		if dec.Action == ActionRunAgain && backoff.Sleep(ctx, dec.Delay) != nil {
			// Stopping during the pause: decide without running again.
			dec = policy.Decide(d, Run{Err: err, N: n, Stopping: true})
		}
		if dec.Action != ActionRunAgain {
			if last != nil {
				last(err)
			}
			return dec
		}
	}
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

// runChain runs h once, a panic becoming a [*PanicError].
func runChain(ctx context.Context, h Handler, d *Delivery) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return h.Handle(ctx, d)
}

// Decide runs p for d the way a [Consumer] does and returns the decision
// the consumer's executor would carry out: the failure policy admits d,
// the chain (middleware → guard → Recover → handler) runs as many times as
// the policy asks (quick retries), and the policy decides. It carries
// nothing out — no publish, no ack, no nack — and it is the consumer's own
// decision loop, not a copy of it. It is the seam a test kit (idemqtest)
// or an adapter drives a pipeline through without a broker.
//
// What belongs to the consumer rather than to the pipeline is not applied:
// the handler deadline (HandlerTimeout, the ConsumerTimeout bound), the
// breaker, the counters (put a Recorder in ctx with [WithRecorder] for the
// layers' own), and the ID decision (call [IDConfig.Apply] on d first, or
// d.ID() reads its MessageID). A nil Policy is [BasePolicy]; a pipeline
// without a Handler is rejected with [ErrNoHandler].
func (p Pipeline) Decide(ctx context.Context, d *Delivery) Decision {
	policy := p.Policy
	if policy == nil {
		policy = BasePolicy{}
	}
	if err := p.Validate(); err != nil {
		return Decision{Action: ActionReject, Outcome: OutcomeRejected, Reason: ReasonOf(err), Err: err}
	}
	h := p.chain(nil)
	return decide(ctx, policy, d, func(ctx context.Context, d *Delivery) error {
		return runChain(ctx, h, d)
	}, nil, nil)
}

// executor carries out decisions on one channel: it publishes what a
// decision says to publish (waiting for the broker's confirm), then acks;
// or nacks, at once or after a delay. It counts every outcome. It is the
// only place that settles a delivery.
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

func (x *executor) carry(ctx context.Context, d *Delivery, tag uint64, dec Decision, handler time.Duration) {
	for tries := 0; dec.Action == ActionPublish; tries++ {
		err := errNoSender
		if dec.Sender != nil && dec.Message != nil {
			err = dec.Sender.Publish(ctx, *dec.Message)
		}
		if err == nil {
			break
		}
		next := x.policy.PublishFailed(d, dec, err)
		if tries >= maxPublishFallbacks && next.Action == ActionPublish {
			next = Decision{Action: ActionRequeue, Outcome: OutcomeDeferred, Reason: "publish-failed", Err: err}
		}
		lvl := slog.LevelWarn
		if next.Action == ActionReject || next.Outcome == OutcomeDeadLettered {
			lvl = slog.LevelError
		}
		x.log.Log(ctx, lvl, "idemq: publish for a delivery failed; deciding again",
			"message_id", d.LogID(), "decided", dec.String(), "now", next.String(), "err", err)
		dec = next
	}
	if ctx.Err() != nil && dec.Action == ActionRequeue {
		dec.Delay = 0 // shutting down or the channel is gone: give it back at once
	}
	x.settle(ctx, d, tag, dec)
	x.observe(d, dec, handler)
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
