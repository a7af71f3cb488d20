package retry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/backoff"
	"github.com/idemq/idemq/topology"
)

// Config configures [Policy]. The zero value is usable (but without a
// Publisher it can neither delay nor dead-letter; see the package doc).
type Config struct {
	// Publisher republishes to retry queues and the dead-letter queue, with
	// confirms. Required for delayed retries and dead letters.
	Publisher *idemq.Publisher
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
	// 0 disables the check. [ForTopology] sets it to the quorum queue's
	// x-delivery-limit, so the policy acts one delivery before the broker
	// would drop the message without idemq's headers.
	DeliveryLimit int
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
	// PublishRetryAfter is the After of the Requeue returned when a
	// republish fails. Default 1s.
	PublishRetryAfter time.Duration
	// Logger; default slog.Default().
	Logger *slog.Logger
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

// maxHeaderText bounds each string header the policy writes besides the
// error text (names, routing keys, times).
const maxHeaderText = 255

// maxOriginalIDText bounds x-idemq-original-message-id (an invalid ID may
// be of any length).
const maxOriginalIDText = 512

// ForTopology returns cfg with Delays, DeadLetterQueue and DeliveryLimit
// taken from q's plan (the same one [topology.Declare] declares), unless cfg
// sets them already, and Plan set to it so [Config.Validate] (and
// [NewPolicy]) can check what cfg sets itself against the topology.
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

func (c *Config) defaults() {
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
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// ErrConfig is wrapped by every error [Config.Validate] returns.
var ErrConfig = errors.New("retry: invalid configuration")

// Validate reports a configuration whose republishes could never succeed,
// so it fails at startup rather than at the first failed delivery: a
// non-positive delay, and — when Plan is set ([ForTopology]) — a delay
// without its retry queue in the topology, or a dead-letter queue other
// than the topology's (including one when the topology has none). It
// cannot see the broker: a queue deleted later is handled at run time
// (the delivery is rejected to the broker, never looped).
func (c Config) Validate() error {
	c.defaults()
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
	return fmt.Errorf("%w: %w", ErrConfig, errors.Join(errs...))
}

// NewPolicy validates cfg ([Config.Validate]) and returns the
// failure-policy middleware; prefer it to [Policy], which does not check.
func NewPolicy(cfg Config) (idemq.Middleware, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return Policy(cfg), nil
}

// Policy returns the failure-policy middleware without validating cfg (see
// [NewPolicy]). Install it outside the dedup guard and the inbox (so their
// Requeue and Reject errors reach it).
func Policy(cfg Config) idemq.Middleware {
	cfg.defaults()
	var pub publishFunc
	if cfg.Publisher != nil {
		pub = cfg.Publisher.Publish
	}
	return func(next idemq.Handler) idemq.Handler {
		return &policy{cfg: cfg, next: next, pub: pub}
	}
}

// publishFunc publishes with confirms ([idemq.Publisher.Publish]).
type publishFunc func(ctx context.Context, m idemq.Message) error

type policy struct {
	cfg  Config
	next idemq.Handler
	pub  publishFunc // nil without a Publisher
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

func (p *policy) run(ctx context.Context, d *idemq.Delivery) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &idemq.PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return p.next.Handle(ctx, d)
}

func (p *policy) Handle(ctx context.Context, d *idemq.Delivery) error {
	stripForged(d)
	if p.cfg.DeliveryLimit > 0 {
		if n, ok := DeliveryCount(d.Headers); ok && n >= int64(p.cfg.DeliveryLimit) {
			cause := fmt.Errorf("x-delivery-count %d reached the delivery limit %d", n, p.cfg.DeliveryLimit)
			return p.deadLetter(ctx, d, idemq.ReasonDeliveryLimit, cause, Attempt(d.Headers))
		}
	}
	var err error
	for i := 0; i < p.cfg.QuickAttempts; i++ {
		if i > 0 {
			if backoff.Sleep(ctx, p.cfg.QuickBackoff.Delay(i-1)) != nil {
				break
			}
		}
		err = p.run(ctx, d)
		if err == nil {
			return nil
		}
		if idemq.IsUnavailable(err) && ctx.Err() == nil {
			return p.unavailable(ctx, d, err) // not an attempt: see unavailable.go
		}
		var rq *idemq.RequeueError
		if idemq.IsPermanent(err) || errors.As(err, &rq) || ctx.Err() != nil {
			break
		}
	}
	if ctx.Err() != nil {
		// Shutting down or the channel is gone: no decision now. The
		// delivery is not acked, the broker gives it back.
		return idemq.Requeue(0, "shutdown", err)
	}
	var rq *idemq.RequeueError
	switch {
	case idemq.IsPermanent(err):
		return p.deadLetter(ctx, d, idemq.ReasonOf(err), err, Attempt(d.Headers))
	case errors.As(err, &rq):
		return p.requeue(ctx, d, rq, err)
	}
	attempt := Attempt(d.Headers)
	if attempt >= p.cfg.MaxAttempts || len(p.cfg.Delays) == 0 {
		return p.deadLetter(ctx, d, idemq.ReasonMaxAttempts, err, attempt)
	}
	return p.retry(ctx, d, err, attempt)
}

func (p *policy) delay(attempt int) time.Duration {
	i := attempt - 1
	if i >= len(p.cfg.Delays) {
		i = len(p.cfg.Delays) - 1
	}
	if i < 0 {
		i = 0
	}
	return p.cfg.Delays[i]
}

// retry republishes to the retry queue of attempt and returns nil once
// confirmed.
func (p *policy) retry(ctx context.Context, d *idemq.Delivery, cause error, attempt int) error {
	if p.pub == nil {
		return cause
	}
	if err := idemq.ValidateID(republishID(d)); err != nil {
		// A retry must come back under the same ID (the dedup guard keys
		// on it); without a valid one no republish can succeed, and a new
		// ID would make it another message. Dead-letter it now.
		p.cfg.Logger.Error("idemq/retry: delivery has no valid message ID; dead-lettering instead of retrying",
			"queue", d.Queue, "attempt", attempt, "err", err)
		return p.deadLetter(ctx, d, idReason(err), fmt.Errorf("%w (not retried: %w)", cause, err), attempt)
	}
	now := p.cfg.Now()
	delay := p.delay(attempt)
	h := p.failureHeaders(d, cause, now)
	h[idemq.HeaderAttempt] = int64(attempt + 1)
	q := p.cfg.RetryQueue(d.Queue, delay)
	if err := p.publish(ctx, republish(d, "", q, h)); err != nil {
		if unpublishable(err) {
			// The retry queue does not exist (Delays and the declared
			// topology disagree), or the message cannot be sent as it is:
			// waiting would not help, and requeueing would loop.
			// Dead-letter it with the reason handler-error.
			p.cfg.Logger.Error("idemq/retry: cannot republish to the retry queue, ever; dead-lettering instead (declare it with topology.Declare)",
				"message_id", d.MessageID, "retry_queue", q, "err", err)
			return p.deadLetter(ctx, d, idemq.ReasonHandlerError,
				fmt.Errorf("%w (not retried: retry queue %q: %w)", cause, q, err), attempt)
		}
		p.cfg.Logger.Error("idemq/retry: cannot republish to the retry queue; the delivery comes back later",
			"message_id", d.MessageID, "retry_queue", q, "err", err)
		return idemq.Requeue(p.cfg.PublishRetryAfter, "retry-publish-failed", err)
	}
	idemq.RecorderFrom(ctx).Add(idemq.CountRetried, 1)
	p.cfg.Logger.Info("idemq/retry: delivery failed; retrying later",
		"message_id", d.MessageID, "queue", d.Queue, "attempt", attempt, "next_attempt", attempt+1,
		"delay", delay, "err", Truncate(cause.Error(), p.cfg.ErrorTextLimit))
	return nil
}

// roomToRequeue says whether an in-place requeue of d leaves its quorum
// delivery count well below DeliveryLimit. On RabbitMQ 3.x every requeue
// counts as a delivery, so a delivery deferred in place again and again
// would reach the limit and be dead-lettered without ever running; past
// half the limit it is republished to its work queue instead, which starts
// the count again.
func (p *policy) roomToRequeue(d *idemq.Delivery) bool {
	n, ok := DeliveryCount(d.Headers)
	return !ok || p.cfg.DeliveryLimit <= 0 || n < int64(p.cfg.DeliveryLimit/2)
}

func (p *policy) requeue(ctx context.Context, d *idemq.Delivery, rq *idemq.RequeueError, cause error) error {
	if p.pub == nil || (rq.InPlace && p.roomToRequeue(d)) {
		return cause // the consumer requeues it after rq.After
	}
	if idemq.ValidateID(republishID(d)) != nil {
		// Cannot be republished under its own ID: it waits in place (the
		// inner layer decides when the deferral ends; a quorum queue's
		// DeliveryLimit bounds it).
		return cause
	}
	// In place with its delivery count spent: republished to the work
	// queue itself, which starts the count again; the next deferrals are in
	// place (and wait) again. Not through a retry queue: what the broker
	// dead-letters out of a TTL queue it may drop in a restart.
	q, delay := d.Queue, time.Duration(0)
	if !rq.InPlace {
		if len(p.cfg.Delays) == 0 {
			return cause
		}
		delay = p.cfg.Delays[len(p.cfg.Delays)-1]
		found := false
		for _, dl := range p.cfg.Delays {
			if dl >= rq.After && (!found || dl < delay) {
				delay, found = dl, true
			}
		}
		q = p.cfg.RetryQueue(d.Queue, delay)
	}
	h := copyHeaders(d.Headers)
	setOriginal(h, d)
	h[idemq.HeaderQueue] = d.Queue // with x-idemq-requeues: the marker of idemq's own path
	n, _ := Int(h[idemq.HeaderRequeues])
	h[idemq.HeaderRequeues] = n + 1
	bound(h, p.cfg.ErrorTextLimit)
	if err := p.publish(ctx, republish(d, "", q, h)); err != nil {
		// Not an attempt: whatever the error, the delivery waits in place
		// and the inner layer decides again when it comes back (it ends
		// when the lease or the outage does; DeliveryLimit bounds it on a
		// quorum queue). Never dead-lettered for a deferral.
		lvl := slog.LevelWarn
		if unpublishable(err) {
			lvl = slog.LevelError
		}
		p.cfg.Logger.Log(ctx, lvl, "idemq/retry: cannot republish a requeued delivery; the consumer requeues it in place",
			"message_id", d.MessageID, "queue", q, "err", err)
		return cause
	}
	idemq.RecorderFrom(ctx).Add(idemq.CountRetried, 1)
	p.cfg.Logger.Debug("idemq/retry: delivery sent back for later (not an attempt)",
		"message_id", d.MessageID, "reason", rq.Reason, "queue", q, "delay", delay)
	return nil
}

func (p *policy) deadLetter(ctx context.Context, d *idemq.Delivery, reason string, cause error, attempts int) error {
	q := p.cfg.DeadLetterQueue(d.Queue)
	if q == "" {
		// No dead-letter queue (topology dlq: "-"): "no DLQ" means no DLQ.
		// The consumer rejects it; the broker drops it unless the work
		// queue has a dead-letter exchange of its own.
		idemq.RecorderFrom(ctx).Add(CountNoDeadLetterQueue, 1)
		p.cfg.Logger.Warn("idemq/retry: delivery failed for good and there is no dead-letter queue; rejecting it to the broker",
			"message_id", d.MessageID, "queue", d.Queue, "reason", reason, "attempts", attempts,
			"err", Truncate(errText(cause), p.cfg.ErrorTextLimit))
		return idemq.Reject(reason, cause)
	}
	if p.pub == nil {
		return idemq.Reject(reason, cause)
	}
	now := p.cfg.Now()
	h := p.failureHeaders(d, cause, now)
	delete(h, idemq.HeaderAttempt)
	h[idemq.HeaderReason] = reason
	h[idemq.HeaderAttempts] = int64(attempts)
	h[idemq.HeaderDeadLetteredAt] = now.UTC().Format(TimeFormat)
	msg := republish(d, "", q, h)
	if idemq.ValidateID(msg.ID) != nil {
		if d.MessageID != "" {
			h[idemq.HeaderOriginalMessageID] = Truncate(d.MessageID, maxOriginalIDText)
		}
		msg.ID = idemq.NewMessageID()
	}
	err := p.publish(ctx, msg)
	if errors.Is(err, idemq.ErrMessageTooLarge) {
		// The message's own headers leave no room for idemq's: dead-letter
		// it with only the reason and the attempt count.
		p.cfg.Logger.Warn("idemq/retry: dead letter too large with idemq's headers; sending it without them",
			"message_id", d.MessageID, "dlq", q, "reason", reason, "err", err)
		mh := minimalHeaders(d.Headers, reason, attempts)
		if v, ok := h[idemq.HeaderOriginalMessageID]; ok {
			mh[idemq.HeaderOriginalMessageID] = v
		}
		msg.Headers = mh
		err = p.publish(ctx, msg)
	}
	if err != nil {
		if unpublishable(err) {
			// The dead-letter queue is gone, or the message cannot be sent
			// even without idemq's headers: no wait can fix it. Reject it
			// to the broker (its dead-letter exchange, if any, takes it),
			// never requeue it in a loop.
			idemq.RecorderFrom(ctx).Add(CountUnpublishable, 1)
			p.cfg.Logger.Error("idemq/retry: cannot publish the dead letter, ever; rejecting the delivery to the broker",
				"message_id", d.MessageID, "queue", d.Queue, "dlq", q, "reason", reason, "attempts", attempts, "err", err)
			return idemq.Reject(reason, fmt.Errorf("%w; dead letter to %q not published: %w", cause, q, err))
		}
		p.cfg.Logger.Error("idemq/retry: cannot publish the dead letter; the delivery comes back later",
			"message_id", d.MessageID, "dlq", q, "reason", reason, "err", err)
		return idemq.Requeue(p.cfg.PublishRetryAfter, "retry-publish-failed", err)
	}
	idemq.RecorderFrom(ctx).Add(idemq.CountDeadLettered, 1)
	p.cfg.Logger.Warn("idemq/retry: delivery dead-lettered",
		"message_id", d.MessageID, "queue", d.Queue, "dlq", q, "reason", reason, "attempts", attempts,
		"err", Truncate(errText(cause), p.cfg.ErrorTextLimit))
	return nil
}

func (p *policy) publish(ctx context.Context, m idemq.Message) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.PublishTimeout)
	defer cancel()
	return p.pub(ctx, m)
}

func (p *policy) failureHeaders(d *idemq.Delivery, cause error, now time.Time) amqp.Table {
	h := copyHeaders(d.Headers)
	setOriginal(h, d)
	ts := now.UTC().Format(TimeFormat)
	if _, ok := strOK(h[idemq.HeaderFirstFailure]); !ok {
		h[idemq.HeaderFirstFailure] = ts
	}
	h[idemq.HeaderLastFailure] = ts
	h[idemq.HeaderError] = Truncate(errText(cause), p.cfg.ErrorTextLimit)
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

// republish builds the message that carries d to exchange/key with headers h.
func republish(d *idemq.Delivery, exchange, key string, h amqp.Table) idemq.Message {
	return idemq.Message{
		ID:              d.LogID(), // the ID the consumer decided, when valid
		Exchange:        exchange,
		RoutingKey:      key,
		Body:            d.Body,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		Headers:         h,
		CorrelationID:   d.CorrelationID,
		ReplyTo:         d.ReplyTo,
		Type:            d.Type,
		AppID:           d.AppID,
		Priority:        d.Priority,
		Timestamp:       d.Timestamp,
	}
}

// Counter names the policy records (besides idemq.CountRetried and
// idemq.CountDeadLettered).
const (
	// CountUnpublishable: deliveries rejected to the broker (nack without
	// requeue) because no republish could ever succeed — the dead-letter
	// queue does not exist, the headers cannot be encoded or do not fit
	// the frame size.
	CountUnpublishable = "retry_unpublishable"
	// CountNoDeadLetterQueue: failed deliveries rejected to the broker
	// because the policy has no dead-letter queue (topology dlq: "-").
	CountNoDeadLetterQueue = "retry_no_dlq"
)
