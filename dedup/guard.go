package dedup

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/coalesce"
)

// Requeue reasons the guard gives the consumer (idemq.RequeueError.Reason).
const (
	RequeueInFlight         = "in-flight"
	RequeueStoreUnavailable = "store-unavailable"
	// RequeueLeaseLost: the delivery's lease was lost while its handler
	// ran (or found lost at Complete); it is given back, and its next
	// claim decides (done: acked as a duplicate; held elsewhere: deferred).
	RequeueLeaseLost = "lease-lost"
)

// ErrInFlight is the cause of the requeue the guard returns when another
// consumer holds a live lease on the message.
var ErrInFlight = errors.New("dedup: another consumer holds the lease")

// ErrInvalidConfig is wrapped by the error [Config.Validate] (and
// [NewGuard]) returns for a configuration the guard cannot run with.
var ErrInvalidConfig = idemq.ConfigErrorClass("dedup: invalid guard config")

// Config configures a [Guard]. Store is required; every other field has a
// documented default.
type Config struct {
	// Store holds the dedup records (memory, Redis, SQL, the Bloom tier).
	// Required.
	Store Store
	// Prefix namespaces the keys: "<Prefix>:<group>:<id>". Default "idemq".
	// This is the key prefix to change to separate applications, whatever
	// the store. (redisstore.Config.KeyPrefix is another thing: a Redis
	// key-space prefix put in front of the whole key, outside its hash
	// tag, for sharing one Redis with other data.)
	Prefix string
	// Lease is how long a claim holds the message while the handler runs;
	// the heartbeat renews it, so it only bounds how long a dead consumer's
	// message waits before another one may take it. Default 30s.
	Lease time.Duration
	// Window is how long a done record is remembered (duplicates within it
	// are suppressed). Default 24h.
	Window time.Duration
	// Heartbeat is the interval of lease renewals while the handler runs.
	// Default Lease/3. It must be shorter than Lease minus LeaseMargin
	// (Validate fails otherwise).
	Heartbeat time.Duration
	// LeaseMargin is how much sooner than Lease after its last successful
	// renewal the guard gives the lease up: the handler's context is
	// cancelled with idemq.ErrLeaseLost once no renewal has succeeded for
	// Lease-LeaseMargin (the store unreachable, the process frozen), so
	// it stops before another consumer may take the message. Default
	// Lease/5, or half of Lease-Heartbeat when that is less.
	LeaseMargin time.Duration
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
	// it bounds each batch's round trip (a batch that overruns it is
	// answered with an error and the next one starts), and a grouped call
	// waits for the batch ahead of it, then for its own: up to twice as
	// long, more when more calls wait than MaxBatch holds.
	StoreTimeout time.Duration
	// MaxBatch bounds how many concurrent Claim (or Complete) calls share
	// one store round trip when the store implements [BatchStore]. Calls
	// are grouped the way a database groups commits: one made while no
	// batch is in flight leaves at once, the ones made meanwhile leave
	// together next, so there is no added wait. Default 128; 1 turns
	// grouping off (one round trip per call).
	MaxBatch int
	// BatchesInFlight bounds how many grouped batches may be waiting for
	// the store at once. Default 1 (group commit: calls made while a
	// batch is in flight leave together next).
	BatchesInFlight int
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// withDefaults returns c with every unset field at its default.
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
	if c.LeaseMargin <= 0 {
		c.LeaseMargin = min(c.Lease/5, (c.Lease-c.Heartbeat)/2)
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
	if c.BatchesInFlight <= 0 {
		c.BatchesInFlight = 1
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports a configuration the guard cannot run with, wrapping
// [ErrInvalidConfig]: a nil Store, a Heartbeat not shorter than Lease, a
// LeaseMargin that leaves no time for a renewal.
func (c Config) Validate() error {
	if c.Store == nil {
		return fmt.Errorf("%w: nil Store", ErrInvalidConfig)
	}
	c = c.withDefaults()
	switch {
	case c.Heartbeat >= c.Lease:
		return fmt.Errorf("%w: Heartbeat %v must be shorter than Lease %v (the lease would expire between renewals)", ErrInvalidConfig, c.Heartbeat, c.Lease)
	case c.LeaseMargin <= 0 || c.Heartbeat+c.LeaseMargin >= c.Lease:
		return fmt.Errorf("%w: Heartbeat %v plus LeaseMargin %v must be shorter than Lease %v (the lease would be given up before its first renewal)", ErrInvalidConfig, c.Heartbeat, c.LeaseMargin, c.Lease)
	}
	return nil
}

// Key returns the store key of a message ID in a consumer group:
// "<prefix>:<group>:<id>". Stores take it as an opaque string; the Redis
// store wraps it in a Cluster hash tag itself (see dedup/redisstore).
func Key(prefix, group, id string) string { return prefix + ":" + group + ":" + id }

// Guard is the dedup layer of an idemq.Pipeline: per delivery it claims the
// message ID (idemq.Delivery.ID, decided by the consumer) in the store with
// a fresh owner token and
//
//   - Acquired: runs the next handler, renewing the lease every Heartbeat;
//     on success it marks the record done (Complete) and returns nil (ack);
//     on failure it releases the record (so a redelivery is processed) and
//     returns the handler's error unchanged for the failure policy;
//   - Done: returns idemq.ErrDuplicate without running the handler (the
//     consumer acks it and counts a duplicate);
//   - InFlight: returns an in-place idemq.RequeueError (InPlace set: the
//     consumer nacks it with requeue after the other owner's lease, it is
//     not parked in a TTL retry queue) — it is never acked as a duplicate;
//   - store error: fail-closed returns an idemq.RequeueError after
//     StoreRetryAfter; FailOpen runs the handler without a record;
//   - [ErrUncertain] (a probabilistic store that cannot tell done from
//     new): neither runs nor acks — an idemq.RejectError with reason
//     idemq.ReasonSuspectedDuplicate (dead-lettered with that reason), or,
//     with a bloom.Router as the failure policy, a copy in the
//     suspected-duplicate queue. Counted as idemq.CountUncertain, whatever
//     FailOpen says.
//
// A delivery without a valid ID gets an idemq.RejectError (missing-id or
// invalid-id). The consumer group is the delivery's Group (its Queue when
// empty). The consumer counts processed and duplicate deliveries from
// what the guard returns; the guard counts its own events (in-flight
// deferrals, lost leases, store errors) into idemq.RecorderFrom(ctx).
//
// A lost lease — a renewal finds the record gone or another owner's, or no
// renewal has succeeded for Lease minus LeaseMargin (the store unreachable,
// the process frozen) — cancels the handler's context with
// idemq.ErrLeaseLost as its cause (see [Lease]; a handler checks its lease
// in its own transaction with [LeaseFrom]). The delivery is then given
// back, an in-place idemq.RequeueError with reason RequeueLeaseLost, and
// never acked as processed: its next claim finds it done (acked as a
// duplicate), held by another consumer (deferred) or free (run). A
// handler that succeeds anyway is completed; it is acked only when
// Complete succeeds with its own token, otherwise given back the same way
// (Complete has recorded done if nobody holds the record). Each lost lease
// is logged and counted as idemq.CountLeasesLost.
//
// Store calls stay outside any database transaction: the Pipeline puts the
// guard outside the handler (an inbox, a transaction), so the order is
// claim → begin → effect → commit → complete → ack. Complete and Release
// run on a context that is not cancelled with the handler's, bounded by
// StoreTimeout.
type Guard struct {
	store Store
	cfg   Config
	// claims and completes group concurrent calls when the store is a
	// BatchStore; nil otherwise.
	claims    *coalesce.Batcher[ClaimRequest, ClaimReply]
	completes *coalesce.Batcher[CompleteRequest, error]
	// mixed groups claims and completes together when the store is a
	// MixedBatchStore (claims and completes are nil then).
	mixed *coalesce.Batcher[mixedReq, mixedReply]
	// dup is what a duplicate returns: idemq.Duplicate of the store's
	// layer (a store with a DuplicateLayer() string method names its own,
	// the Bloom tier does), else idemq.LayerGuard.
	dup error
	// tokenBase and tokenSeq make the lease tokens: 80 random bits drawn
	// once, then a counter, so a token is unique across processes without
	// a call to the system's random source per delivery.
	tokenBase string
	tokenSeq  atomic.Uint64
}

var _ idemq.Layer = (*Guard)(nil)

// token returns a new lease token.
func (g *Guard) token() string {
	var buf [48]byte
	return string(strconv.AppendUint(append(buf[:0], g.tokenBase...), g.tokenSeq.Add(1), 32))
}

// NewGuard validates cfg ([Config.Validate]), fills its defaults and
// returns the guard.
func NewGuard(cfg Config) (*Guard, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	g := &Guard{store: cfg.Store, cfg: cfg, dup: idemq.Duplicate(idemq.LayerGuard), tokenBase: rand.Text()[:16] + "-"}
	if l, ok := cfg.Store.(interface{ DuplicateLayer() string }); ok {
		g.dup = idemq.Duplicate(l.DuplicateLayer())
	}
	if ms, ok := cfg.Store.(MixedBatchStore); ok && cfg.MaxBatch > 1 {
		g.mixed = newMixedBatcher(ms, cfg)
	} else if bs, ok := cfg.Store.(BatchStore); ok && cfg.MaxBatch > 1 {
		bc := coalesce.Config{MaxBatch: cfg.MaxBatch, MaxInFlight: cfg.BatchesInFlight, Timeout: cfg.StoreTimeout}
		g.claims = coalesce.New(bs.ClaimBatch, func(err error) ClaimReply {
			return ClaimReply{Err: &StoreError{Op: "claim", Err: err}}
		}, bc)
		g.completes = coalesce.New(bs.CompleteBatch, func(err error) error {
			return &StoreError{Op: "complete", Err: err}
		}, bc)
	}
	return g, nil
}

// Config returns the effective configuration (defaults filled).
func (g *Guard) Config() Config { return g.cfg }

var _ idemq.WorkerHint = (*Guard)(nil)

// Probe checks the guard's store (idemq.Prober): the consumer adds it to
// its breaker's probes, so a failure in a shape nobody listed is an
// outage when the store does not answer, a store outage pauses the
// consumer and the store's return resumes it.
func (g *Guard) Probe(ctx context.Context) error { return Probe(g.store)(ctx) }

var _ idemq.Windowed = (*Guard)(nil)

// DedupWindow implements [idemq.Windowed]: Config.Window. The consumer
// refuses a guard whose window is shorter than its policy's retry
// horizon ([idemq.Pipeline.Validate]).
func (g *Guard) DedupWindow() time.Duration { return g.cfg.Window }

var _ idemq.Prober = (*Guard)(nil)

// SuggestWorkers implements [idemq.WorkerHint]: with a store that groups
// calls ([BatchStore], grouping on), a message costs two round trips
// shared by the deliveries in flight, so the consumer's default Workers
// becomes MaxBatch/2 (64 with the defaults; the consumer caps it at its
// prefetch window). Measured on the Redis store (docs/BENCHMARKS.md,
// RedisTuning): 64 workers beat 32 and 128 both in throughput and in CPU
// per message. Without grouping, no opinion (0).
func (g *Guard) SuggestWorkers(prefetch int) int {
	if g.claims == nil && g.mixed == nil {
		return 0
	}
	return min(max(g.cfg.MaxBatch/2, 1), prefetch)
}

// Wrap returns next guarded (the [idemq.Layer] the Pipeline calls).
func (g *Guard) Wrap(next idemq.Handler) idemq.Handler {
	return idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
		return g.handle(ctx, d, next)
	})
}

// Middleware returns the guard as a middleware, for idemq.Chain outside a
// consumer (tests, a handler run by hand). In a consumer, put the guard in
// Pipeline.Guard: its place is then fixed.
func (g *Guard) Middleware() idemq.Middleware { return g.Wrap }

// claim asks the store for a lease, in a group of concurrent claims when it
// can. StoreTimeout bounds the call; grouped, it bounds each batch (see
// Config.StoreTimeout), so a grouped call needs no timer of its own.
func (g *Guard) claim(ctx context.Context, key, token string) (Claim, error) {
	if g.claims == nil && g.mixed == nil {
		cctx, cancel := context.WithTimeout(ctx, g.cfg.StoreTimeout)
		defer cancel()
		return g.store.Claim(cctx, key, token, g.cfg.Lease)
	}
	if err := ctx.Err(); err != nil {
		return Claim{}, &StoreError{Op: "claim", Err: err}
	}
	if g.mixed != nil {
		r := g.mixed.Do(ctx, mixedReq{claim: ClaimRequest{Key: key, Token: token, Lease: g.cfg.Lease}})
		return r.claim.Claim, r.claim.Err
	}
	r := g.claims.Do(ctx, ClaimRequest{Key: key, Token: token, Lease: g.cfg.Lease})
	return r.Claim, r.Err
}

// completeOnce marks the record done, in a group of concurrent completes
// when it can. It runs even when the handler's context has ended.
func (g *Guard) completeOnce(ctx context.Context, key, token string) error {
	if g.mixed != nil {
		return g.mixed.Do(context.WithoutCancel(ctx), mixedReq{complete: true, done: CompleteRequest{Key: key, Token: token, Window: g.cfg.Window}}).err
	}
	if g.completes != nil {
		return g.completes.Do(context.WithoutCancel(ctx), CompleteRequest{Key: key, Token: token, Window: g.cfg.Window})
	}
	sctx, cancel := g.storeCtx(ctx)
	defer cancel()
	return g.store.Complete(sctx, key, token, g.cfg.Window)
}

func (g *Guard) handle(ctx context.Context, d *idemq.Delivery, next idemq.Handler) error {
	rec := idemq.RecorderFrom(ctx)
	id, err := d.ID()
	if err != nil {
		return err
	}
	group := d.Group
	if group == "" {
		group = d.Queue
	}
	key := Key(g.cfg.Prefix, group, id)
	token := g.token()
	log := keyLog{g.cfg.Logger, key}

	sent := time.Now() // the lease runs from no sooner than this
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
		return next.Handle(ctx, d)
	}

	switch claim.Result {
	case Done:
		log.Debug("idemq: duplicate suppressed")
		return g.dup
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

	lost, err := g.run(ctx, d, next, key, token, sent, log)
	if err != nil && !idemq.IsDuplicate(err) {
		if lost != nil {
			// Cut short (or failed) after the lease was lost: not the
			// message's fault, not processed. Give it back; its next
			// claim decides.
			rec.Add(idemq.CountLeasesLost, 1)
			log.Warn("idemq: handler ended after its dedup lease was lost; delivery given back", "err", err, "lease", lost)
			return idemq.RequeueInPlace(g.leaseLostRetryAfter(), RequeueLeaseLost, fmt.Errorf("%w (handler: %w)", lost, err))
		}
		return err
	}
	// Done: processed, or a duplicate an inbox below recognised (its row
	// is committed); either way the record becomes done.
	outcome := err
	err = g.complete(ctx, rec, key, token, log)
	if errors.Is(err, ErrLeaseLost) {
		// The handler applied its effect without the lease: another
		// consumer may have applied it too. Never acked as if all went
		// well: given back, its next claim finds it done (Complete
		// recorded it unless another owner holds it) or deferred.
		rec.Add(idemq.CountLeasesLost, 1)
		log.Error("idemq: dedup lease was lost before Complete: the effect was applied without it, a concurrent duplicate may have run; delivery given back", "err", err, "lease", lost)
		return idemq.RequeueInPlace(g.leaseLostRetryAfter(), RequeueLeaseLost, fmt.Errorf("%w: %w", idemq.ErrLeaseLost, err))
	}
	if lost != nil {
		log.Warn("idemq: dedup lease was given up while the handler ran, but the store still held it: completed", "lease", lost)
	}
	return outcome
}

// leaseLostRetryAfter is how long a delivery whose lease was lost waits
// before it comes back.
func (g *Guard) leaseLostRetryAfter() time.Duration {
	if g.cfg.InFlightRetryAfter > 0 {
		return g.cfg.InFlightRetryAfter
	}
	return time.Second
}

// run runs the handler under its lease (heartbeat, deadline, cancelled
// context) and releases the record when the handler fails or panics. lost
// says why the lease was lost while the handler ran, or is nil.
func (g *Guard) run(ctx context.Context, d *idemq.Delivery, next idemq.Handler, key, token string, sent time.Time, log keyLog) (lost, err error) {
	lease, hctx := g.newLease(ctx, key, token, sent)
	lease.start(hctx)
	ok := false
	defer func() {
		lost = lease.stop()
		lease.cancel(ErrLeaseEnded)
		if !ok {
			g.release(ctx, key, token, lost != nil, log)
		}
	}()
	err = next.Handle(hctx, d)
	ok = err == nil || idemq.IsDuplicate(err)
	return nil, err
}

// storeCtx is a context for a store call that must happen even when the
// handler's context has ended (Complete, Release, Extend).
func (g *Guard) storeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), g.cfg.StoreTimeout)
}

// complete marks the record done, retrying a failing store a few times.
// It returns nil when it did with our token, an error wrapping
// ErrLeaseLost when the lease was lost, and nil after logging when the
// store kept failing: the effect is applied, so acking is right then —
// requeueing would run it again, as nothing records it.
func (g *Guard) complete(ctx context.Context, rec idemq.Recorder, key, token string, log keyLog) error {
	var err error
	for attempt, pause := 0, 50*time.Millisecond; attempt < 3; attempt, pause = attempt+1, pause*4 {
		if attempt > 0 {
			time.Sleep(pause)
		}
		err = g.completeOnce(ctx, key, token)
		if err == nil || errors.Is(err, ErrLeaseLost) {
			return err
		}
	}
	rec.Add(idemq.CountStoreErrors, 1)
	log.Error("idemq: dedup Complete failed; the message is acked but not remembered, a later duplicate may run", "err", err)
	return nil
}

// release deletes the record if it is still ours. lost says the lease was
// known lost (a refusal is then expected).
func (g *Guard) release(ctx context.Context, key, token string, lost bool, log keyLog) {
	sctx, cancel := g.storeCtx(ctx)
	err := g.store.Release(sctx, key, token)
	cancel()
	switch {
	case err == nil:
	case lost && errors.Is(err, ErrLeaseLost):
		log.Debug("idemq: dedup Release of a lost lease refused", "err", err)
	default:
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
