package outbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/backoff"
)

// Counter and gauge names the relay records. Gauges are recorded as deltas,
// so an [idemq.Counters] holds their current value.
const (
	CountRelayPublished = "outbox_published" // rows confirmed and marked sent
	CountRelayFailed    = "outbox_failed"    // rows marked failed
	CountRelayRetried   = "outbox_retried"   // rows released for a later attempt
	CountRelayPurged    = "outbox_purged"    // sent rows deleted after the retention
	CountRelayErrors    = "outbox_store_errors"
	GaugeLagMillis      = "outbox_lag_ms"  // age of the oldest pending row
	GaugePending        = "outbox_pending" // pending rows
	// GaugeBlocked: pending rows held back by a failed row of their
	// ordering key (Ordered relays; see [FailedRows]).
	GaugeBlocked = "outbox_blocked"
)

// BatchPublisher is an [idemq.Sender] that can also publish many messages
// in one call, errs[i] being the outcome of msgs[i] ([idemq.Publisher] is
// one). The relay then publishes each claimed batch with one call instead
// of one Publish per row.
type BatchPublisher interface {
	idemq.Sender
	PublishBatch(ctx context.Context, msgs []idemq.Message) (errs []error)
}

// Hooks let tests inject faults. Leave nil in production.
type Hooks struct {
	// AfterConfirm runs after a row's confirm arrived, before it is marked.
	AfterConfirm func(Row)
	// BeforeMark runs once per batch with the confirmed rows, just before
	// they are marked sent.
	BeforeMark func([]Row)
}

// RelayConfig configures a [Relay]. Store and Publisher are required; every
// other field has a documented default.
type RelayConfig struct {
	Store Store
	// Publisher publishes the rows, with confirms (an *idemq.Publisher;
	// a [BatchPublisher] publishes a batch in one call).
	Publisher idemq.Sender
	// Owner identifies this relay in the lease column. Default
	// "<hostname>-<pid>-<random>".
	Owner string
	// BatchSize is the most rows claimed (and published concurrently) at
	// once. Default 256.
	BatchSize int
	// Concurrency is how many claimed batches may be in flight at once
	// (publishing while the next batch is claimed). Default 8: the broker
	// confirms persistent messages in bursts after its fsync (often
	// 100 ms+ under load), so enough batches must be leased to keep
	// publishing while earlier ones wait for their confirms. Keep
	// BatchSize*Concurrency within the publisher's MaxInFlight (4096 by
	// default); beyond it publishes queue for the window inside
	// PublishTimeout.
	Concurrency int
	// Lease is how long a claimed row stays reserved for this relay; a row
	// whose relay died is published again after it. Must be well above
	// PublishTimeout. Default 60s.
	Lease time.Duration
	// PublishTimeout bounds one publish (the publisher's own retries
	// included), or with a [BatchPublisher] the publishes of one batch.
	// Default Lease/3.
	PublishTimeout time.Duration
	// PollInterval is the first idle wait; it doubles up to MaxPollInterval
	// while there is nothing to do. Defaults 50ms and 1s. With a store that
	// can wake the relay (PostgreSQL LISTEN/NOTIFY), MaxPollInterval is only
	// the fallback.
	PollInterval    time.Duration
	MaxPollInterval time.Duration
	// DisableNotify polls even when the store can wake the relay.
	DisableNotify bool
	// Ordered publishes the messages of one ordering key one at a time, in
	// id order. A row of a key that fails for good (unroutable, out of
	// attempts) holds back the key's later rows — publishing them would
	// break the key's order — until an operator retries or skips it
	// ([FailedRows]; `idemq relay retry-failed|skip-failed`). The relay
	// logs each blocking row and reports the held-back rows
	// ([GaugeBlocked], [Relay.Blocked]) every StatsInterval.
	Ordered bool
	// MaxAttempts bounds the claims of one row; a row still failing after
	// it is marked failed. Default 10.
	MaxAttempts int
	// RetryBackoff is the delay before a failed row is tried again.
	// Default 1s doubling to 1m, with jitter.
	RetryBackoff backoff.Policy
	// Retention keeps sent rows this long before purging them. Default 24h;
	// negative keeps them forever.
	Retention time.Duration
	// PurgeInterval between purge rounds (default 1m); PurgeBatch rows per
	// DELETE (default 1000).
	PurgeInterval time.Duration
	PurgeBatch    int
	// StatsInterval between lag/pending refreshes. Default 5s.
	StatsInterval time.Duration
	// DrainTimeout is how long Run, once its context is done, waits for
	// the publishes in flight to be confirmed. Past it (the broker is
	// unreachable, say) they are abandoned and their rows handed back
	// untouched for a later run: Run returns promptly instead of waiting
	// out PublishTimeout. An abandoned publish may still have reached the
	// broker: the row is then published twice, with the same message ID.
	// Default 5s.
	DrainTimeout time.Duration
	// Recorder receives the relay's counters. Optional.
	Recorder idemq.Recorder
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Hooks for fault injection in tests.
	Hooks Hooks
}

// Relay publishes committed outbox rows. Create it with [NewRelay] and call
// [Relay.Run]; several relays (processes) may share one table.
type Relay struct {
	cfg     RelayConfig
	log     *slog.Logger
	rec     idemq.Recorder
	wake    chan struct{}
	refresh chan struct{} // a batch was settled: refresh the stats

	lagMS, pending, blocked atomic.Int64
	gaugeMu                 sync.Mutex
	lastLag                 int64
	lastPending             int64
	lastBlocked             int64
}

type nopRecorder struct{}

func (nopRecorder) Add(string, int64) {}

// ErrInvalidConfig is wrapped by every error [RelayConfig.Validate]
// returns.
var ErrInvalidConfig = idemq.ConfigErrorClass("outbox: invalid config")

// Validate reports a configuration [NewRelay] refuses: no Store or
// Publisher, a negative setting, or a PublishTimeout not below Lease (a
// row would be claimed again while its publish may still land).
func (c RelayConfig) Validate() error {
	switch {
	case c.Store == nil:
		return fmt.Errorf("%w: RelayConfig.Store is required", ErrInvalidConfig)
	case c.Publisher == nil:
		return fmt.Errorf("%w: RelayConfig.Publisher is required", ErrInvalidConfig)
	case c.BatchSize < 0, c.Concurrency < 0, c.MaxAttempts < 0, c.PurgeBatch < 0:
		return fmt.Errorf("%w: RelayConfig: negative BatchSize %d, Concurrency %d, MaxAttempts %d or PurgeBatch %d",
			ErrInvalidConfig, c.BatchSize, c.Concurrency, c.MaxAttempts, c.PurgeBatch)
	case c.Lease < 0, c.PublishTimeout < 0, c.PollInterval < 0, c.MaxPollInterval < 0, c.PurgeInterval < 0, c.StatsInterval < 0:
		return fmt.Errorf("%w: RelayConfig: negative Lease, PublishTimeout, PollInterval, MaxPollInterval, PurgeInterval or StatsInterval", ErrInvalidConfig)
	case c.Lease > 0 && c.PublishTimeout >= c.Lease:
		return fmt.Errorf("%w: RelayConfig.PublishTimeout %v must be below Lease %v", ErrInvalidConfig, c.PublishTimeout, c.Lease)
	}
	return nil
}

// NewRelay validates cfg ([RelayConfig.Validate]), fills its defaults and
// returns a relay; it does nothing until Run.
func NewRelay(cfg RelayConfig) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Owner == "" {
		host, _ := os.Hostname()
		var b [3]byte
		_, _ = rand.Read(b[:])
		cfg.Owner = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 256
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 8
	}
	if cfg.Lease <= 0 {
		cfg.Lease = 60 * time.Second
	}
	if cfg.PublishTimeout <= 0 {
		cfg.PublishTimeout = cfg.Lease / 3
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 50 * time.Millisecond
	}
	if cfg.MaxPollInterval <= 0 {
		cfg.MaxPollInterval = time.Second
	}
	if cfg.MaxPollInterval < cfg.PollInterval {
		cfg.MaxPollInterval = cfg.PollInterval
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 10
	}
	if cfg.RetryBackoff.Min <= 0 {
		cfg.RetryBackoff.Min = time.Second
	}
	if cfg.RetryBackoff.Max <= 0 {
		cfg.RetryBackoff.Max = time.Minute
	}
	if cfg.Retention == 0 {
		cfg.Retention = 24 * time.Hour
	}
	if cfg.PurgeInterval <= 0 {
		cfg.PurgeInterval = time.Minute
	}
	if cfg.PurgeBatch <= 0 {
		cfg.PurgeBatch = 1000
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 5 * time.Second
	}
	if cfg.StatsInterval <= 0 {
		cfg.StatsInterval = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	rec := cfg.Recorder
	if rec == nil {
		rec = nopRecorder{}
	}
	return &Relay{cfg: cfg, log: cfg.Logger, rec: rec, wake: make(chan struct{}, 1), refresh: make(chan struct{}, 1)}, nil
}

// Owner is the relay's lease owner name.
func (r *Relay) Owner() string { return r.cfg.Owner }

// Lag is the age of the oldest pending row at the last refresh.
func (r *Relay) Lag() time.Duration { return time.Duration(r.lagMS.Load()) * time.Millisecond }

// Pending is the number of pending rows at the last refresh.
func (r *Relay) Pending() int64 { return r.pending.Load() }

// Blocked is, for an Ordered relay, the number of pending rows held back by
// a failed row of their ordering key at the last refresh.
func (r *Relay) Blocked() int64 { return r.blocked.Load() }

// Wake makes an idle relay look for rows at once.
func (r *Relay) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run relays until ctx is done, then finishes the batch in flight (its
// publishes and marks) and returns nil. It returns an error only when the
// configuration is unusable.
func (r *Relay) Run(ctx context.Context) error {
	if r.cfg.Store == nil || r.cfg.Publisher == nil {
		return fmt.Errorf("%w: RelayConfig.Store and RelayConfig.Publisher are required", ErrInvalidConfig)
	}
	bg, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// Last (deferred first): once every batch is settled and the stats
	// loop stopped, Pending and Lag tell what is left.
	defer r.finalStats(ctx)
	defer wg.Wait()
	defer cancel()

	notify := false
	if w, ok := r.cfg.Store.(Waker); ok && !r.cfg.DisableNotify {
		notify = true
		wg.Go(func() {
			if err := w.Listen(bg, r.Wake); err != nil && bg.Err() == nil {
				r.log.Warn("outbox relay: listener stopped", "err", err)
			}
		})
	}
	if r.cfg.Retention > 0 {
		wg.Go(func() { r.purgeLoop(bg) })
	}
	wg.Go(func() { r.statsLoop(bg) })
	r.log.Info("outbox relay started", "owner", r.cfg.Owner, "table", r.cfg.Store.Table(),
		"notify", notify, "ordered", r.cfg.Ordered, "batch", r.cfg.BatchSize, "lease", r.cfg.Lease)
	defer r.log.Info("outbox relay stopped", "owner", r.cfg.Owner)

	// Up to Concurrency batches publish at once; Run waits for them all.
	slots := make(chan struct{}, r.cfg.Concurrency)
	var batches sync.WaitGroup
	defer batches.Wait()
	idle, errs := 0, 0
	for ctx.Err() == nil {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		// The claim is not cut short by ctx: once rows are leased they are
		// published and marked before Run returns.
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		rows, err := r.cfg.Store.Claim(cctx, r.cfg.Owner, r.cfg.BatchSize, r.cfg.Lease, r.cfg.Ordered)
		ccancel()
		if err != nil {
			<-slots
			r.rec.Add(CountRelayErrors, 1)
			r.log.Warn("outbox relay: claim failed", "err", err)
			_ = backoff.Sleep(ctx, backoff.Policy{Min: 100 * time.Millisecond, Max: 5 * time.Second}.Delay(errs))
			errs++
			continue
		}
		errs = 0
		if len(rows) > 0 {
			batches.Go(func() {
				defer func() { <-slots }()
				r.process(ctx, rows)
				// Marking may have unblocked rows (the next of an ordering
				// key): look again rather than sleep out the poll interval.
				r.Wake()
				r.refreshStats()
			})
			idle = 0
			continue
		}
		<-slots
		wait := backoff.Policy{Min: r.cfg.PollInterval, Max: r.cfg.MaxPollInterval, NoJitter: true}.Delay(idle)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-r.wake:
			idle = 0
		case <-t.C:
			idle++
		}
		t.Stop()
	}
	return nil
}

type result struct {
	row Row
	err error
}

// process publishes a claimed batch concurrently and settles every row.
func (r *Relay) process(ctx context.Context, rows []Row) {
	dctx := context.WithoutCancel(ctx) // drain: finish the batch on shutdown
	// The publishes get DrainTimeout once ctx is done, then are abandoned.
	pubCtx, abandon := context.WithCancelCause(dctx)
	defer abandon(nil)
	stopDrain := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(r.cfg.DrainTimeout, func() { abandon(errAbandoned) })
		context.AfterFunc(pubCtx, func() { t.Stop() })
	})
	defer stopDrain()
	results := make([]result, len(rows))
	ok := make([]int, 0, len(rows)) // the rows that pass precheck
	for i := range rows {
		results[i].row = rows[i]
		if reason := r.precheck(&results[i].row); reason != "" {
			results[i].err = permanentErr(reason)
			continue
		}
		ok = append(ok, i)
	}
	if bp, isBatch := r.cfg.Publisher.(BatchPublisher); isBatch {
		r.publishBatch(pubCtx, bp, ok, results)
	} else {
		r.publishEach(pubCtx, ok, results)
	}

	var sent []Row
	var ids []int64
	for _, res := range results {
		if res.err == nil {
			sent = append(sent, res.row)
			ids = append(ids, res.row.ID)
		}
	}
	if len(sent) > 0 {
		if r.cfg.Hooks.BeforeMark != nil {
			r.cfg.Hooks.BeforeMark(sent)
		}
		r.settle(dctx, "mark sent", func(c context.Context) error { return r.cfg.Store.MarkSent(c, ids) })
		r.rec.Add(CountRelayPublished, int64(len(ids)))
	}
	for _, res := range results {
		if res.err != nil {
			r.failed(dctx, res.row, res.err)
		}
	}
}

// publishEach publishes the rows results[i] for i in which, each with its
// own Publish call, concurrently.
func (r *Relay) publishEach(pubCtx context.Context, which []int, results []result) {
	var wg sync.WaitGroup
	for _, i := range which {
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(pubCtx, r.cfg.PublishTimeout)
			defer cancel()
			row := results[i].row
			results[i].err = r.published(pubCtx, row, r.cfg.Publisher.Publish(pctx, rowMessage(row)))
		})
	}
	wg.Wait()
}

// publishBatch publishes the rows results[i] for i in which with one
// PublishBatch call.
func (r *Relay) publishBatch(pubCtx context.Context, bp BatchPublisher, which []int, results []result) {
	if len(which) == 0 {
		return
	}
	msgs := make([]idemq.Message, len(which))
	for j, i := range which {
		msgs[j] = rowMessage(results[i].row)
	}
	pctx, cancel := context.WithTimeout(pubCtx, r.cfg.PublishTimeout)
	defer cancel()
	errs := bp.PublishBatch(pctx, msgs)
	for j, i := range which {
		var err error
		if j < len(errs) {
			err = errs[j]
		} else {
			err = fmt.Errorf("outbox relay: the publisher answered %d of %d messages", len(errs), len(msgs))
		}
		results[i].err = r.published(pubCtx, results[i].row, err)
	}
}

// rowMessage is the message a row is published as.
func rowMessage(row Row) idemq.Message {
	m := row.Message
	return idemq.Message{
		ID: m.ID, Exchange: m.Exchange, RoutingKey: m.RoutingKey, Body: m.Body,
		ContentType: m.ContentType, Headers: m.Headers,
	}
}

// published is a row's publish outcome: err, marked abandoned when the
// drain ran out; on success the AfterConfirm hook runs.
func (r *Relay) published(pubCtx context.Context, row Row, err error) error {
	if err != nil && errors.Is(context.Cause(pubCtx), errAbandoned) {
		err = fmt.Errorf("%w: %w", errAbandoned, err)
	}
	if err == nil && r.cfg.Hooks.AfterConfirm != nil {
		r.cfg.Hooks.AfterConfirm(row)
	}
	return err
}

// errAbandoned: a publish still unconfirmed DrainTimeout after Run's
// context ended.
var errAbandoned = errors.New("outbox relay: publish abandoned at shutdown (drain timeout)")

type permanentErr string

func (e permanentErr) Error() string { return string(e) }

// precheck returns a reason to fail the row without publishing it.
func (r *Relay) precheck(row *Row) string {
	if row.Attempts > r.cfg.MaxAttempts {
		return fmt.Sprintf("max-attempts: claimed %d times without a confirm (relay crashes or lost leases)", row.Attempts-1)
	}
	if row.HeadersErr != nil {
		return "invalid-headers: " + row.HeadersErr.Error()
	}
	if err := idemq.ValidateID(row.Message.ID); err != nil {
		return "invalid-id: " + err.Error()
	}
	return ""
}

func (r *Relay) failed(ctx context.Context, row Row, err error) {
	var perm permanentErr
	var reason string
	switch {
	case errors.As(err, &perm):
		reason = string(perm)
	case errors.Is(err, idemq.ErrUnroutable):
		reason = "unroutable: " + err.Error()
	case errors.Is(err, idemq.ErrMessageTooLarge):
		// No retry makes the headers fit the broker's frame size.
		reason = "too-large: " + err.Error()
	case errors.Is(err, idemq.ErrInvalidHeaders):
		reason = "invalid-headers: " + err.Error()
	case errors.Is(err, idemq.ErrClosed), errors.Is(err, errAbandoned):
		// The publisher is closing, or the relay stopping: hand the row
		// back untouched.
		r.log.Warn("outbox relay: row handed back unpublished", "row", row.ID, "message_id", row.Message.ID, "err", err)
		r.settle(ctx, "release", func(c context.Context) error {
			return r.cfg.Store.Retry(c, r.cfg.Owner, row.ID, 0, err.Error())
		})
		return
	case row.Attempts >= r.cfg.MaxAttempts:
		reason = fmt.Sprintf("max-attempts: %d attempts, last error: %v", row.Attempts, err)
	}
	if reason != "" {
		if r.cfg.Ordered && row.Message.OrderingKey != "" {
			r.log.Error("outbox relay: row failed; the later rows of its ordering key are held back until an operator retries or skips it",
				"row", row.ID, "message_id", row.Message.ID, "ordering_key", row.Message.OrderingKey, "reason", reason)
		} else {
			r.log.Warn("outbox relay: row failed", "row", row.ID, "message_id", row.Message.ID, "reason", reason)
		}
		r.settle(ctx, "mark failed", func(c context.Context) error { return r.cfg.Store.Fail(c, r.cfg.Owner, row.ID, reason) })
		r.rec.Add(CountRelayFailed, 1)
		return
	}
	delay := r.cfg.RetryBackoff.Delay(row.Attempts - 1)
	r.log.Warn("outbox relay: publish failed; will retry", "row", row.ID, "message_id", row.Message.ID,
		"attempt", row.Attempts, "retry_in", delay, "err", err)
	r.settle(ctx, "release", func(c context.Context) error {
		return r.cfg.Store.Retry(c, r.cfg.Owner, row.ID, delay, err.Error())
	})
	r.rec.Add(CountRelayRetried, 1)
}

// settle runs a bookkeeping write, retrying briefly: if it never succeeds
// the lease expires and the row is published again (same message ID).
func (r *Relay) settle(ctx context.Context, what string, fn func(context.Context) error) {
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		if attempt > 0 {
			time.Sleep(backoff.Policy{Min: 100 * time.Millisecond, Max: 2 * time.Second}.Delay(attempt - 1))
		}
		c, cancel := context.WithTimeout(ctx, 15*time.Second)
		err = fn(c)
		cancel()
		if err == nil {
			return
		}
		r.rec.Add(CountRelayErrors, 1)
	}
	r.log.Error("outbox relay: bookkeeping failed; rows will be retried after the lease", "op", what, "err", err)
}

func (r *Relay) purgeLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.PurgeInterval)
	defer t.Stop()
	for {
		for ctx.Err() == nil {
			n, err := r.cfg.Store.Purge(ctx, r.cfg.Retention, r.cfg.PurgeBatch)
			if err != nil {
				if ctx.Err() == nil {
					r.rec.Add(CountRelayErrors, 1)
					r.log.Warn("outbox relay: purge failed", "err", err)
				}
				break
			}
			r.rec.Add(CountRelayPurged, n)
			if n < int64(r.cfg.PurgeBatch) {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// refreshStats asks the stats loop for a refresh now (a batch was
// settled); requests coalesce.
func (r *Relay) refreshStats() {
	select {
	case r.refresh <- struct{}{}:
	default:
	}
}

// minStatsGap bounds the refreshes a busy relay asks for after its
// batches: at most one per minStatsGap (or StatsInterval if shorter).
const minStatsGap = 250 * time.Millisecond

// statsCostFactor: a refresh asked for after a batch waits at least this
// many times the last Stats query's duration. Stats counts the pending
// rows, so it costs in proportion to the backlog; a relay working through
// a large one refreshes less often and leaves the database to the claims
// and marks (at most 1/statsCostFactor of one connection's time).
const statsCostFactor = 50

// statsGap is the wait before a refresh asked for after a batch, given
// the last Stats query's duration: minStatsGap, longer when Stats is
// slow, never beyond interval.
func statsGap(took, interval time.Duration) time.Duration {
	return min(max(minStatsGap, statsCostFactor*took), interval)
}

// finalStats reads Pending and Lag once more after Run stopped, for the
// caller's last report. The recorder's gauges stay at zero.
func (r *Relay) finalStats(ctx context.Context) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if st, err := r.cfg.Store.Stats(sctx); err == nil {
		r.lagMS.Store(st.Lag.Milliseconds())
		r.pending.Store(st.Pending)
	}
}

func (r *Relay) statsLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.StatsInterval)
	defer t.Stop()
	fr, _ := r.cfg.Store.(FailedRows)
	if !r.cfg.Ordered {
		fr = nil
	}
	logged := map[int64]bool{} // blocking rows already logged
	for {
		t0 := time.Now()
		st, err := r.cfg.Store.Stats(ctx)
		took := time.Since(t0)
		if err == nil {
			r.setGauges(st)
		} else if ctx.Err() == nil {
			r.log.Debug("outbox relay: stats failed", "err", err)
		}
		if fr != nil {
			if bl, err := fr.Blocked(ctx); err == nil {
				r.setBlocked(r.blockedRows(bl, logged))
			} else if ctx.Err() == nil {
				r.log.Debug("outbox relay: listing blocked rows failed", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			r.setGauges(Stats{}) // this relay no longer reports a backlog
			r.setBlocked(0)
			return
		case <-t.C:
		case <-r.refresh:
			gap := time.NewTimer(statsGap(took, r.cfg.StatsInterval))
			select {
			case <-ctx.Done():
			case <-gap.C:
			}
			gap.Stop()
		}
	}
}

// blockedRows returns the pending rows held back by the failed rows bl
// (those behind the earliest failed row of each key), logs each blocking
// row once while it blocks, and logs when it no longer does.
func (r *Relay) blockedRows(bl []BlockedRow, logged map[int64]bool) int64 {
	var n int64
	keys := map[string]bool{}
	now := map[int64]bool{}
	for _, b := range bl { // id order: the first of a key holds back all the others
		now[b.FailedID] = true
		if !keys[b.OrderingKey] {
			keys[b.OrderingKey] = true
			n += b.Waiting
		}
		if !logged[b.FailedID] {
			logged[b.FailedID] = true
			r.log.Error("outbox relay: ordering key blocked by failed row; retry or skip it (idemq relay retry-failed|skip-failed)",
				"failed_row", b.FailedID, "message_id", b.MessageID, "ordering_key", b.OrderingKey, "waiting", b.Waiting, "last_error", b.LastError)
		}
	}
	for id := range logged {
		if !now[id] {
			delete(logged, id)
			r.log.Info("outbox relay: failed row no longer blocks its ordering key", "failed_row", id)
		}
	}
	return n
}

func (r *Relay) setBlocked(n int64) {
	r.blocked.Store(n)
	r.gaugeMu.Lock()
	defer r.gaugeMu.Unlock()
	r.rec.Add(GaugeBlocked, n-r.lastBlocked)
	r.lastBlocked = n
}

func (r *Relay) setGauges(st Stats) {
	lag := st.Lag.Milliseconds()
	r.lagMS.Store(lag)
	r.pending.Store(st.Pending)
	r.gaugeMu.Lock()
	defer r.gaugeMu.Unlock()
	r.rec.Add(GaugeLagMillis, lag-r.lastLag)
	r.rec.Add(GaugePending, st.Pending-r.lastPending)
	r.lastLag, r.lastPending = lag, st.Pending
}
