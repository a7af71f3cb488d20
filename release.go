package idemq

import (
	"context"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/internal/release"
)

// ReleaseConfig configures how a [Consumer] releases the delay queues of
// its failure policy ([DelayedRetries]): retry.Policy parks a delivery
// that should run again later in "<queue>.retry.<ms>", stamped with
// [HeaderDue]; the consumer takes it from there when it is due,
// republishes it to its work queue (confirmed) and acks it. Every
// consumer of a queue releases its delay queues, so they drain as long as
// one runs. The zero value is usable.
type ReleaseConfig struct {
	// Disabled leaves the delay queues to the broker: only delay queues
	// declared with message TTLs and dead-lettering back to the work
	// queue (topology retry_route: dead-letter) return deliveries by
	// themselves. With the default retry queues nothing returns while no
	// consumer releases them.
	Disabled bool
	// Prefetch bounds the deliveries held per delay queue. Default 200.
	Prefetch int
	// Publishers bounds the concurrent republishes per delay queue.
	// Default 16.
	Publishers int
}

func (c ReleaseConfig) withDefaults() ReleaseConfig {
	if c.Prefetch <= 0 {
		c.Prefetch = 200
	}
	if c.Publishers <= 0 {
		c.Publishers = 16
	}
	return c
}

// lateRelease is how late a release must be to count as late.
const lateRelease = time.Second

// startRelease starts releasing the policy's delay queues on conn; nil
// when there is nothing to release. The caller stops it.
func (c *Consumer) startRelease(ctx context.Context, conn *amqp.Connection) *release.Releaser {
	send, dqs := DelayQueuesOf(c.policy, c.cfg.Queue)
	if c.cfg.Release.Disabled {
		if send != nil && len(dqs) > 0 && c.releaseWarned.CompareAndSwap(false, true) {
			c.log.Warn("idemq: Release.Disabled: this consumer does not release its delay queues; with the default retry queues (no TTL) delayed retries wait until a consumer that does runs",
				"delay_queues", len(dqs))
		}
		return nil
	}
	if send == nil || len(dqs) == 0 {
		return nil
	}
	qs := make([]release.Queue, len(dqs))
	for i, q := range dqs {
		qs[i] = release.Queue{Name: q.Name, Delay: q.Delay}
	}
	var hold time.Duration
	if c.cfg.ConsumerTimeout > 0 {
		hold = c.cfg.ConsumerTimeout - c.cfg.ConsumerTimeoutMargin
	}
	work := c.cfg.Queue
	// Not cancelled with Run's context: Stop (at the session's end, after
	// the work queue drained) stops it, letting republishes in flight
	// finish and ack for up to ShutdownTimeout.
	r, err := release.Start(context.WithoutCancel(ctx), conn, release.Config{
		Queues:     qs,
		DueHeader:  HeaderDue,
		Prefetch:   c.cfg.Release.Prefetch,
		Publishers: c.cfg.Release.Publishers,
		HoldLimit:  hold,
		Tag:        c.cfg.ConsumerTag,
		Logger:     c.log,
		Publish: func(ctx context.Context, d *amqp.Delivery) error {
			return send.Publish(ctx, released(d, work))
		},
		Released: func(late time.Duration) {
			c.rec.Add(CountReleased, 1)
			if late > lateRelease {
				c.rec.Add(CountReleasedLate, 1)
			}
		},
		Failed: func(error) { c.rec.Add(CountReleaseFailed, 1) },
	})
	if err != nil { // only a programming error: Publish and DueHeader are set
		c.log.Error("idemq: cannot release delay queues", "err", err)
		return nil
	}
	return r
}

// released is the message that hands d, taken from a delay queue, back to
// the work queue: the same ID, body and properties, without the due time
// and the broker's delivery count.
func released(d *amqp.Delivery, queue string) Message {
	h := make(amqp.Table, len(d.Headers))
	for k, v := range d.Headers {
		h[k] = v
	}
	delete(h, HeaderDue)
	delete(h, HeaderDeliveryCount)
	delete(h, HeaderPublishSeq)
	id := d.MessageId
	if err := ValidateID(id); err != nil {
		// Not parked by idemq (its retries keep a valid ID): handed back
		// under a fresh ID, marked so the failure policy dead-letters it
		// before any handler runs, with the original ID recorded.
		reason := ReasonInvalidID
		if id == "" {
			reason = ReasonMissingID
		} else {
			h[HeaderOriginalMessageID] = truncateID(id)
		}
		id = NewMessageID()
		h[HeaderDeadLetterHeld] = reason
		h[HeaderQueue] = queue
		if _, ok := h[HeaderRequeues]; !ok {
			h[HeaderRequeues] = int64(1) // with HeaderQueue: idemq's own path
		}
	}
	m := MessageOf(d, "", queue, h)
	m.ID = id
	return m
}

// truncateID bounds an invalid ID kept in a header.
func truncateID(id string) string {
	const limit = 512
	if len(id) <= limit {
		return id
	}
	return id[:limit]
}
