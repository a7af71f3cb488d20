package bloom

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/sender"
)

// ReasonSuspectedDuplicate is the reason the router writes (idemq.HeaderReason).
const ReasonSuspectedDuplicate = idemq.ReasonSuspectedDuplicate

// RequeueSuspectPublish is the Reason of the decision to wait in place
// when the suspected-duplicate publish failed.
const RequeueSuspectPublish = "suspect-publish-failed"

// RouterConfig configures a [Router].
type RouterConfig struct {
	// Policy is the failure policy the router decorates: it decides every
	// delivery that is not a suspected duplicate. Default
	// idemq.BasePolicy{} (use a retry.Policy).
	Policy idemq.FailurePolicy
	// Sender publishes the suspects, with confirms (an *idemq.Publisher).
	// Required.
	Sender idemq.Sender
	// Queue receives the suspects (published through the default
	// exchange). Default "<delivery queue>.suspected". Declare it, e.g.
	// with [SuspectQueueSetup] as the publisher's Setup.
	Queue string
	// RetryAfter is how long a delivery waits in its queue when the
	// publish failed. Default 5s.
	RetryAfter time.Duration
	// Timeout bounds one publish (confirm included). Default 30s.
	Timeout time.Duration
}

func (c RouterConfig) withDefaults() RouterConfig {
	if c.Policy == nil {
		c.Policy = idemq.BasePolicy{}
	}
	if c.RetryAfter <= 0 {
		c.RetryAfter = 5 * time.Second
	}
	if c.Timeout <= 0 {
		c.Timeout = 30 * time.Second
	}
	return c
}

// Validate reports a configuration the router cannot run with: no Sender.
// Its error wraps [ErrInvalidConfig].
func (c RouterConfig) Validate() error {
	if c.Sender == nil {
		return fmt.Errorf("%w: RouterConfig: nil Sender", ErrInvalidConfig)
	}
	return nil
}

// Router is a failure policy ([idemq.FailurePolicy]) around another one:
// when the chain returned an error wrapping [ErrSuspectedDuplicate] (the
// guard returns the store's claim error inside an idemq.RejectError), it
// decides to publish a copy of the delivery — body, properties, headers,
// plus x-idemq-reason=suspected-duplicate, the dedup key and the original
// queue/exchange/routing key — to the suspected-duplicate queue, and to
// ack the delivery once the broker confirmed the copy (counted as
// [CountSuspectedRouted]). A failed publish gives the delivery back after
// RetryAfter: it is never dropped. Every other decision is the wrapped
// policy's. Put it in idemq.Pipeline.Policy.
//
// Replay: move the messages back to the work queue once the verifier, or
// an operator, has decided (`idemq` shovel, or Forget + republish).
type Router struct {
	cfg  RouterConfig
	send idemq.Sender
}

var _ idemq.FailurePolicy = (*Router)(nil)

// NewRouter validates cfg, fills its defaults and returns the router.
func NewRouter(cfg RouterConfig) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Router{cfg: cfg, send: sender.WithTimeout(cfg.Sender, cfg.Timeout)}, nil
}

// DelayQueues is the wrapped policy's ([idemq.DelayedRetries]): the
// consumer releases its retry queues.
func (r *Router) DelayQueues(queue string) (idemq.Sender, []idemq.DelayQueue) {
	return idemq.DelayQueuesOf(r.cfg.Policy, queue)
}

// Admit is the wrapped policy's.
func (r *Router) Admit(d *idemq.Delivery) (idemq.Decision, bool) { return r.cfg.Policy.Admit(d) }

// Decide routes a suspected duplicate; anything else is the wrapped
// policy's decision.
func (r *Router) Decide(d *idemq.Delivery, run idemq.Run) idemq.Decision {
	var sde *SuspectedDuplicateError
	if run.Err == nil || run.Stopping || !errors.As(run.Err, &sde) {
		return r.cfg.Policy.Decide(d, run)
	}
	msg := r.suspect(d, sde)
	return idemq.Decision{Action: idemq.ActionPublish, Outcome: idemq.OutcomeRouted, Message: &msg, Sender: r.send,
		Reason: ReasonSuspectedDuplicate, Err: run.Err, Counters: []string{CountSuspectedRouted}}
}

// PublishFailed gives a suspect whose copy was not published back to its
// queue; anything else is the wrapped policy's decision.
func (r *Router) PublishFailed(d *idemq.Delivery, dec idemq.Decision, err error) idemq.Decision {
	if dec.Outcome != idemq.OutcomeRouted || dec.Reason != ReasonSuspectedDuplicate {
		return r.cfg.Policy.PublishFailed(d, dec, err)
	}
	return idemq.Decision{Action: idemq.ActionRequeue, Outcome: idemq.OutcomeDeferred, Delay: r.cfg.RetryAfter,
		Reason: RequeueSuspectPublish, Err: fmt.Errorf("bloom: route suspected duplicate to %q: %w", dec.Message.RoutingKey, err)}
}

// suspect builds the copy of d for the suspected-duplicate queue.
func (r *Router) suspect(d *idemq.Delivery, sde *SuspectedDuplicateError) idemq.Message {
	queue := r.cfg.Queue
	if queue == "" {
		queue = d.Queue + ".suspected"
	}
	headers := amqp.Table{}
	for k, v := range d.Headers {
		headers[k] = v
	}
	headers[idemq.HeaderReason] = ReasonSuspectedDuplicate
	headers[idemq.HeaderDedupKey] = sde.Key
	headers[idemq.HeaderOriginalQueue] = d.Queue
	headers[idemq.HeaderOriginalExchange] = d.Exchange
	headers[idemq.HeaderOriginalRoutingKey] = d.RoutingKey
	m := d.Message("", queue, headers)
	m.ID = suspectID(d, sde.Key)
	return m
}

// suspectID keeps the message ID; a delivery whose ID came from elsewhere
// (a header) gets its dedup key, or that key's SHA-256 when too long.
func suspectID(d *idemq.Delivery, key string) string {
	if id, err := d.ID(); err == nil {
		return id
	}
	if idemq.ValidateID(key) == nil {
		return key
	}
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:])
}

// SuspectQueueSetup returns a publisher Setup that declares durable
// suspected-duplicate queues.
func SuspectQueueSetup(queues ...string) idemq.SetupFunc {
	return func(_ context.Context, ch *amqp.Channel) error {
		for _, q := range queues {
			if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
				return fmt.Errorf("bloom: declare %q: %w", q, err)
			}
		}
		return nil
	}
}
