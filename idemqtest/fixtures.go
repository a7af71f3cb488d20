package idemqtest

import (
	"context"
	"database/sql"
	"path/filepath"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/sqldb/sqlite"
)

// Clock is a clock a test moves by hand. Safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock at start (the zero time: 2026-01-01 UTC).
func NewClock(start time.Time) *Clock {
	if start.IsZero() {
		start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	return &Clock{now: start}
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// NewStore returns idemq's in-memory dedup store (dedup.Memory) on clock c:
// c.Advance past a lease expires it, past the window forgets a done record.
func NewStore(c *Clock) *dedup.Memory {
	return dedup.NewMemory(dedup.MemoryConfig{Now: c.Now})
}

// LoseRecord deletes the dedup record of message id in group (prefix
// "idemq" unless the guard's Config.Prefix says otherwise), as a store
// that restarted without persistence would.
func LoseRecord(ctx context.Context, s dedup.Inspector, prefix, group, id string) error {
	if prefix == "" {
		prefix = "idemq"
	}
	return s.Forget(ctx, dedup.Key(prefix, group, id))
}

// OpenSQLite opens a SQLite database in a temporary directory of t (no
// server), with the options idemq's inbox needs, closed at the end of t.
func OpenSQLite(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "idemqtest.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// DeliveryOption sets a field of a [NewDelivery].
type DeliveryOption func(d *idemq.Delivery, id *idemq.IDConfig)

// NewDelivery returns a delivery of message id with body, as the consumer
// builds it: queue and group "idemqtest", received now, its ID decided
// from the message ID (WithID for another IDConfig).
func NewDelivery(id string, body []byte, opts ...DeliveryOption) *idemq.Delivery {
	d := &idemq.Delivery{MessageID: id, Body: body, Headers: amqp.Table{}, Queue: "idemqtest", Group: "idemqtest",
		RoutingKey: "idemqtest", ReceivedAt: time.Now()}
	var idc idemq.IDConfig
	for _, o := range opts {
		if o != nil {
			o(d, &idc)
		}
	}
	idc.Apply(d)
	return d
}

// WithHeader sets a header.
func WithHeader(key string, v any) DeliveryOption {
	return func(d *idemq.Delivery, _ *idemq.IDConfig) { d.Headers[key] = v }
}

// WithRedelivered sets the Redelivered flag (a delivery given back, or
// redelivered after a consumer died).
func WithRedelivered() DeliveryOption {
	return func(d *idemq.Delivery, _ *idemq.IDConfig) { d.Redelivered = true }
}

// WithQueue sets the queue (and the group, unless WithGroup follows).
func WithQueue(q string) DeliveryOption {
	return func(d *idemq.Delivery, _ *idemq.IDConfig) { d.Queue, d.Group, d.RoutingKey = q, q, q }
}

// WithGroup sets the consumer group.
func WithGroup(g string) DeliveryOption {
	return func(d *idemq.Delivery, _ *idemq.IDConfig) { d.Group = g }
}

// WithDeliveryCount sets x-delivery-count, as a quorum queue does.
func WithDeliveryCount(n int64) DeliveryOption {
	return WithHeader(idemq.HeaderDeliveryCount, n)
}

// WithXDeath adds an entry to the broker's x-death header (newest first,
// as the broker writes it): the message died count times in queue for
// reason ("expired" when a retry queue's TTL sent it back, "rejected",
// "delivery_limit").
func WithXDeath(queue, reason string, count int64) DeliveryOption {
	return func(d *idemq.Delivery, _ *idemq.IDConfig) {
		e := amqp.Table{"queue": queue, "reason": reason, "count": count, "exchange": "",
			"routing-keys": []any{queue}, "time": time.Now().UTC().Truncate(time.Second)}
		old, _ := d.Headers[idemq.HeaderDeath].([]any)
		d.Headers[idemq.HeaderDeath] = append([]any{e}, old...)
	}
}

// WithID decides the delivery's ID with cfg, as a consumer configured
// with it would.
func WithID(cfg idemq.IDConfig) DeliveryOption {
	return func(_ *idemq.Delivery, id *idemq.IDConfig) { *id = cfg }
}

// Decide runs p for d as a consumer would ([idemq.Pipeline.Decide]) and
// returns the decision it would carry out.
func Decide(t testing.TB, p idemq.Pipeline, d *idemq.Delivery) idemq.Decision {
	t.Helper()
	return p.Decide(idemq.WithRecorder(t.Context(), &idemq.Counters{}), d)
}

// RequireAcked fails t unless dec acks the delivery as processed.
func RequireAcked(t testing.TB, dec idemq.Decision) {
	t.Helper()
	if dec.Action != idemq.ActionAck || dec.Outcome != idemq.OutcomeProcessed {
		t.Fatalf("decision %s (err %v), want ack/processed", dec, dec.Err)
	}
}

// RequireDuplicate fails t unless dec acks the delivery as a duplicate
// recognised by layer (idemq.LayerGuard, LayerInbox, LayerBloom; "" any).
func RequireDuplicate(t testing.TB, dec idemq.Decision, layer string) {
	t.Helper()
	if dec.Action != idemq.ActionAck || dec.Outcome != idemq.OutcomeDuplicate || layer != "" && dec.Reason != layer {
		t.Fatalf("decision %s (err %v), want ack/duplicate by layer %q", dec, dec.Err, layer)
	}
}

// RequireDeadLettered fails t unless dec dead-letters the delivery with
// reason (published to the dead-letter queue by retry.Policy, or rejected
// to the broker's dead-letter exchange by BasePolicy; "" any reason).
func RequireDeadLettered(t testing.TB, dec idemq.Decision, reason string) {
	t.Helper()
	ok := dec.Outcome == idemq.OutcomeDeadLettered && dec.Action == idemq.ActionPublish ||
		dec.Action == idemq.ActionReject
	if !ok || reason != "" && dec.Reason != reason {
		t.Fatalf("decision %s (err %v), want dead-lettered with reason %q", dec, dec.Err, reason)
	}
}

// RequireRetried fails t unless dec sends the delivery to a retry queue
// for a later attempt, or runs it again in process.
func RequireRetried(t testing.TB, dec idemq.Decision) {
	t.Helper()
	if !(dec.Action == idemq.ActionPublish && dec.Outcome == idemq.OutcomeRetried) && dec.Action != idemq.ActionRunAgain {
		t.Fatalf("decision %s (err %v), want a retry", dec, dec.Err)
	}
}

// RequireRequeued fails t unless dec gives the delivery back without an
// attempt (a deferral, an outage, a shutdown) with reason ("" any).
func RequireRequeued(t testing.TB, dec idemq.Decision, reason string) {
	t.Helper()
	back := dec.Action == idemq.ActionRequeue ||
		dec.Action == idemq.ActionPublish && (dec.Outcome == idemq.OutcomeDeferred || dec.Outcome == idemq.OutcomeUnavailable)
	if !back || reason != "" && dec.Reason != reason {
		t.Fatalf("decision %s (err %v), want given back with reason %q", dec, dec.Err, reason)
	}
}

// Sender is an idemq.Sender that records what it is asked to publish and
// confirms it at once: give it to retry.Config.Sender so the policy
// decides retries and dead letters without a broker. ([Check] does not
// call it: it carries a publish decision out from the decision itself.)
type Sender struct {
	mu   sync.Mutex
	msgs []idemq.Message
}

// Publish records m.
func (s *Sender) Publish(_ context.Context, m idemq.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.msgs = append(s.msgs, m)
	return nil
}

// Messages returns what was published, in order.
func (s *Sender) Messages() []idemq.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]idemq.Message(nil), s.msgs...)
}
