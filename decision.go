package idemq

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Decisions, then effects.
//
// What happens to a delivery once its handler chain has run is decided by a
// [FailurePolicy] as a [Decision] value — a pure function of the chain's
// error, the delivery, the run number and the policy's config — and carried
// out by the consumer's one executor (publish with confirms, then ack; or
// nack). The consumer counts every outcome from the decision it carried out,
// so no layer counts "processed" or "duplicate" itself.

// Action is what the executor does with a delivery.
type Action uint8

const (
	// ActionAck acks the delivery: its effect is applied, or it was a
	// duplicate.
	ActionAck Action = iota + 1
	// ActionRunAgain runs the handler chain again in process after Delay
	// (a quick retry). The executor never sees it: the consumer loops.
	ActionRunAgain
	// ActionRequeue gives the delivery back to its queue (nack with
	// requeue) after Delay, without holding a worker: a deferral, a
	// dependency outage, a shutdown. Not an attempt.
	ActionRequeue
	// ActionPublish publishes Message through Sender, waits for the
	// broker's confirm, then acks the delivery: a delayed retry, a dead
	// letter, a deferral through a retry queue. When the publish fails the
	// policy's [FailurePolicy.PublishFailed] decides again.
	ActionPublish
	// ActionReject nacks without requeue: the broker drops the message,
	// or its queue's dead-letter exchange takes it. Never a requeue loop.
	ActionReject
)

var actionNames = [...]string{"?", "ack", "run-again", "requeue", "publish", "reject"}

func (a Action) String() string {
	if int(a) < len(actionNames) {
		return actionNames[a]
	}
	return fmt.Sprintf("action(%d)", a)
}

// Outcome is what the consumer counts for a decision it carried out.
type Outcome uint8

const (
	// OutcomeProcessed: the handler ran and succeeded ([CountProcessed]).
	OutcomeProcessed Outcome = iota + 1
	// OutcomeDuplicate: a layer of defence recognised a duplicate
	// ([ErrDuplicate]) and the handler did not run ([CountDuplicates]).
	OutcomeDuplicate
	// OutcomeRetried: sent to a retry queue for a later attempt
	// ([CountRetried]).
	OutcomeRetried
	// OutcomeDeferred: not processed, sent back for later, not an
	// attempt (another consumer holds the lease, a lost lease): requeued
	// in place ([CountRequeued]) or republished ([CountRetried]).
	OutcomeDeferred
	// OutcomeUnavailable: a dependency was unavailable; given back, not an
	// attempt ([CountUnavailable]).
	OutcomeUnavailable
	// OutcomeStopped: the consumer is stopping or its channel is gone;
	// given back at once ([CountRequeued]).
	OutcomeStopped
	// OutcomeDeadLettered: published to the dead-letter queue
	// ([CountDeadLettered]).
	OutcomeDeadLettered
	// OutcomeRejected: nacked without requeue ([CountRejected]).
	OutcomeRejected
	// OutcomeRouted: published to a queue of its own for review (a
	// suspected duplicate); the extra counters say which.
	OutcomeRouted
)

var outcomeNames = [...]string{"?", "processed", "duplicate", "retried", "deferred", "unavailable", "stopped", "dead-lettered", "rejected", "routed"}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", o)
}

// Decision is what a [FailurePolicy] decided for one delivery. It is a
// value: building it has no effect; the consumer's executor carries it out.
type Decision struct {
	Action  Action
	Outcome Outcome
	// Delay: how long to wait before ActionRunAgain or ActionRequeue.
	Delay time.Duration
	// Message and Sender: what ActionPublish publishes, and through what
	// (a confirming publisher, bounded by the policy's publish timeout).
	Message *Message
	Sender  Sender
	// Reason: the dead-letter or requeue reason (logs, headers).
	Reason string
	// Attempt: the delivery's attempt number (x-idemq-attempt) when the
	// decision was taken.
	Attempt int
	// Err: the error that led to the decision (nil for a success).
	Err error
	// Counters are extra counters the executor adds once the decision is
	// carried out (a policy's own, such as retry_no_dlq).
	Counters []string
}

// String describes d for logs and test failures.
func (d Decision) String() string {
	s := d.Action.String() + "/" + d.Outcome.String()
	if d.Delay > 0 {
		s += fmt.Sprintf(" after %v", d.Delay)
	}
	if d.Message != nil {
		s += fmt.Sprintf(" to %q", d.Message.RoutingKey)
	}
	if d.Reason != "" {
		s += " reason " + d.Reason
	}
	return s
}

// Ack returns the decision to ack a delivery whose chain returned err:
// processed when err is nil, a duplicate when it is [ErrDuplicate] (its
// Reason is the layer that recognised it, [DuplicateLayer]).
func Ack(err error) Decision {
	if IsDuplicate(err) {
		return Decision{Action: ActionAck, Outcome: OutcomeDuplicate, Reason: DuplicateLayer(err)}
	}
	return Decision{Action: ActionAck, Outcome: OutcomeProcessed, Err: err}
}

// Sender publishes a message and returns once the broker confirmed it
// ([*Publisher] is one). The failure policy and the Bloom router take a
// Sender, not a *Publisher, so a test or an adapter can stand in.
type Sender interface {
	Publish(ctx context.Context, m Message) error
}

// DelayQueue is a queue where a [FailurePolicy] parks deliveries that
// should run again later: each message carries [HeaderDue], and the
// queue holds the messages of one Delay, so it is ordered by due time.
type DelayQueue struct {
	Name  string
	Delay time.Duration
}

// DelayedRetries is implemented by a [FailurePolicy] that parks
// deliveries in delay queues (retry.Policy does). The consumer releases
// them: it consumes each of queue's delay queues with a bounded prefetch
// (ConsumerConfig.Release), holds each delivery until it is due,
// republishes it to queue through the Sender (confirmed), then acks it.
// A crash in between gives it back to the delay queue, to be released
// again under the same message ID: a duplicate the dedup guard or the
// inbox absorbs, never a loss. No message TTL and no broker
// dead-lettering is involved, so a delayed retry comes back on time
// after a broker restart too. A nil Sender or no queues: nothing to
// release.
//
// A policy that wraps another must forward DelayQueues (with
// [DelayQueuesOf]): otherwise the consumer releases nothing and the
// wrapped policy's retries wait in their queues until a consumer that
// does release them runs.
type DelayedRetries interface {
	DelayQueues(queue string) (Sender, []DelayQueue)
}

// DelayQueuesOf returns p's delay queues for queue when p parks
// deliveries in delay queues ([DelayedRetries]), else nil.
func DelayQueuesOf(p FailurePolicy, queue string) (Sender, []DelayQueue) {
	if dr, ok := p.(DelayedRetries); ok {
		return dr.DelayQueues(queue)
	}
	return nil, nil
}

// Run describes one run of a delivery's handler chain, the input of
// [FailurePolicy.Decide].
type Run struct {
	// Err is what the chain returned.
	Err error
	// N is the run number in this process, from 1 (quick retries run the
	// chain again).
	N int
	// Stopping says the handler's context had ended: the consumer is
	// shutting down or its channel is gone. Not the message's fault.
	Stopping bool
}

// FailurePolicy decides what happens to a delivery: before its handler
// chain runs (Admit), after each run (Decide), and after a publish it
// decided failed (PublishFailed). Its methods are pure: they read their
// arguments and the policy's config and return a [Decision]; the consumer
// carries it out. The policy sits outside every layer — the dedup guard,
// the inbox — so their deferrals and rejections reach it; nothing can be
// installed outside it ([Pipeline]).
//
// retry.Policy is idemq's policy (delayed retries through retry queues, a
// dead-letter queue with reasons); [BasePolicy] is the default.
type FailurePolicy interface {
	// Admit is asked before the chain runs. It may normalise d (drop
	// forged headers) and return ok=false with a decision to settle d
	// without running it (a delivery limit reached).
	Admit(d *Delivery) (dec Decision, ok bool)
	// Decide returns the decision for d after run r.
	Decide(d *Delivery, r Run) Decision
	// PublishFailed returns the decision for d after dec's publish failed
	// with err. It never returns dec itself unchanged (no loop).
	PublishFailed(d *Delivery, dec Decision, err error) Decision
}

// ErrDuplicate is what a layer of defence (the dedup guard, the inbox)
// returns for a delivery it recognised as a duplicate: the handler did not
// run, the consumer acks it and counts a duplicate. Wrap it with %w to add
// context; match it with [IsDuplicate].
var ErrDuplicate = errors.New("idemq: duplicate suppressed")

// IsDuplicate reports whether err says the delivery was a duplicate.
func IsDuplicate(err error) bool { return err != nil && errors.Is(err, ErrDuplicate) }

// BasePolicy is the failure policy of a consumer without one: it never
// republishes.
//
//	nil, ErrDuplicate                → ack (processed, duplicate)
//	the consumer is stopping         → requeue at once
//	*RequeueError                    → requeue after its After (a deferral)
//	a dependency unavailable         → requeue after RetryAfter (not an attempt)
//	cut at the ConsumerTimeout bound → requeue at once (what the broker would
//	                                   do a moment later, without closing the
//	                                   channel)
//	any other error                  → reject (nack without requeue: the
//	                                   queue's dead-letter exchange, if any)
//
// It runs the chain once (no quick retry) and admits every delivery.
type BasePolicy struct {
	// RetryAfter is how long a delivery whose dependency was unavailable
	// waits before it is given back, when its error does not say.
	// Default 1s (the consumer sets it from BreakerConfig.RetryAfter).
	RetryAfter time.Duration
}

// Admit admits every delivery.
func (BasePolicy) Admit(*Delivery) (Decision, bool) { return Decision{}, true }

// Decide implements [FailurePolicy].
func (p BasePolicy) Decide(d *Delivery, r Run) Decision {
	err := r.Err
	if err == nil || IsDuplicate(err) {
		return Ack(err)
	}
	var re *RequeueError
	switch {
	case errors.As(err, &re):
		out := OutcomeDeferred
		if IsUnavailable(err) {
			out = OutcomeUnavailable
		}
		if r.Stopping {
			return Decision{Action: ActionRequeue, Outcome: OutcomeStopped, Reason: re.Reason, Err: err}
		}
		return Decision{Action: ActionRequeue, Outcome: out, Delay: re.After, Reason: re.Reason, Err: err}
	case r.Stopping:
		// Cut short by shutdown or a lost channel: it did not fail on its
		// own, so give it back rather than dead-letter it.
		return Decision{Action: ActionRequeue, Outcome: OutcomeStopped, Reason: "shutdown", Err: err}
	case IsUnavailable(err):
		after := p.RetryAfter
		if after <= 0 {
			after = time.Second
		}
		return Decision{Action: ActionRequeue, Outcome: OutcomeUnavailable, Delay: after, Reason: "dependency-unavailable", Err: err}
	case cutAtConsumerTimeout(err):
		return Decision{Action: ActionRequeue, Outcome: OutcomeDeferred, Reason: "consumer-timeout", Err: err}
	}
	return Decision{Action: ActionReject, Outcome: OutcomeRejected, Reason: ReasonOf(err), Err: err}
}

// PublishFailed never happens: BasePolicy decides no publish. It gives
// the delivery back.
func (p BasePolicy) PublishFailed(_ *Delivery, dec Decision, err error) Decision {
	return Decision{Action: ActionRequeue, Outcome: OutcomeDeferred, Delay: time.Second, Reason: "publish-failed", Err: err}
}

// cutAtConsumerTimeout reports whether err is a handler cut at the
// ConsumerTimeout bound (not at HandlerTimeout, which is a plain failure).
func cutAtConsumerTimeout(err error) bool {
	var te *HandlerTimeoutError
	return errors.As(err, &te) && te.ConsumerTimeout
}
