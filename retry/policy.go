package retry

import (
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/backoff"
	"github.com/idemq/idemq/internal/headerval"
	"github.com/idemq/idemq/internal/sender"
	"github.com/idemq/idemq/topology"
)

// Config configures [Policy]. The zero value is usable (but without a
// Sender it can neither delay nor dead-letter; see the package doc).
type Config struct {
	// Sender republishes to retry queues and the dead-letter queue, with
	// confirms (an *idemq.Publisher). Required for delayed retries and
	// dead letters.
	Sender idemq.Sender
	// QuickAttempts is how many times the handler runs in process for one
	// delivery before a delayed retry (1 = no quick retry). Default 3.
	QuickAttempts int
	// QuickBackoff between quick attempts. Default 10ms doubling to 200ms,
	// with jitter; the wait ends early when the context is done.
	QuickBackoff backoff.Policy
	// Delays are the delayed retries in attempt order: after attempt n fails
	// the delivery waits Delays[n-1] (the last one repeats). Default
	// [topology.DefaultRetryDelays]. Each needs a retry queue
	// ([topology.RetryQueueName]); [ForTopology] keeps them in step.
	Delays []time.Duration
	// MaxAttempts is the number of attempts (deliveries that ran the
	// handler) before the dead-letter queue. Default len(Delays)+1.
	MaxAttempts int
	// DeliveryLimit dead-letters (reason delivery-limit) a delivery whose
	// x-delivery-count is >= DeliveryLimit, before running the handler.
	// [ForTopology] sets it to the quorum queue's x-delivery-limit, so the
	// policy acts one delivery before the broker would drop the message
	// without idemq's headers. When the consumer read a lower limit the
	// broker applies (a policy's, idemq.ConsumerConfig.ManagementURL) the
	// check uses that one; 0 leaves only that one (none: no check).
	DeliveryLimit int
	// RequeueLimit is the broker delivery limit in-place requeues must
	// never walk a delivery into: once x-delivery-count reaches half of
	// it, a deferral is republished (confirmed, then acked) to the work
	// queue instead of nacked with requeue, which starts the count again.
	// Default DeliveryLimit, or [BrokerDefaultDeliveryLimit] when that is
	// 0: RabbitMQ 4.0+ gives every quorum queue a delivery-limit of 20
	// unless one is declared. A limit set by a policy or an operator
	// policy cannot be read over AMQP (a passive declare returns no
	// arguments): give the consumer a management API URL
	// (idemq.ConsumerConfig.ManagementURL), which reads the queue's
	// effective limit at each (re)connect and hands it over with each
	// delivery (idemq.Delivery.QueueDeliveryLimit); the policy then uses
	// the smaller of the two. Without one, set RequeueLimit when a policy
	// sets a lower limit.
	RequeueLimit int
	// DeadLetterQueue names the dead-letter queue of a work queue.
	// Default [topology.DLQName] ("<queue>.dlq"). An empty name means no
	// dead-letter queue (topology dlq: "-"): a delivery that fails for
	// good is rejected to the broker (nack without requeue), which drops
	// it unless the work queue has a dead-letter exchange of its own.
	DeadLetterQueue func(queue string) string
	// RetryQueue names the delay queue of a work queue for one delay.
	// Default [topology.RetryQueueName] ("<queue>.retry.<ms>").
	RetryQueue func(queue string, delay time.Duration) string
	// ErrorTextLimit bounds x-idemq-error in bytes. Default 1024, at most
	// [MaxErrorTextLimit] (the headers idemq adds must stay far below the
	// broker's frame_max).
	ErrorTextLimit int
	// PublishTimeout bounds one republish (with its confirm). Default 30s.
	PublishTimeout time.Duration
	// PublishRetryAfter is how long a delivery waits in its queue when a
	// republish failed for a reason that passes. Default 1s.
	PublishRetryAfter time.Duration
	// Now is the clock (tests). Default time.Now.
	Now func() time.Time
	// Plan is the topology of the work queue, set by [ForTopology]. When
	// set, [Config.Validate] checks that every delay has its retry queue
	// and that the dead-letter queue is the one the topology declares.
	Plan *topology.Plan
}

// MaxErrorTextLimit caps [Config.ErrorTextLimit]; every other header the
// policy writes is capped at [maxHeaderText] bytes, so what it adds to a
// message stays within a few KiB whatever the handler's error says.
const MaxErrorTextLimit = 4096

// BrokerDefaultDeliveryLimit is the delivery-limit RabbitMQ 4.0 and later
// give a quorum queue that declares none (3.x: unlimited).
const BrokerDefaultDeliveryLimit = 20

// maxHeaderText bounds each string header the policy writes besides the
// error text (names, routing keys, times).
const maxHeaderText = 255

// maxOriginalIDText bounds x-idemq-original-message-id (an invalid ID may
// be of any length).
const maxOriginalIDText = 512

// ForTopology returns cfg with Delays, DeadLetterQueue and DeliveryLimit
// taken from q's plan (the same one [topology.Declare] declares), unless cfg
// sets them already, and Plan set to it so [Config.Validate] (and
// [New]) can check what cfg sets itself against the topology.
// MaxAttempts is left to its default (len(Delays)+1) unless set. A queue
// with dlq "-" gets no dead-letter queue: the policy rejects to the broker.
func ForTopology(q topology.Queue, cfg Config) Config {
	p := topology.ForQueue(q)
	cfg.Plan = &p
	if cfg.Delays == nil {
		cfg.Delays = p.Delays
		if cfg.Delays == nil {
			cfg.Delays = []time.Duration{} // NoRetry: no delayed retries
		}
	}
	if cfg.DeadLetterQueue == nil {
		dlq := p.DLQ // "" when the topology has none
		cfg.DeadLetterQueue = func(string) string { return dlq }
	}
	if cfg.DeliveryLimit == 0 {
		cfg.DeliveryLimit = p.DeliveryLimit
	}
	return cfg
}

// withDefaults returns c with every unset field at its default.
func (c Config) withDefaults() Config {
	if c.QuickAttempts <= 0 {
		c.QuickAttempts = 3
	}
	if c.QuickBackoff.Min <= 0 {
		c.QuickBackoff.Min = 10 * time.Millisecond
	}
	if c.QuickBackoff.Max <= 0 {
		c.QuickBackoff.Max = 200 * time.Millisecond
	}
	if c.Delays == nil {
		c.Delays = topology.DefaultRetryDelays
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = len(c.Delays) + 1
	}
	if c.DeadLetterQueue == nil {
		c.DeadLetterQueue = topology.DLQName
	}
	if c.RequeueLimit <= 0 {
		c.RequeueLimit = c.DeliveryLimit
	}
	if c.RequeueLimit <= 0 {
		c.RequeueLimit = BrokerDefaultDeliveryLimit
	}
	if c.RetryQueue == nil {
		c.RetryQueue = topology.RetryQueueName
	}
	if c.ErrorTextLimit <= 0 {
		c.ErrorTextLimit = 1024
	}
	if c.ErrorTextLimit > MaxErrorTextLimit {
		c.ErrorTextLimit = MaxErrorTextLimit
	}
	if c.PublishTimeout <= 0 {
		c.PublishTimeout = 30 * time.Second
	}
	if c.PublishRetryAfter <= 0 {
		c.PublishRetryAfter = time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// ErrInvalidConfig is wrapped by every error [Config.Validate] returns.
var ErrInvalidConfig = idemq.ConfigErrorClass("retry: invalid configuration")

// Validate reports a configuration whose republishes could never succeed,
// so it fails at startup rather than at the first failed delivery: a
// non-positive delay, and — when Plan is set ([ForTopology]) — a delay
// without its retry queue in the topology, or a dead-letter queue other
// than the topology's (including one when the topology has none). It
// cannot see the broker: a queue deleted later is handled at run time
// (the delivery is rejected to the broker, never looped).
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	for i, d := range c.Delays {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("Delays[%d] = %v: a delay must be positive", i, d))
		}
	}
	if p := c.Plan; p != nil {
		have := map[string]bool{}
		names := make([]string, 0, len(p.Retries))
		for _, r := range p.Retries {
			have[r.Name] = true
			names = append(names, r.Name)
		}
		for _, d := range c.Delays {
			if d <= 0 {
				continue
			}
			if q := c.RetryQueue(p.Queue, d); !have[q] {
				errs = append(errs, fmt.Errorf("delay %v needs retry queue %q, which the topology of %q does not declare (its retry queues: %v); add %v to its retry_delays or drop it from Delays",
					d, q, p.Queue, names, d))
			}
		}
		switch dlq := c.DeadLetterQueue(p.Queue); {
		case dlq == p.DLQ:
		case p.DLQ == "":
			errs = append(errs, fmt.Errorf("dead-letter queue %q: the topology of %q declares none (dlq: \"-\")", dlq, p.Queue))
		default:
			errs = append(errs, fmt.Errorf("dead-letter queue %q: the topology of %q declares %q", dlq, p.Queue, p.DLQ))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
}

// Policy is idemq's failure policy: an [idemq.FailurePolicy] whose
// decisions are pure functions of the delivery, the run and the config
// (see the package doc for the table). Create it with [New] and put it in
// idemq.Pipeline.Policy; the consumer carries its decisions out.
type Policy struct {
	cfg  Config
	send idemq.Sender // cfg.Sender bounded by PublishTimeout; nil without one
}

var _ idemq.FailurePolicy = (*Policy)(nil)

// New validates cfg ([Config.Validate]), fills its defaults and returns
// the policy.
func New(cfg Config) (*Policy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	p := &Policy{cfg: cfg}
	if cfg.Sender != nil {
		p.send = sender.WithTimeout(cfg.Sender, cfg.PublishTimeout)
	}
	return p, nil
}

// Config returns the effective configuration (defaults filled).
func (p *Policy) Config() Config { return p.cfg }

var _ idemq.DelayedRetries = (*Policy)(nil)

// DelayQueues implements [idemq.DelayedRetries]: the retry queue of each
// distinct delay, which the consumer of queue releases (every delivery
// the policy parks there carries idemq.HeaderDue). Without a Sender the
// policy parks nothing: nil.
func (p *Policy) DelayQueues(queue string) (idemq.Sender, []idemq.DelayQueue) {
	if p.send == nil {
		return nil, nil
	}
	var out []idemq.DelayQueue
	seen := map[string]bool{}
	for _, d := range p.cfg.Delays {
		name := p.cfg.RetryQueue(queue, d)
		if d <= 0 || seen[name] {
			continue
		}
		seen[name] = true
		out = append(out, idemq.DelayQueue{Name: name, Delay: d})
	}
	return p.send, out
}

// unpublishable reports whether a republish error is one no wait can fix:
// the target queue does not exist, the message has no valid ID, its
// headers cannot be encoded or do not fit the frame size.
func unpublishable(err error) bool {
	return errors.Is(err, idemq.ErrUnroutable) || errors.Is(err, idemq.ErrMissingMessageID) ||
		errors.Is(err, idemq.ErrInvalidMessageID) || errors.Is(err, idemq.ErrInvalidHeaders) ||
		errors.Is(err, idemq.ErrMessageTooLarge)
}

// idReason is the dead-letter reason of an invalid message ID.
func idReason(err error) string {
	if errors.Is(err, idemq.ErrMissingMessageID) {
		return idemq.ReasonMissingID
	}
	return idemq.ReasonInvalidID
}

// Admit drops forged x-idemq-* headers (see [FromRetryPath]) and
// dead-letters, before the handler runs, a delivery held back because its
// dead letter could not be routed (x-idemq-dead-letter-held) and one whose
// x-delivery-count reached DeliveryLimit.
func (p *Policy) Admit(d *idemq.Delivery) (idemq.Decision, bool) {
	stripForged(d)
	if reason, ok := strOK(d.Headers[idemq.HeaderDeadLetterHeld]); ok {
		return p.deadLetterHeld(d, reason), false
	}
	if limit := p.deliveryLimit(d); limit > 0 {
		if n, ok := DeliveryCount(d.Headers); ok && n >= int64(limit) {
			cause := fmt.Errorf("x-delivery-count %d reached the delivery limit %d", n, limit)
			return p.deadLetter(d, idemq.ReasonDeliveryLimit, cause, Attempt(d.Headers)), false
		}
	}
	return idemq.Decision{}, true
}

// Decide implements [idemq.FailurePolicy]:
//
//	nil, idemq.ErrDuplicate           → ack
//	a dependency unavailable          → given back in place, not an attempt
//	transient, run < QuickAttempts    → run again after QuickBackoff
//	the consumer is stopping          → given back at once
//	permanent (Permanent, Reject)     → dead letter with its reason
//	*idemq.RequeueError               → deferred (in place, or a retry queue)
//	attempt >= MaxAttempts, no Delays → dead letter, reason max-attempts
//	otherwise                         → retry queue of this attempt, attempt+1
func (p *Policy) Decide(d *idemq.Delivery, r idemq.Run) idemq.Decision {
	err := r.Err
	if err == nil || idemq.IsDuplicate(err) {
		return idemq.Ack(err)
	}
	if idemq.IsUnavailable(err) && !r.Stopping {
		return p.unavailable(d, err)
	}
	var rq *idemq.RequeueError
	deferred := errors.As(err, &rq)
	if !idemq.IsPermanent(err) && !deferred && !r.Stopping && r.N < p.cfg.QuickAttempts {
		return idemq.Decision{Action: idemq.ActionRunAgain, Delay: p.cfg.QuickBackoff.Delay(r.N - 1), Err: err}
	}
	attempt := Attempt(d.Headers)
	switch {
	case r.Stopping:
		// Shutting down or the channel is gone: no decision now.
		return idemq.Decision{Action: idemq.ActionRequeue, Outcome: idemq.OutcomeStopped, Reason: "shutdown", Attempt: attempt, Err: err}
	case idemq.IsPermanent(err):
		return p.deadLetter(d, idemq.ReasonOf(err), err, attempt)
	case deferred:
		return p.requeue(d, rq, err)
	case attempt >= p.cfg.MaxAttempts || len(p.cfg.Delays) == 0:
		return p.deadLetter(d, idemq.ReasonMaxAttempts, err, attempt)
	}
	return p.retry(d, err, attempt)
}

// PublishFailed implements [idemq.FailurePolicy]: what happens when the
// republish dec decided failed with err.
//
//	retry, unpublishable          → dead letter, reason handler-error
//	retry, transient              → wait in place PublishRetryAfter, decide again
//	deferral, any error           → wait in place its After (never dead-lettered)
//	dead letter too large         → the same with only reason and attempts headers
//	dead letter unroutable        → held back: republished with x-idemq-dead-letter-held
//	                                (a retry queue, else the work queue), dead-lettered
//	                                again when it comes back, before the handler runs
//	                                (counter retry_dead_letter_held)
//	dead letter unpublishable     → reject to the broker (counter retry_unpublishable)
//	dead letter, transient        → wait in place PublishRetryAfter, decide again
func (p *Policy) PublishFailed(d *idemq.Delivery, dec idemq.Decision, err error) idemq.Decision {
	wait := idemq.Decision{Action: idemq.ActionRequeue, Outcome: idemq.OutcomeDeferred,
		Delay: p.cfg.PublishRetryAfter, Reason: RequeuePublishFailed, Attempt: dec.Attempt, Err: err}
	switch dec.Outcome {
	case idemq.OutcomeRetried:
		if unpublishable(err) {
			// The retry queue does not exist (Delays and the declared
			// topology disagree), or the message cannot be sent as it is:
			// waiting would not help, requeueing would loop.
			return p.deadLetter(d, idemq.ReasonHandlerError,
				fmt.Errorf("%w (not retried: retry queue %q: %w)", dec.Err, dec.Message.RoutingKey, err), dec.Attempt)
		}
		return wait
	case idemq.OutcomeDeferred, idemq.OutcomeUnavailable:
		if dec.Reason == RequeueDeadLetterHeld && errors.Is(err, idemq.ErrUnroutable) && dec.Message.RoutingKey != d.Queue {
			// Holding a dead letter in a retry queue that is gone too:
			// hold it in the work queue itself.
			return p.holdDeadLetter(d, dec, err, true)
		}
		// Not an attempt: whatever the error, the delivery waits in place
		// and the layer that deferred it decides again when it comes back.
		var rq *idemq.RequeueError
		if errors.As(dec.Err, &rq) {
			wait.Delay = rq.After
		}
		wait.Outcome, wait.Reason, wait.Err = dec.Outcome, dec.Reason, fmt.Errorf("%w (republish failed: %w)", dec.Err, err)
		return wait
	case idemq.OutcomeDeadLettered:
		if _, full := dec.Message.Headers[idemq.HeaderError]; full && errors.Is(err, idemq.ErrMessageTooLarge) {
			// The message's own headers leave no room for idemq's: send
			// it with only the reason and the attempt count.
			small := *dec.Message
			h := minimalHeaders(d.Headers, dec.Reason, dec.Attempt)
			if v, ok := dec.Message.Headers[idemq.HeaderOriginalMessageID]; ok {
				h[idemq.HeaderOriginalMessageID] = v
			}
			small.Headers = h
			dec.Message = &small
			return dec
		}
		if errors.Is(err, idemq.ErrUnroutable) {
			// The dead-letter queue is missing, or unavailable (a classic
			// DLQ whose node is down): the broker returns the dead letter.
			// Rejecting would drop it — the work queue's own dead-letter
			// route leads to the same queue — so it is held back until
			// the queue routes again, without running the handler again.
			return p.holdDeadLetter(d, dec, err, false)
		}
		if unpublishable(err) {
			// The message cannot be sent even without idemq's headers:
			// reject it to the broker (its dead-letter exchange, if any,
			// takes it), never loop.
			return idemq.Decision{Action: idemq.ActionReject, Outcome: idemq.OutcomeRejected, Reason: dec.Reason,
				Attempt: dec.Attempt, Err: fmt.Errorf("%w; dead letter to %q not published: %w", dec.Err, dec.Message.RoutingKey, err),
				Counters: []string{CountUnpublishable}}
		}
		return wait
	}
	return wait
}

// RequeueDeadLetterHeld is the Reason of the decision to hold back a
// delivery whose dead letter the broker could not route.
const RequeueDeadLetterHeld = "dead-letter-held"

// holdDeadLetter decides for a delivery whose dead letter (dec) the broker
// returned unroutable: the dead letter is republished, marked with
// x-idemq-dead-letter-held, to the retry queue of the smallest delay of at
// least PublishRetryAfter (or to the work queue itself when there is none,
// or when workQueue is set); when it comes back, [Policy.Admit]
// dead-letters it again. A delivery that is already held waits in place
// (see requeue: its delivery count is kept below RequeueLimit), so its
// marker stays. The handler does not run again.
func (p *Policy) holdDeadLetter(d *idemq.Delivery, dec idemq.Decision, err error, workQueue bool) idemq.Decision {
	cause := fmt.Errorf("%w; dead letter to %q held back: %w", dec.Err, p.cfg.DeadLetterQueue(d.Queue), err)
	_, held := d.Headers[idemq.HeaderDeadLetterHeld]
	if held || idemq.ValidateID(republishID(d)) != nil {
		// Already held (its marker stays when it waits in place), or it
		// cannot be republished under its own ID: it waits in place.
		rq := idemq.RequeueInPlace(p.cfg.PublishRetryAfter, RequeueDeadLetterHeld, cause).(*idemq.RequeueError)
		out := p.requeue(d, rq, cause)
		out.Outcome, out.Counters = idemq.OutcomeDeferred, []string{CountDeadLetterHeld}
		return out
	}
	reason := dec.Reason
	if reason == RequeueDeadLetterHeld { // from a failed hold: the reason is on the message
		reason, _ = strOK(dec.Message.Headers[idemq.HeaderDeadLetterHeld])
	}
	h := amqp.Table{}
	for k, v := range dec.Message.Headers {
		h[k] = v
	}
	h[idemq.HeaderDeadLetterHeld] = reason
	h[idemq.HeaderQueue] = d.Queue
	n, _ := headerval.Count(h[idemq.HeaderRequeues])
	h[idemq.HeaderRequeues] = n + 1 // with x-idemq-queue: the marker of idemq's own path
	bound(h, p.cfg.ErrorTextLimit)
	q := d.Queue
	if !workQueue && len(p.cfg.Delays) > 0 {
		delay, found := p.cfg.Delays[len(p.cfg.Delays)-1], false
		for _, dl := range p.cfg.Delays {
			if dl >= p.cfg.PublishRetryAfter && (!found || dl < delay) {
				delay, found = dl, true
			}
		}
		q = p.cfg.RetryQueue(d.Queue, delay)
		h[idemq.HeaderDue] = p.cfg.Now().Add(delay).UnixMilli()
	}
	msg := republish(d, "", q, h)
	return idemq.Decision{Action: idemq.ActionPublish, Outcome: idemq.OutcomeDeferred, Message: &msg, Sender: p.send,
		Reason: RequeueDeadLetterHeld, Attempt: dec.Attempt, Err: cause, Counters: []string{CountDeadLetterHeld}}
}

// deadLetterHeld dead-letters a delivery that was held back (see
// holdDeadLetter) with the reason and the error it was held with.
func (p *Policy) deadLetterHeld(d *idemq.Delivery, reason string) idemq.Decision {
	text, _ := strOK(d.Headers[idemq.HeaderError])
	attempts, _ := headerval.Count(d.Headers[idemq.HeaderAttempts])
	dec := p.deadLetter(d, reason, heldError(text), int(attempts))
	if dec.Message != nil {
		h := dec.Message.Headers
		delete(h, idemq.HeaderDeadLetterHeld)
		for _, k := range []string{idemq.HeaderErrorClass, idemq.HeaderLastFailure} {
			if v, ok := strOK(d.Headers[k]); ok { // as the failure left them
				h[k] = v
			}
		}
	}
	return dec
}

// heldError is the error a held dead letter was held with, as its
// x-idemq-error header says.
type heldError string

func (e heldError) Error() string { return string(e) }

// RequeuePublishFailed is the Reason of the decision to wait in place
// after a republish failed for a reason that passes.
const RequeuePublishFailed = "retry-publish-failed"

// UnavailableRetryAfter is how long a delivery whose dependency was
// unavailable waits before it is given back, when the error does not say
// (an idemq.RequeueError's After).
const UnavailableRetryAfter = time.Second

// RequeueUnavailable is the Reason of the decision for a dependency
// outage.
const RequeueUnavailable = "dependency-unavailable"

// unavailable decides for a delivery whose chain failed because a
// dependency (the database, the dedup store) could not be reached. That
// is not the message's fault: no quick retry, no attempt+1, no dead
// letter. It is given back in place (x-idemq-attempt unchanged); a quorum
// delivery count past half the DeliveryLimit is reset by republishing to
// the work queue itself (see requeue).
func (p *Policy) unavailable(d *idemq.Delivery, err error) idemq.Decision {
	after := UnavailableRetryAfter
	var rq *idemq.RequeueError
	if errors.As(err, &rq) && rq.After > 0 {
		after = rq.After
	}
	back := idemq.RequeueInPlace(after, RequeueUnavailable, err).(*idemq.RequeueError)
	return p.requeue(d, back, back)
}

func (p *Policy) delay(attempt int) time.Duration {
	i := attempt - 1
	if i >= len(p.cfg.Delays) {
		i = len(p.cfg.Delays) - 1
	}
	if i < 0 {
		i = 0
	}
	return p.cfg.Delays[i]
}

// retry decides a republish to the retry queue of attempt.
func (p *Policy) retry(d *idemq.Delivery, cause error, attempt int) idemq.Decision {
	if p.send == nil {
		return idemq.BasePolicy{}.Decide(d, idemq.Run{Err: cause, N: 1})
	}
	if err := idemq.ValidateID(republishID(d)); err != nil {
		// A retry must come back under the same ID (the dedup guard keys
		// on it); without a valid one no republish can succeed, and a new
		// ID would make it another message. Dead-letter it now.
		return p.deadLetter(d, idReason(err), fmt.Errorf("%w (not retried: %w)", cause, err), attempt)
	}
	h := p.failureHeaders(d, cause, p.cfg.Now())
	h[idemq.HeaderAttempt] = int64(attempt + 1)
	delay := p.delay(attempt)
	h[idemq.HeaderDue] = p.cfg.Now().Add(delay).UnixMilli()
	msg := republish(d, "", p.cfg.RetryQueue(d.Queue, delay), h)
	return idemq.Decision{Action: idemq.ActionPublish, Outcome: idemq.OutcomeRetried, Message: &msg, Sender: p.send,
		Reason: idemq.ReasonOf(cause), Attempt: attempt, Err: cause}
}

// roomToRequeue says whether an in-place requeue of d leaves its quorum
// delivery count well below RequeueLimit. Every requeue (a nack with
// requeue) counts as a delivery on RabbitMQ 3.x and 4.x quorum queues, so
// a delivery deferred in place again and again would reach the broker's
// limit and be dropped or dead-lettered without ever running; from half
// the limit on it is republished to its work queue instead, which starts
// the count again. The limit is [Policy.RequeueLimit]: DeliveryLimit, or
// RabbitMQ 4's default of 20 when the queue declares none (never
// surprised by 20), or the broker's own limit when the consumer read a
// lower one from the management API (a policy's delivery-limit).
func (p *Policy) roomToRequeue(d *idemq.Delivery) bool {
	n, ok := DeliveryCount(d.Headers)
	return !ok || n < int64(p.RequeueLimit(d)/2)
}

// deliveryLimit is the delivery limit Admit checks d against: the smaller
// of Config.DeliveryLimit and the limit the broker applies to d's queue
// when the consumer read it (idemq.Delivery.QueueDeliveryLimit); either
// alone when the other is 0.
func (p *Policy) deliveryLimit(d *idemq.Delivery) int {
	l := p.cfg.DeliveryLimit
	if q := d.QueueDeliveryLimit; q > 0 && (l <= 0 || q < l) {
		l = q
	}
	return l
}

// RequeueLimit is the delivery limit in-place requeues of d are kept
// below: the smaller of Config.RequeueLimit and the limit the broker
// applies to d's queue, when the consumer read it
// (idemq.Delivery.QueueDeliveryLimit, from the management API).
func (p *Policy) RequeueLimit(d *idemq.Delivery) int {
	if l := d.QueueDeliveryLimit; l > 0 && l < p.cfg.RequeueLimit {
		return l
	}
	return p.cfg.RequeueLimit
}

// requeue decides for a deferral (not an attempt): in place, or through a
// republish (a retry queue, or the work queue itself).
func (p *Policy) requeue(d *idemq.Delivery, rq *idemq.RequeueError, cause error) idemq.Decision {
	out := idemq.OutcomeDeferred
	if idemq.IsUnavailable(cause) {
		out = idemq.OutcomeUnavailable
	}
	inPlace := idemq.Decision{Action: idemq.ActionRequeue, Outcome: out, Delay: rq.After, Reason: rq.Reason,
		Attempt: Attempt(d.Headers), Err: cause}
	if p.send == nil || (rq.InPlace && p.roomToRequeue(d)) {
		return inPlace
	}
	if idemq.ValidateID(republishID(d)) != nil {
		// Cannot be republished under its own ID: it waits in place (the
		// inner layer decides when the deferral ends; a quorum queue's
		// DeliveryLimit bounds it).
		return inPlace
	}
	// In place with its delivery count spent: republished to the work
	// queue itself, which starts the count again; the next deferrals are
	// in place (and wait) again. Not through a retry queue: no wait is
	// needed, and a classic retry queue (retry_type: classic)
	// dead-letters at most once, so it could drop it in a restart.
	q, due := d.Queue, time.Time{}
	if !rq.InPlace {
		if len(p.cfg.Delays) == 0 {
			return inPlace
		}
		delay, found := p.cfg.Delays[len(p.cfg.Delays)-1], false
		for _, dl := range p.cfg.Delays {
			if dl >= rq.After && (!found || dl < delay) {
				delay, found = dl, true
			}
		}
		q = p.cfg.RetryQueue(d.Queue, delay)
		due = p.cfg.Now().Add(delay)
	}
	h := copyHeaders(d.Headers)
	setOriginal(h, d)
	h[idemq.HeaderQueue] = d.Queue // with x-idemq-requeues: the marker of idemq's own path
	n, _ := headerval.Count(h[idemq.HeaderRequeues])
	h[idemq.HeaderRequeues] = n + 1
	if !due.IsZero() {
		h[idemq.HeaderDue] = due.UnixMilli()
	}
	bound(h, p.cfg.ErrorTextLimit)
	msg := republish(d, "", q, h)
	inPlace.Action, inPlace.Message, inPlace.Sender, inPlace.Delay = idemq.ActionPublish, &msg, p.send, 0
	return inPlace
}

// deadLetter decides a publish to the dead-letter queue (or a reject to
// the broker when there is none).
func (p *Policy) deadLetter(d *idemq.Delivery, reason string, cause error, attempts int) idemq.Decision {
	reject := idemq.Decision{Action: idemq.ActionReject, Outcome: idemq.OutcomeRejected, Reason: reason, Attempt: attempts, Err: cause}
	q := p.cfg.DeadLetterQueue(d.Queue)
	if q == "" {
		// No dead-letter queue (topology dlq: "-"): "no DLQ" means no DLQ.
		// Rejected to the broker, which drops it unless the work queue has
		// a dead-letter exchange of its own.
		reject.Counters = []string{CountNoDeadLetterQueue}
		return reject
	}
	if p.send == nil {
		return reject
	}
	now := p.cfg.Now()
	h := p.failureHeaders(d, cause, now)
	delete(h, idemq.HeaderAttempt)
	h[idemq.HeaderReason] = reason
	h[idemq.HeaderAttempts] = int64(attempts)
	h[idemq.HeaderDeadLetteredAt] = now.UTC().Format(headerval.TimeFormat)
	msg := republish(d, "", q, h)
	if idemq.ValidateID(msg.ID) != nil {
		if d.MessageID != "" {
			h[idemq.HeaderOriginalMessageID] = headerval.Truncate(d.MessageID, maxOriginalIDText)
		}
		msg.ID = idemq.NewMessageID()
	}
	return idemq.Decision{Action: idemq.ActionPublish, Outcome: idemq.OutcomeDeadLettered, Message: &msg, Sender: p.send,
		Reason: reason, Attempt: attempts, Err: cause}
}

func (p *Policy) failureHeaders(d *idemq.Delivery, cause error, now time.Time) amqp.Table {
	h := copyHeaders(d.Headers)
	setOriginal(h, d)
	ts := now.UTC().Format(headerval.TimeFormat)
	if _, ok := strOK(h[idemq.HeaderFirstFailure]); !ok {
		h[idemq.HeaderFirstFailure] = ts
	}
	h[idemq.HeaderLastFailure] = ts
	h[idemq.HeaderError] = headerval.Truncate(errText(cause), p.cfg.ErrorTextLimit)
	h[idemq.HeaderErrorClass] = idemq.ReasonOf(cause)
	if d.Group != "" {
		h[idemq.HeaderGroup] = d.Group
	}
	h[idemq.HeaderQueue] = d.Queue
	bound(h, p.cfg.ErrorTextLimit)
	return h
}

// setOriginal records where the message was first published, once.
func setOriginal(h amqp.Table, d *idemq.Delivery) {
	if _, ok := strOK(h[idemq.HeaderOriginalExchange]); !ok {
		h[idemq.HeaderOriginalExchange] = d.Exchange
		h[idemq.HeaderOriginalRoutingKey] = d.RoutingKey
	}
	if _, ok := strOK(h[idemq.HeaderOriginalRoutingKey]); !ok {
		h[idemq.HeaderOriginalRoutingKey] = d.RoutingKey
	}
}

func copyHeaders(src amqp.Table) amqp.Table {
	h := amqp.Table{}
	for k, v := range src {
		h[k] = v
	}
	delete(h, idemq.HeaderDeliveryCount)
	delete(h, idemq.HeaderDue) // set again when it goes to a delay queue
	return h
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// republishID is the ID a republish of d carries (see republish).
func republishID(d *idemq.Delivery) string { return republish(d, "", "", nil).ID }

// republish builds the message that carries d to exchange/key with headers
// h. Retries and dead letters are persistent whatever the original's
// delivery mode: a broker restart must not lose a failure.
func republish(d *idemq.Delivery, exchange, key string, h amqp.Table) idemq.Message {
	m := d.Message(exchange, key, h)
	m.Transient = false
	return m
}

// Counter names the policy's decisions add (besides idemq.CountRetried and
// idemq.CountDeadLettered, which the consumer counts from the outcome).
const (
	// CountUnpublishable: deliveries rejected to the broker (nack without
	// requeue) because no republish could ever succeed — the headers
	// cannot be encoded or do not fit the frame size.
	CountUnpublishable = "retry_unpublishable"
	// CountDeadLetterHeld: decisions to hold back a delivery whose dead
	// letter the broker could not route (the dead-letter queue is
	// missing, or unavailable while its node is down); each hold and each
	// failed try again adds one.
	CountDeadLetterHeld = "retry_dead_letter_held"
	// CountNoDeadLetterQueue: failed deliveries rejected to the broker
	// because the policy has no dead-letter queue (topology dlq: "-").
	CountNoDeadLetterQueue = "retry_no_dlq"
)
