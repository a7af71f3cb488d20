// Package deadletter reads and replays dead-letter queues: what `idemq dlq`
// does, as a library (the CLI is a thin layer over it).
//
// Reading never removes anything: messages are taken with basic.get without
// an ack and given back when the channel closes. Dead letters are
// at-least-once — a consumer killed between the dead letter's confirm and
// its own ack dead-letters the delivery again — so every view collapses the
// copies of one failure (same work queue, same message ID) into one entry
// that counts its duplicates, and a replay republishes one copy and drops
// the others.
//
// A replay goes, by default, to the work queue the dead-letter queue
// belongs to, through the default exchange — never to an exchange or
// routing key read from the message's headers, which any producer can set
// (and a replay to a fanout or topic exchange would deliver the message
// again to every bound queue, applying it again in other consumer groups).
// Sending anywhere else is an explicit choice ([RouteOriginal],
// [RouteFixed]).
package deadletter

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/headerval"
	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/retry"
	"github.com/idemq/idemq/topology"
)

// Suffix is the suffix of a dead-letter queue's name under the topology
// convention ([topology.DLQName]).
const Suffix = ".dlq"

// WorkQueue returns the work queue of a dead-letter queue named by the
// topology convention ("<queue>.dlq"), or ok=false for another name.
func WorkQueue(dlq string) (queue string, ok bool) {
	q, ok := strings.CutSuffix(dlq, Suffix)
	return q, ok && q != "" && topology.DLQName(q) == dlq
}

// Entry is a dead letter as its headers describe it.
type Entry struct {
	// Position of the message (of its first copy) in the queue, from 1.
	Position  int    `json:"position"`
	MessageID string `json:"message_id"`
	// Duplicates counts the further copies of this dead letter (same work
	// queue and message ID) that were collapsed into it.
	Duplicates         int    `json:"duplicates,omitempty"`
	Reason             string `json:"reason"`
	ErrorClass         string `json:"error_class,omitempty"`
	Error              string `json:"error,omitempty"`
	Attempts           int64  `json:"attempts"`
	FirstFailure       string `json:"first_failure,omitempty"`
	LastFailure        string `json:"last_failure,omitempty"`
	OriginalExchange   string `json:"original_exchange"`
	OriginalRoutingKey string `json:"original_routing_key"`
	Group              string `json:"group,omitempty"`
	// Queue is the work queue the message was dead-lettered from (the
	// x-idemq-queue header, else the broker's x-death), "" when unknown.
	Queue        string         `json:"queue,omitempty"`
	ContentType  string         `json:"content_type,omitempty"`
	BodyBytes    int            `json:"body_bytes"`
	Body         string         `json:"body,omitempty"`
	BodyEncoding string         `json:"body_encoding,omitempty"`
	Headers      map[string]any `json:"headers,omitempty"`
	Deaths       []retry.Death  `json:"x_death,omitempty"`

	// Routable: the headers name an original exchange and routing key.
	Routable bool `json:"-"`
	// idKey is the message ID duplicates share ("" when there is none).
	idKey string
}

// Key is what the copies of one dead letter share: the work queue and the
// message ID (the x-idemq-original-message-id header when the retry
// package had to give the dead letter a new ID, else the AMQP message_id).
// "" when the message has no ID: such messages are never collapsed.
func (e *Entry) Key() string {
	if e.idKey == "" {
		return ""
	}
	return e.Queue + "\x00" + e.idKey
}

func hstr(h amqp.Table, k string) (string, bool) {
	switch v := h[k].(type) {
	case string:
		return v, true
	case []byte:
		return string(v), true
	}
	return "", false
}

// Read describes d, at position pos of its queue. The idemq headers come
// first; the broker's x-death fills in what the broker dead-lettered by
// itself. With detail, the body and every header are included.
func Read(pos int, d *amqp.Delivery, detail bool) *Entry {
	h := d.Headers
	e := &Entry{Position: pos, MessageID: d.MessageId, ContentType: d.ContentType, BodyBytes: len(d.Body), idKey: d.MessageId}
	if orig, ok := hstr(h, idemq.HeaderOriginalMessageID); ok && orig != "" {
		e.idKey = orig
	}
	deaths := retry.ParseXDeath(h[idemq.HeaderDeath])
	e.Reason, _ = hstr(h, idemq.HeaderReason)
	if e.Reason == "" {
		e.Reason = "unknown"
		if len(deaths) > 0 && deaths[0].Reason != "" {
			e.Reason = "broker:" + deaths[0].Reason
		}
	}
	e.ErrorClass, _ = hstr(h, idemq.HeaderErrorClass)
	e.Error, _ = hstr(h, idemq.HeaderError)
	if n, ok := headerval.Count(h[idemq.HeaderAttempts]); ok {
		e.Attempts = n
	}
	e.FirstFailure, _ = hstr(h, idemq.HeaderFirstFailure)
	e.LastFailure, _ = hstr(h, idemq.HeaderLastFailure)
	e.Group, _ = hstr(h, idemq.HeaderGroup)
	e.Queue, _ = hstr(h, idemq.HeaderQueue)
	ex, okEx := hstr(h, idemq.HeaderOriginalExchange)
	rk, okRK := hstr(h, idemq.HeaderOriginalRoutingKey)
	if okEx && okRK {
		e.OriginalExchange, e.OriginalRoutingKey, e.Routable = ex, rk, true
	} else if len(deaths) > 0 {
		// The broker dead-lettered it: the oldest x-death entry is last.
		first := deaths[len(deaths)-1]
		if len(first.RoutingKeys) > 0 {
			e.OriginalExchange, e.OriginalRoutingKey, e.Routable = first.Exchange, first.RoutingKeys[0], true
		}
		if e.Queue == "" {
			e.Queue = first.Queue
		}
	}
	if detail {
		if utf8.Valid(d.Body) {
			e.Body, e.BodyEncoding = string(d.Body), "utf8"
		} else {
			e.Body, e.BodyEncoding = base64.StdEncoding.EncodeToString(d.Body), "base64"
		}
		e.Headers = map[string]any{}
		for k, v := range h {
			if k == idemq.HeaderPublishSeq {
				continue // the publisher's per-channel bookkeeping, meaningless here
			}
			e.Headers[k] = v
		}
		e.Deaths = deaths
	}
	return e
}

// Conn is a connection and a channel for dead-letter queues.
type Conn struct {
	conn *amqp.Connection
	ch   *amqp.Channel
}

// Open connects to the broker at url. Errors name the URL redacted.
func Open(url string) (*Conn, error) {
	if _, err := amqp.ParseURI(url); err != nil {
		// amqp091-go's parse error quotes the URL, password included.
		return nil, fmt.Errorf("invalid AMQP URL %s: want amqp[s]://user:password@host:port/vhost", redact.URL(url))
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", redact.URL(url), err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("open channel: %w", err)
	}
	return &Conn{conn: conn, ch: ch}, nil
}

// Close closes the connection, giving back every message taken and not
// acked.
func (c *Conn) Close() error { return c.conn.Close() }

// Count returns the number of ready messages of queue (which must exist).
func (c *Conn) Count(queue string) (int, error) {
	q, err := c.ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("dead-letter queue %q: %w", queue, err)
	}
	return q.Messages, nil
}

// Purge deletes every ready message of queue and returns how many.
func (c *Conn) Purge(queue string) (int, error) {
	n, err := c.ch.QueuePurge(queue, false)
	if err != nil {
		return 0, fmt.Errorf("purge %s: %w", queue, err)
	}
	return n, nil
}

// onOwnChannel runs f on a channel of its own, closed afterwards (a
// failed declare closes its channel).
func (c *Conn) onOwnChannel(f func(ch *amqp.Channel) error) error {
	ch, err := c.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	return f(ch)
}

// queueExists checks queue with a passive declare on a channel of its own.
func (c *Conn) queueExists(queue string) error {
	return c.onOwnChannel(func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err
	})
}

// peek takes up to the queue's current count of messages without acking
// them, calling visit for each; visit returns false to stop. The unacked
// ones go back when the connection closes.
func (c *Conn) peek(ctx context.Context, queue string, visit func(pos int, d *amqp.Delivery) (bool, error)) (int, error) {
	total, err := c.Count(queue)
	if err != nil {
		return 0, err
	}
	var last uint64
	defer func() {
		// Give back the ones not acked now, in order, with one nack: left to the
		// connection's close, a quorum queue returns them after the
		// close (a command right after can miss them) and may reorder
		// them. Each one counts as a delivery on a quorum queue (see
		// topology.DLQDeliveryLimit).
		if last != 0 {
			_ = c.ch.Nack(0, true, true) // tag 0, multiple: every one not acked
		}
	}()
	for pos := 1; pos <= total; pos++ {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		d, ok, err := c.ch.Get(queue, false)
		if err != nil {
			return total, fmt.Errorf("get from %q: %w", queue, err)
		}
		if !ok {
			break
		}
		last = d.DeliveryTag
		more, err := visit(pos, &d)
		if err != nil {
			return total, err
		}
		if !more {
			break
		}
	}
	return total, nil
}

// Filter selects dead letters (nil: all).
type Filter func(*Entry) bool

// ListOptions are the options of [Conn.List].
type ListOptions struct {
	Filter Filter
	// Limit bounds the entries returned (distinct dead letters); 0: all.
	Limit int
	// Detail includes bodies and headers.
	Detail bool
}

// List returns the dead letters of dlq without removing any, one entry per
// dead letter: the copies of one failure (see [Entry.Key]) are collapsed
// into the first, which counts them in Duplicates. total is the number of
// messages in the queue (copies included).
func (c *Conn) List(ctx context.Context, dlq string, opts ListOptions) (total int, entries []*Entry, err error) {
	byKey := map[string]*Entry{}
	entries = []*Entry{}
	total, err = c.peek(ctx, dlq, func(pos int, d *amqp.Delivery) (bool, error) {
		e := Read(pos, d, opts.Detail)
		if k := e.Key(); k != "" {
			if first, ok := byKey[k]; ok {
				first.Duplicates++
				return true, nil
			}
			byKey[k] = e
		}
		if opts.Filter == nil || opts.Filter(e) {
			entries = append(entries, e)
		}
		return opts.Limit <= 0 || len(entries) < opts.Limit, nil
	})
	return total, entries, err
}

// Route says where a replay sends dead letters.
type Route int

const (
	// RouteWorkQueue (the default): the work queue the dead-letter queue
	// belongs to, through the default exchange. A dead letter whose headers
	// say it came from another queue is refused.
	RouteWorkQueue Route = iota
	// RouteOriginal: the exchange and routing key recorded in the message's
	// headers (x-idemq-original-*, else the broker's x-death). Headers a
	// producer can forge; a fanout or topic exchange delivers the message
	// to every bound queue again.
	RouteOriginal
	// RouteFixed: ReplayOptions.Exchange and RoutingKey.
	RouteFixed
)

// Publisher publishes a message and returns once the broker confirmed it
// (an [*idemq.Publisher]).
type Publisher interface {
	Publish(ctx context.Context, m idemq.Message) error
}

// ReplayOptions are the options of [Conn.Replay].
type ReplayOptions struct {
	// DLQ is the dead-letter queue. Required.
	DLQ string
	// WorkQueue is the queue the dead-letter queue belongs to: the
	// destination of RouteWorkQueue, checked to exist. Default: derived
	// from DLQ by the topology convention (see [WorkQueue]); required for
	// RouteWorkQueue when DLQ has another name.
	WorkQueue string
	// Route: RouteWorkQueue (default), RouteOriginal or RouteFixed.
	Route Route
	// Exchange and RoutingKey of RouteFixed.
	Exchange, RoutingKey string
	// Filter selects the dead letters to replay (nil: all). The others
	// stay in place.
	Filter Filter
	// Limit bounds the dead letters replayed; 0: all.
	Limit int
	// Rate bounds replays per second; 0: no bound.
	Rate float64
	// DryRun changes nothing: it reports what a replay would do.
	DryRun bool
	// AllowSyntheticID replays dead letters whose message had no valid ID
	// (reason missing-id or invalid-id): they carry a synthetic UUID the
	// policy gave them, and a replay is processed — and deduplicated —
	// under that UUID, not under a business key. Default false: they are
	// left in the dead-letter queue and reported as failed with the reason
	// (`idemq dlq replay --allow-synthetic-id`).
	AllowSyntheticID bool
	// Publisher republishes (required unless DryRun).
	Publisher Publisher
	// PublishTimeout bounds one republish. Default 30s.
	PublishTimeout time.Duration
	// Progress is called after each replay. Optional.
	Progress func()
	// Now is the clock of the replayed-at header. Default time.Now.
	Now func() time.Time
}

// Item is one dead letter of a replay.
type Item struct {
	MessageID  string `json:"message_id"`
	Reason     string `json:"reason"`
	Exchange   string `json:"exchange"`
	RoutingKey string `json:"routing_key"`
	Error      string `json:"error,omitempty"`
}

// ReplayResult is the outcome of a replay.
type ReplayResult struct {
	Queue  string `json:"queue"`
	DryRun bool   `json:"dry_run"`
	// Replayed: republished (confirmed), then acked from the queue.
	Replayed []Item `json:"replayed"`
	// Duplicates: further copies of a replayed dead letter, acked (dropped)
	// without a republish.
	Duplicates []Item `json:"duplicates_dropped"`
	// Skipped: not selected by the filter; left in place.
	Skipped int `json:"skipped"`
	// Failed: could not be replayed; left in place.
	Failed []Item `json:"failed"`
	// DuplicatesLeft: copies of a failed dead letter, left in place with it.
	DuplicatesLeft int `json:"duplicates_left,omitempty"`
}

// ErrNotReplayed is wrapped by the error of a replay that left dead
// letters behind because they could not be replayed.
var ErrNotReplayed = errors.New("deadletter: dead letters could not be replayed")

// Replay republishes the dead letters of opts.DLQ (only those present when
// it starts) and acks each one from the queue after its republish was
// confirmed: an interruption can duplicate a replay (same message ID: the
// dedup guard sees one message), never lose a dead letter. The copies of a
// dead letter already replayed are acked without a republish and counted
// in Duplicates. The republished message keeps its ID, body, properties
// and headers, less the failure-flow headers (x-idemq-*, x-death,
// x-delivery-count), so its attempt count starts again, plus
// x-idemq-replayed-at.
//
// The error is non-nil when the queue could not be read, the destination
// is missing, or (wrapping [ErrNotReplayed]) some dead letters failed; the
// result is meaningful in every case.
func (c *Conn) Replay(ctx context.Context, opts ReplayOptions) (ReplayResult, error) {
	res := ReplayResult{Queue: opts.DLQ, DryRun: opts.DryRun, Replayed: []Item{}, Duplicates: []Item{}, Failed: []Item{}}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.PublishTimeout <= 0 {
		opts.PublishTimeout = 30 * time.Second
	}
	if opts.Rate < 0 {
		return res, errors.New("deadletter: Rate must be >= 0")
	}
	if !opts.DryRun && opts.Publisher == nil {
		return res, errors.New("deadletter: a Publisher is required")
	}
	switch opts.Route {
	case RouteWorkQueue:
		if opts.WorkQueue == "" {
			q, ok := WorkQueue(opts.DLQ)
			if !ok {
				return res, fmt.Errorf("deadletter: cannot tell the work queue of %q (not named <queue>%s): name it", opts.DLQ, Suffix)
			}
			opts.WorkQueue = q
		}
		if opts.WorkQueue == opts.DLQ {
			return res, fmt.Errorf("deadletter: work queue %q is the dead-letter queue itself", opts.DLQ)
		}
		if err := c.queueExists(opts.WorkQueue); err != nil {
			return res, fmt.Errorf("deadletter: work queue %q of %q: %w", opts.WorkQueue, opts.DLQ, err)
		}
	case RouteOriginal:
	case RouteFixed:
		if opts.Exchange == "" && opts.RoutingKey == "" {
			return res, errors.New("deadletter: RouteFixed needs an exchange or a routing key")
		}
	default:
		return res, fmt.Errorf("deadletter: unknown route %d", opts.Route)
	}
	var interval time.Duration
	if opts.Rate > 0 {
		interval = time.Duration(float64(time.Second) / opts.Rate)
	}
	start := time.Now()
	replayed := map[string]bool{} // keys replayed in this run
	failed := map[string]bool{}   // keys that failed in this run
	_, err := c.peek(ctx, opts.DLQ, func(pos int, d *amqp.Delivery) (bool, error) {
		e := Read(pos, d, false)
		fail := func(item Item) {
			res.Failed = append(res.Failed, item)
			if k := e.Key(); k != "" {
				failed[k] = true
			}
		}
		limited := opts.Limit > 0 && len(res.Replayed) >= opts.Limit
		k := e.Key()
		if k != "" && replayed[k] {
			item := Item{MessageID: d.MessageId, Reason: e.Reason}
			if !opts.DryRun {
				if err := d.Ack(false); err != nil {
					return false, fmt.Errorf("ack duplicate %q from %s: %w", d.MessageId, opts.DLQ, err)
				}
			}
			res.Duplicates = append(res.Duplicates, item)
			return true, nil
		}
		if k != "" && failed[k] {
			res.DuplicatesLeft++
			return true, nil
		}
		if limited {
			// Past the limit: only the copies of what was replayed go.
			return true, nil
		}
		if opts.Filter != nil && !opts.Filter(e) {
			res.Skipped++
			return true, nil
		}
		item := Item{MessageID: d.MessageId, Reason: e.Reason}
		if !opts.AllowSyntheticID && (e.Reason == idemq.ReasonMissingID || e.Reason == idemq.ReasonInvalidID) {
			item.Error = fmt.Sprintf("dead-lettered as %s: %q is a synthetic ID the failure policy gave it, and a replay is processed "+
				"and deduplicated under it, not under a business key; replay anyway with --allow-synthetic-id", e.Reason, d.MessageId)
			fail(item)
			return true, nil
		}
		switch opts.Route {
		case RouteWorkQueue:
			item.Exchange, item.RoutingKey = "", opts.WorkQueue
			if e.Queue != "" && e.Queue != opts.WorkQueue {
				item.Error = fmt.Sprintf("dead-lettered from queue %q, not %q (the work queue of %s): not replayed there; "+
					"send it elsewhere explicitly (original route or a fixed exchange/routing key)", e.Queue, opts.WorkQueue, opts.DLQ)
				fail(item)
				return true, nil
			}
		case RouteOriginal:
			item.Exchange, item.RoutingKey = e.OriginalExchange, e.OriginalRoutingKey
			if !e.Routable {
				item.Error = "no original exchange/routing key in its headers"
				fail(item)
				return true, nil
			}
		case RouteFixed:
			item.Exchange, item.RoutingKey = opts.Exchange, opts.RoutingKey
		}
		if opts.DryRun {
			res.Replayed = append(res.Replayed, item)
			if k != "" {
				replayed[k] = true
			}
			return true, nil
		}
		if interval > 0 {
			next := start.Add(time.Duration(len(res.Replayed)) * interval)
			if wait := time.Until(next); wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
					return false, ctx.Err()
				}
			}
		}
		pctx, cancel := context.WithTimeout(ctx, opts.PublishTimeout)
		err := opts.Publisher.Publish(pctx, Republish(d, item.Exchange, item.RoutingKey, opts.Now()))
		cancel()
		if err != nil {
			item.Error = err.Error()
			fail(item)
			return ctx.Err() == nil, nil
		}
		if err := d.Ack(false); err != nil {
			return false, fmt.Errorf("message %q was republished but its ack from %s failed (it stays there; a second replay would duplicate it): %w", d.MessageId, opts.DLQ, err)
		}
		if k != "" {
			replayed[k] = true
		}
		res.Replayed = append(res.Replayed, item)
		if opts.Progress != nil {
			opts.Progress()
		}
		return true, nil
	})
	if err != nil {
		return res, err
	}
	if len(res.Failed) > 0 {
		return res, fmt.Errorf("%w: %d left in %s", ErrNotReplayed, len(res.Failed), opts.DLQ)
	}
	return res, nil
}

// Republish is the copy of dead letter d a replay publishes to exchange and
// routingKey: same ID, body and properties, the failure-flow headers
// (x-idemq-*, x-death, x-first/last-death-*, x-delivery-count) removed — so
// the attempt count starts again — and x-idemq-replayed-at added.
func Republish(d *amqp.Delivery, exchange, routingKey string, now time.Time) idemq.Message {
	h := amqp.Table{}
	for k, v := range d.Headers {
		if strings.HasPrefix(k, idemq.HeaderPrefix) || k == idemq.HeaderDeath || k == idemq.HeaderDeliveryCount ||
			strings.HasPrefix(k, "x-first-death-") || strings.HasPrefix(k, "x-last-death-") {
			continue
		}
		h[k] = v
	}
	h[idemq.HeaderReplayedAt] = now.UTC().Format(headerval.TimeFormat)
	return idemq.MessageOf(d, exchange, routingKey, h)
}
