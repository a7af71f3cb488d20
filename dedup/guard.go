package dedup

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/coalesce"
)

// Requeue reasons the guard gives the consumer (idemq.RequeueError.Reason).
const (
	RequeueInFlight         = "in-flight"
	RequeueStoreUnavailable = "store-unavailable"
)

// ErrInFlight is the cause of the requeue the guard returns when another
// consumer holds a live lease on the message.
var ErrInFlight = errors.New("dedup: another consumer holds the lease")

// Config configures [Guard]. The zero value is usable.
type Config struct {
	// Prefix namespaces the keys: "<Prefix>:<group>:<id>". Default "idemq".
	Prefix string
	// Lease is how long a claim holds the message while the handler runs;
	// the heartbeat renews it, so it only bounds how long a dead consumer's
	// message waits before another one may take it. Default 30s.
	Lease time.Duration
	// Window is how long a done record is remembered (duplicates within it
	// are suppressed). Default 24h.
	Window time.Duration
	// Heartbeat is the interval of lease renewals while the handler runs.
	// Default Lease/3.
	Heartbeat time.Duration
	// FailOpen runs the handler unguarded when the store cannot answer a
	// claim (logged and counted as idemq.CountFailOpen). Default false:
	// fail-closed — the handler is not run and the delivery is requeued
	// after StoreRetryAfter.
	FailOpen bool
	// StoreRetryAfter is how long a delivery waits before it comes back
	// when the store is unavailable (fail-closed). Default 1s.
	StoreRetryAfter time.Duration
	// InFlightRetryAfter, when set, is how long a delivery whose message
	// another consumer holds waits before it comes back. Default: the
	// lease time the other owner has left, or 1s when the store cannot
	// tell.
	InFlightRetryAfter time.Duration
	// StoreTimeout bounds every store call. Default 5s. With a BatchStore
	// it bounds both a call's wait for its batch and the batch's round
	// trip, so a grouped call may take up to twice as long.
	StoreTimeout time.Duration
	// MaxBatch bounds how many concurrent Claim (or Complete) calls share
	// one store round trip when the store implements [BatchStore]. Calls
	// are grouped the way a database groups commits: one made while no
	// batch is in flight leaves at once, the ones made meanwhile leave
	// together next, so there is no added wait. Default 128; 1 turns
	// grouping off (one round trip per call).
	MaxBatch int
	// ID says where the message ID comes from (see [IDConfig]).
	ID IDConfig
	// Logger; default slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = "idemq"
	}
	if c.Lease <= 0 {
		c.Lease = 30 * time.Second
	}
	if c.Window <= 0 {
		c.Window = 24 * time.Hour
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = c.Lease / 3
	}
	if c.StoreRetryAfter <= 0 {
		c.StoreRetryAfter = time.Second
	}
	if c.StoreTimeout <= 0 {
		c.StoreTimeout = 5 * time.Second
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 128
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Key returns the store key of a message ID in a consumer group:
// "<prefix>:<group>:<id>". Stores take it as an opaque string; the Redis
// store wraps it in a Cluster hash tag itself (see dedup/redisstore).
func Key(prefix, group, id string) string { return prefix + ":" + group + ":" + id }

// Guard returns the dedup middleware: per delivery it claims the message ID
// in store with a fresh owner token and
//
//   - Acquired: runs the next handler, renewing the lease every Heartbeat;
//     on success it marks the record done (Complete) and returns nil (ack);
//     on failure it releases the record (so a redelivery is processed) and
//     returns the handler's error unchanged for the failure policy;
//   - Done: returns nil without running the handler (a suppressed
//     duplicate, counted);
//   - InFlight: returns an in-place idemq.RequeueError (InPlace set: the
//     consumer nacks it with requeue after the other owner's lease, it is
//     not parked in a TTL retry queue) — it is never acked as a duplicate;
//   - store error: fail-closed returns an idemq.RequeueError after
//     StoreRetryAfter; FailOpen runs the handler without a record;
//   - [ErrUncertain] (a probabilistic store that cannot tell done from
//     new): neither runs nor acks — an idemq.RejectError with reason
//     idemq.ReasonSuspectedDuplicate (dead-lettered with that reason), or,
//     with bloom.SuspectRouter outside the guard, a copy in the
//     suspected-duplicate queue. Counted as idemq.CountUncertain, whatever
//     FailOpen says.
//
// A delivery without a valid ID gets an idemq.RejectError (missing-id or
// invalid-id). The consumer group is the delivery's Group (its Queue when
// empty). Counters go to idemq.RecorderFrom(ctx).
//
// Store calls stay outside any database transaction: put the guard outside
// the inbox/transaction middleware, so the order is claim → begin → effect
// → commit → complete → ack. Complete and Release run on a context that is
// not cancelled with the handler's, bounded by StoreTimeout.
func Guard(store Store, cfg Config) idemq.Middleware {
	if store == nil {
		panic("dedup.Guard: nil store")
	}
	g := &guard{store: store, cfg: cfg.withDefaults()}
	if bs, ok := store.(BatchStore); ok && g.cfg.MaxBatch > 1 {
		bc := coalesce.Config{MaxBatch: g.cfg.MaxBatch, Timeout: g.cfg.StoreTimeout}
		g.claims = coalesce.New(bs.ClaimBatch, func(err error) ClaimReply {
			return ClaimReply{Err: &StoreError{Op: "claim", Err: err}}
		}, bc)
		g.completes = coalesce.New(bs.CompleteBatch, func(err error) error {
			return &StoreError{Op: "complete", Err: err}
		}, bc)
	}
	return func(next idemq.Handler) idemq.Handler {
		return idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
			return g.handle(ctx, d, next)
		})
	}
}

type guard struct {
	store Store
	cfg   Config
	// claims and completes group concurrent calls when the store is a
	// BatchStore; nil otherwise.
	claims    *coalesce.Batcher[ClaimRequest, ClaimReply]
	completes *coalesce.Batcher[CompleteRequest, error]
}

// claim asks the store for a lease, in a group of concurrent claims when it
// can. StoreTimeout bounds the call (grouped: the wait for a batch; the
// batch has its own).
func (g *guard) claim(ctx context.Context, key, token string) (Claim, error) {
	cctx, cancel := context.WithTimeout(ctx, g.cfg.StoreTimeout)
	defer cancel()
	if g.claims == nil {
		return g.store.Claim(cctx, key, token, g.cfg.Lease)
	}
	if err := ctx.Err(); err != nil {
		return Claim{}, &StoreError{Op: "claim", Err: err}
	}
	r := g.claims.Do(cctx, ClaimRequest{Key: key, Token: token, Lease: g.cfg.Lease})
	return r.Claim, r.Err
}

// completeOnce marks the record done, in a group of concurrent completes
// when it can. It runs even when the handler's context has ended.
func (g *guard) completeOnce(ctx context.Context, key, token string) error {
	sctx, cancel := g.storeCtx(ctx)
	defer cancel()
	if g.completes == nil {
		return g.store.Complete(sctx, key, token, g.cfg.Window)
	}
	return g.completes.Do(sctx, CompleteRequest{Key: key, Token: token, Window: g.cfg.Window})
}

type idKey struct{}

// MessageIDFrom returns the message ID the guard found for the delivery
// being handled (the business key when an Extractor is configured).
func MessageIDFrom(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(idKey{}).(string)
	return id, ok
}

func (g *guard) handle(ctx context.Context, d *idemq.Delivery, next idemq.Handler) error {
	rec := idemq.RecorderFrom(ctx)
	id, err := g.cfg.ID.MessageID(d)
	if err != nil {
		return err
	}
	ctx = context.WithValue(ctx, idKey{}, id)
	group := d.Group
	if group == "" {
		group = d.Queue
	}
	key := Key(g.cfg.Prefix, group, id)
	token := rand.Text()
	log := keyLog{g.cfg.Logger, key}

	claim, err := g.claim(ctx, key, token)
	if err != nil {
		if errors.Is(err, ErrInvalidKey) {
			return idemq.Reject(idemq.ReasonInvalidID, fmt.Errorf("dedup key for message %q: %w", id, err))
		}
		if errors.Is(err, ErrUncertain) {
			// Neither run (a duplicate would apply twice) nor ack (a new
			// message would be lost): set it aside with a reason.
			rec.Add(idemq.CountUncertain, 1)
			log.Warn("idemq: dedup store cannot tell whether the message was processed; set aside as a suspected duplicate", "err", err)
			return idemq.Reject(idemq.ReasonSuspectedDuplicate, fmt.Errorf("dedup: message %q: %w", id, err))
		}
		rec.Add(idemq.CountStoreErrors, 1)
		if !g.cfg.FailOpen {
			log.Warn("idemq: dedup store unavailable; delivery requeued (fail-closed)", "err", err, "after", g.cfg.StoreRetryAfter)
			// Unavailable: the failure policy gives the delivery back
			// without counting an attempt, the consumer's breaker pauses.
			return idemq.Requeue(g.cfg.StoreRetryAfter, RequeueStoreUnavailable, idemq.Unavailable(DependencyStore, err))
		}
		log.Warn("idemq: dedup store unavailable; running the handler unguarded (fail-open)", "err", err)
		rec.Add(idemq.CountFailOpen, 1)
		ctx, counted := idemq.TrackOutcome(ctx)
		if err := next.Handle(ctx, d); err != nil {
			return err
		}
		if !counted() {
			rec.Add(idemq.CountProcessed, 1)
		}
		return nil
	}

	switch claim.Result {
	case Done:
		rec.Add(idemq.CountDuplicates, 1)
		log.Debug("idemq: duplicate suppressed")
		return nil
	case InFlight:
		rec.Add(idemq.CountInFlight, 1)
		after := g.cfg.InFlightRetryAfter
		if after <= 0 {
			after = claim.LeaseLeft
		}
		if after <= 0 {
			after = time.Second
		}
		log.Debug("idemq: message in flight elsewhere; delivery deferred", "after", after)
		return idemq.RequeueInPlace(after, RequeueInFlight, ErrInFlight)
	case Acquired:
	default:
		rec.Add(idemq.CountStoreErrors, 1)
		err := &StoreError{Op: "claim", Err: fmt.Errorf("unknown claim result %v", claim.Result)}
		return idemq.Requeue(g.cfg.StoreRetryAfter, RequeueStoreUnavailable, err)
	}

	ctx, counted := idemq.TrackOutcome(ctx)
	err = g.run(ctx, d, next, key, token, log)
	if err != nil {
		return err
	}
	if !counted() { // an inbox below counts its own processed/duplicate
		rec.Add(idemq.CountProcessed, 1)
	}
	g.complete(ctx, rec, key, token, log)
	return nil
}

// run runs the handler under a heartbeat and releases the record when the
// handler fails or panics.
func (g *guard) run(ctx context.Context, d *idemq.Delivery, next idemq.Handler, key, token string, log keyLog) (err error) {
	stop := g.heartbeat(ctx, key, token, log)
	ok := false
	defer func() {
		stop()
		if !ok {
			g.release(ctx, key, token, log)
		}
	}()
	err = next.Handle(ctx, d)
	ok = err == nil
	return err
}

// storeCtx is a context for a store call that must happen even when the
// handler's context has ended (Complete, Release, Extend).
func (g *guard) storeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), g.cfg.StoreTimeout)
}

// heartbeat renews the lease every Heartbeat while the handler runs. It is
// a timer, not a goroutine: most handlers finish long before the first
// renewal is due, and then it costs nothing but the timer. stop waits for a
// renewal in progress.
func (g *guard) heartbeat(ctx context.Context, key, token string, log keyLog) (stop func()) {
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	mu.Lock() // the callback must not run before t is set
	defer mu.Unlock()
	t = time.AfterFunc(g.cfg.Heartbeat, func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		sctx, cancel := g.storeCtx(ctx)
		err := g.store.Extend(sctx, key, token, g.cfg.Lease)
		cancel()
		switch {
		case err == nil:
		case errors.Is(err, ErrLeaseLost):
			log.Warn("idemq: dedup lease lost while the handler runs (it outlived its lease?)", "err", err)
			return
		default:
			log.Warn("idemq: dedup lease renewal failed; retrying at the next heartbeat", "err", err)
		}
		t.Reset(g.cfg.Heartbeat)
	})
	return func() {
		t.Stop()
		mu.Lock()
		stopped = true
		mu.Unlock()
	}
}

func (g *guard) complete(ctx context.Context, rec idemq.Recorder, key, token string, log keyLog) {
	var err error
	for attempt, pause := 0, 50*time.Millisecond; attempt < 3; attempt, pause = attempt+1, pause*4 {
		if attempt > 0 {
			time.Sleep(pause)
		}
		err = g.completeOnce(ctx, key, token)
		if err == nil {
			return
		}
		if errors.Is(err, ErrLeaseLost) {
			rec.Add(idemq.CountLeasesLost, 1)
			log.Warn("idemq: dedup lease was lost before Complete: the effect was applied, a concurrent duplicate may have run", "err", err)
			return
		}
	}
	// The effect is applied: acking is right. Requeueing would run it again.
	rec.Add(idemq.CountStoreErrors, 1)
	log.Error("idemq: dedup Complete failed; the message is acked but not remembered, a later duplicate may run", "err", err)
}

func (g *guard) release(ctx context.Context, key, token string, log keyLog) {
	sctx, cancel := g.storeCtx(ctx)
	err := g.store.Release(sctx, key, token)
	cancel()
	if err != nil {
		// Best effort: the lease expires by itself.
		log.Warn("idemq: dedup Release failed; a redelivery waits for the lease to expire", "err", err)
	}
}

// keyLog logs with the dedup key attached. It is built per delivery, so it
// costs nothing until a line is written (slog.Logger.With would clone the
// handler for every message).
type keyLog struct {
	l   *slog.Logger
	key string
}

func (k keyLog) Debug(msg string, args ...any) {
	if k.l.Enabled(context.Background(), slog.LevelDebug) {
		k.l.Debug(msg, append(args, "key", k.key)...)
	}
}
func (k keyLog) Warn(msg string, args ...any)  { k.l.Warn(msg, append(args, "key", k.key)...) }
func (k keyLog) Error(msg string, args ...any) { k.l.Error(msg, append(args, "key", k.key)...) }
