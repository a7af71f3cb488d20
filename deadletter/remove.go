package deadletter

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/headerval"
)

// ArchiveSuffix is appended to a dead-letter queue's name to name its
// archive queue ([ArchiveName]).
const ArchiveSuffix = ".archive"

// ArchiveName is the archive queue of dead-letter queue dlq: "<dlq>.archive".
func ArchiveName(dlq string) string { return dlq + ArchiveSuffix }

// HeaderArchivedAt is set on an archived dead letter: when it was archived.
const HeaderArchivedAt = "x-idemq-archived-at"

// RemoveOptions are the options of [Conn.Remove].
type RemoveOptions struct {
	// DLQ is the dead-letter queue. Required.
	DLQ string
	// ArchiveTo is the queue the removed dead letters are copied to before
	// they are acked (headers and body kept, [HeaderArchivedAt] added),
	// declared durable if missing; "" deletes them. Archiving needs a
	// Publisher, and a message ID on every message (one without is left in
	// place, reported failed).
	ArchiveTo string
	// Filter selects the dead letters to remove (nil: all present when
	// Remove starts). The copies of a removed dead letter (same
	// [Entry.Key]) go with it.
	Filter Filter
	// Limit bounds the dead letters removed (copies not counted); 0: all.
	Limit int
	// Publisher copies to ArchiveTo (an [*idemq.Publisher]).
	Publisher Publisher
	// PublishTimeout bounds one copy. Default 30s.
	PublishTimeout time.Duration
	// Progress is called after each message removed. Optional.
	Progress func()
	// Now is the clock of the archived-at header. Default time.Now.
	Now func() time.Time
}

// RemoveResult is the outcome of [Conn.Remove].
type RemoveResult struct {
	Queue     string `json:"queue"`
	ArchiveTo string `json:"archive_to,omitempty"`
	// Removed counts the dead letters removed (archived or deleted),
	// Copies their further copies removed with them.
	Removed int `json:"removed"`
	Copies  int `json:"copies"`
	// Skipped: not selected; left in place.
	Skipped int `json:"skipped"`
	// Failed: could not be archived; left in place.
	Failed []Item `json:"failed"`
}

// Remove deletes, or archives to another queue, the dead letters of
// opts.DLQ that opts.Filter selects (only those present when it starts).
// An archived message is acked only after its copy was confirmed: an
// interruption can leave a message in both queues, never in neither. To
// delete everything, [Conn.Purge] is one broker call.
func (c *Conn) Remove(ctx context.Context, opts RemoveOptions) (RemoveResult, error) {
	res := RemoveResult{Queue: opts.DLQ, ArchiveTo: opts.ArchiveTo, Failed: []Item{}}
	if opts.DLQ == "" {
		return res, errors.New("deadletter: DLQ is required")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.PublishTimeout <= 0 {
		opts.PublishTimeout = 30 * time.Second
	}
	if opts.ArchiveTo != "" {
		if opts.Publisher == nil {
			return res, errors.New("deadletter: archiving needs a Publisher")
		}
		if opts.ArchiveTo == opts.DLQ {
			return res, fmt.Errorf("deadletter: archive queue %q is the dead-letter queue itself", opts.DLQ)
		}
		if err := c.declareArchive(opts.ArchiveTo); err != nil {
			return res, err
		}
	}
	removed := map[string]bool{}
	_, err := c.peek(ctx, opts.DLQ, func(pos int, d *amqp.Delivery) (bool, error) {
		e := Read(pos, d, false)
		k := e.Key()
		copyOf := k != "" && removed[k]
		if !copyOf {
			if opts.Limit > 0 && res.Removed >= opts.Limit || opts.Filter != nil && !opts.Filter(e) {
				res.Skipped++
				return true, nil
			}
		}
		if opts.ArchiveTo != "" {
			pctx, cancel := context.WithTimeout(ctx, opts.PublishTimeout)
			err := opts.Publisher.Publish(pctx, Archived(d, opts.ArchiveTo, opts.Now()))
			cancel()
			if err != nil {
				res.Failed = append(res.Failed, Item{MessageID: d.MessageId, Reason: e.Reason, RoutingKey: opts.ArchiveTo, Error: err.Error()})
				return ctx.Err() == nil, nil
			}
		}
		if err := d.Ack(false); err != nil {
			return false, fmt.Errorf("ack %q from %s: %w", d.MessageId, opts.DLQ, err)
		}
		if copyOf {
			res.Copies++
		} else {
			res.Removed++
			if k != "" {
				removed[k] = true
			}
		}
		if opts.Progress != nil {
			opts.Progress()
		}
		return true, nil
	})
	if err != nil {
		return res, err
	}
	if len(res.Failed) > 0 {
		return res, fmt.Errorf("%w: %d not archived, left in %s", ErrNotReplayed, len(res.Failed), opts.DLQ)
	}
	return res, nil
}

func (c *Conn) declareArchive(queue string) error {
	return c.onOwnChannel(func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
			return fmt.Errorf("deadletter: declare archive queue %q: %w", queue, err)
		}
		return nil
	})
}

// Archived is the copy of dead letter d that [Conn.Remove] sends to queue
// (through the default exchange): everything kept — ID, body, properties,
// every header but the publisher's bookkeeping — and [HeaderArchivedAt]
// added.
func Archived(d *amqp.Delivery, queue string, now time.Time) idemq.Message {
	h := amqp.Table{}
	for k, v := range d.Headers {
		if k == idemq.HeaderPublishSeq {
			continue
		}
		h[k] = v
	}
	h[HeaderArchivedAt] = now.UTC().Format(headerval.TimeFormat)
	return idemq.MessageOf(d, "", queue, h)
}
