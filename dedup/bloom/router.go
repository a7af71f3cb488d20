package bloom

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
)

// ReasonSuspectedDuplicate is the reason the router writes (idemq.HeaderReason).
const ReasonSuspectedDuplicate = idemq.ReasonSuspectedDuplicate

// RequeueSuspectPublish is the requeue reason when the suspected-duplicate
// publish failed.
const RequeueSuspectPublish = "suspect-publish-failed"

// RouterConfig configures [SuspectRouter].
type RouterConfig struct {
	// Publisher publishes the suspects (with confirms). Required.
	Publisher *idemq.Publisher
	// Queue receives the suspects (published through the default
	// exchange). Default "<delivery queue>.suspected". Declare it, e.g.
	// with [SuspectQueueSetup] as the publisher's Setup.
	Queue string
	// RetryAfter is how long a delivery waits before it comes back when the
	// publish failed. Default 5s.
	RetryAfter time.Duration
	// Timeout bounds one publish (confirm included). Default 30s.
	Timeout time.Duration
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// SuspectRouter returns a middleware that sits outside dedup.Guard: when
// the chain below it returns an error wrapping [ErrSuspectedDuplicate]
// (the guard returns the store's claim error inside an idemq.RejectError), it
// publishes a copy of the delivery — body, properties, headers, plus
// x-idemq-reason=suspected-duplicate, the dedup key and the original
// queue/exchange/routing key — to the suspected-duplicate queue, counts
// CountSuspectedRouted, and returns nil (ack) only once the broker
// confirmed the copy. A failed publish returns an idemq.RequeueError: the
// delivery comes back, it is never dropped. Any other error passes
// through unchanged.
//
// Replay: move the messages back to the work queue once the verifier, or
// an operator, has decided (`idemq` shovel, or Forget + republish).
func SuspectRouter(cfg RouterConfig) idemq.Middleware {
	if cfg.Publisher == nil {
		panic("bloom.SuspectRouter: nil Publisher")
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = 5 * time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return func(next idemq.Handler) idemq.Handler {
		return idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
			err := next.Handle(ctx, d)
			var sde *SuspectedDuplicateError
			if err == nil || !errors.As(err, &sde) {
				return err
			}
			return route(ctx, cfg, d, sde)
		})
	}
}

func route(ctx context.Context, cfg RouterConfig, d *idemq.Delivery, sde *SuspectedDuplicateError) error {
	queue := cfg.Queue
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
	msg := idemq.Message{
		ID:              suspectID(d, sde.Key),
		RoutingKey:      queue,
		Body:            d.Body,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		Headers:         headers,
		CorrelationID:   d.CorrelationID,
		ReplyTo:         d.ReplyTo,
		Type:            d.Type,
		AppID:           d.AppID,
		Priority:        d.Priority,
		Timestamp:       d.Timestamp,
		Transient:       d.DeliveryMode == amqp.Transient,
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.Timeout)
	defer cancel()
	log := cfg.Logger.With("key", sde.Key, "queue", queue)
	if err := cfg.Publisher.Publish(pctx, msg); err != nil {
		log.Warn("idemq: bloom: publishing a suspected duplicate failed; delivery requeued", "err", err, "after", cfg.RetryAfter)
		return idemq.Requeue(cfg.RetryAfter, RequeueSuspectPublish, fmt.Errorf("bloom: route suspected duplicate %q to %q: %w", sde.Key, queue, err))
	}
	idemq.RecorderFrom(ctx).Add(CountSuspectedRouted, 1)
	log.Warn("idemq: bloom: suspected duplicate moved to the suspected-duplicate queue for review")
	return nil
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
