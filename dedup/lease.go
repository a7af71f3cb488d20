package dedup

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemq/idemq"
)

// ErrLeaseEnded is what [Lease.Check] returns once the guard has finished
// with the delivery (the handler returned): the lease is no longer the
// handler's to use.
var ErrLeaseEnded = errors.New("dedup: the lease ended with the handler")

// Lease is the dedup lease the guard holds on the message being handled:
// the record "<prefix>:<group>:<id>" is processing(Token) in the store for
// as long as the heartbeat renews it. Get it in a handler with [LeaseFrom].
//
// The guard cancels the handler's context — with [idemq.ErrLeaseLost] as
// its cause ([context.Cause]) — as soon as it learns the lease is lost: a
// renewal finds the record gone or another owner's, or no renewal has
// succeeded for Lease minus LeaseMargin (the store unreachable, the
// process frozen by a stop-the-world pause, a VM freeze or SIGSTOP). The
// last check is made against the monotonic clock every time the handler's
// context is asked for Err or Done, so a process that wakes up after its
// lease ran out finds its context cancelled before its timers have fired.
//
// A cancelled context stops work that watches it; it cannot recall a
// write already on its way. A handler whose effect must never be applied
// by an owner that lost the lease calls [Lease.Check] right before it
// commits (inside its transaction, as its last statement before COMMIT):
// Check fails unless the store confirms the lease is still this
// delivery's, and renews it, so the commit that follows has a whole lease
// (minus the margin) to land. Only the inbox (a row inserted in the
// effect's own transaction) closes the remaining window — a process frozen
// between Check and COMMIT.
type Lease struct {
	key, token string
	g          *Guard
	cancel     context.CancelCauseFunc
	valid      time.Duration // Lease - LeaseMargin: how long a renewal is trusted
	base       time.Time     // monotonic origin of renewed

	renewed atomic.Int64 // when the last successful claim/renewal was sent, since base
	lost    atomic.Pointer[error]
	ended   atomic.Bool

	mu       sync.Mutex // guards the timers and stopped
	stopped  bool
	hb, dl   *time.Timer
	extendMu sync.Mutex // one renewal at a time (heartbeat, Check)

	hctx leaseContext // the handler's context (one allocation with the lease)
}

type leaseKey struct{}

// LeaseFrom returns the dedup lease of the delivery being handled, or
// ok=false outside a guarded handler (and when the guard runs a handler
// unguarded, fail-open).
//
// Use it to check, in the handler's own transaction, that no other
// consumer has taken the message meanwhile:
//
//	lease, _ := dedup.LeaseFrom(ctx)
//	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
//	defer cancel()
//	tx, _ := db.BeginTx(tctx, nil) // not cancelled by a lost lease: Check decides
//	// ... the effect ...
//	if err := lease.Check(ctx); err != nil {
//		tx.Rollback()
//		return err // the guard gives the delivery back
//	}
//	return tx.Commit()
func LeaseFrom(ctx context.Context) (*Lease, bool) {
	l, ok := ctx.Value(leaseKey{}).(*Lease)
	return l, ok && l != nil
}

// Key returns the store key the lease is on ("<prefix>:<group>:<id>").
func (l *Lease) Key() string { return l.key }

// Token returns the owner token of the lease: the store's record is
// processing(Token) while the lease is held. It is unique per delivery
// attempt.
func (l *Lease) Token() string { return l.token }

// Err returns nil while the lease is held, and an error wrapping
// [idemq.ErrLeaseLost] once it is lost (the handler's context is then
// cancelled with it). It asks nothing of the store: it checks the last
// renewal against the monotonic clock.
func (l *Lease) Err() error {
	if p := l.lost.Load(); p != nil {
		// Another goroutine may be declaring it lost right now, between
		// recording why and cancelling: cancel here too (idempotent, the
		// first cause wins), so whoever sees the lease lost sees the
		// handler's context cancelled as well.
		l.cancel(*p)
		return *p
	}
	if l.ended.Load() {
		return nil
	}
	if age := l.age(); age >= l.valid {
		l.lose(fmt.Errorf("%w: no renewal for %v (lease %v, margin %v)", idemq.ErrLeaseLost,
			age.Round(time.Millisecond), l.g.cfg.Lease, l.g.cfg.LeaseMargin))
		return *l.lost.Load()
	}
	return nil
}

// Remaining returns how long the lease is trusted without another renewal
// (0 once lost).
func (l *Lease) Remaining() time.Duration {
	if l.Err() != nil {
		return 0
	}
	return max(l.valid-l.age(), 0)
}

// Check asks the store whether the lease is still this delivery's, and
// renews it. It returns nil when it is (the lease then runs a whole Lease
// from now), an error wrapping [idemq.ErrLeaseLost] when it is lost (and
// cancels the handler's context), a [*StoreError] when the store cannot
// answer (the lease is not declared lost for that, but no renewal was
// made: do not commit on it), or [ErrLeaseEnded] after the handler
// returned.
func (l *Lease) Check(ctx context.Context) error {
	if err := l.Err(); err != nil {
		return err
	}
	if l.ended.Load() {
		return ErrLeaseEnded
	}
	return l.renew(ctx)
}

func (l *Lease) age() time.Duration {
	return time.Since(l.base) - time.Duration(l.renewed.Load())
}

// lose records why the lease is lost (the first reason wins) and cancels
// the handler's context with it.
func (l *Lease) lose(cause error) {
	if !l.lost.CompareAndSwap(nil, &cause) {
		return
	}
	l.cancel(cause) // before anything slow: readers check lost, then the context
	if !l.ended.Load() {
		keyLog{l.g.cfg.Logger, l.key}.Warn("idemq: dedup lease lost while the handler runs; its context is cancelled", "err", cause)
	}
}

// renew extends the lease in the store. A renewal is trusted from the
// moment it was sent.
func (l *Lease) renew(ctx context.Context) error {
	l.extendMu.Lock()
	defer l.extendMu.Unlock()
	if err := l.Err(); err != nil {
		return err
	}
	sent := time.Since(l.base)
	sctx, cancel := l.g.storeCtx(ctx)
	err := l.g.store.Extend(sctx, l.key, l.token, l.g.cfg.Lease)
	cancel()
	switch {
	case err == nil:
		// The store still held processing(token): nobody took it since
		// the last renewal. Unless the lease was declared lost meanwhile
		// (then it stays lost: a cancelled context is final).
		if l.lost.Load() != nil {
			return *l.lost.Load()
		}
		if int64(sent) > l.renewed.Load() {
			l.renewed.Store(int64(sent))
		}
		return nil
	case errors.Is(err, ErrLeaseLost):
		l.lose(fmt.Errorf("%w: the store no longer holds it for this delivery (%w)", idemq.ErrLeaseLost, err))
		return *l.lost.Load()
	default:
		return err
	}
}

// start arms the heartbeat. Until it fires the lease is checked only when
// asked (Err, the context); the deadline timer is armed by the first beat,
// so a handler shorter than Heartbeat costs one timer.
func (l *Lease) start(ctx context.Context) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.hb = time.AfterFunc(l.g.cfg.Heartbeat, func() { l.beat(ctx) })
}

// beat renews the lease and schedules the next beat: after Heartbeat when
// it worked, sooner (half the time the lease is still trusted) when the
// store could not answer.
func (l *Lease) beat(ctx context.Context) {
	if l.Err() != nil { // woken up late, past the deadline: lost, no renewal
		return
	}
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return
	}
	if l.dl == nil {
		l.dl = time.AfterFunc(l.valid-l.age(), l.deadline)
	}
	l.mu.Unlock()

	next := l.g.cfg.Heartbeat
	if err := l.renew(ctx); err != nil {
		if l.Err() != nil {
			return
		}
		next = min(next, max(l.Remaining()/2, 10*time.Millisecond))
		keyLog{l.g.cfg.Logger, l.key}.Warn("idemq: dedup lease renewal failed; retrying", "err", err, "after", next, "trusted_for", l.Remaining())
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.stopped {
		l.hb.Reset(next)
	}
}

// deadline fires when the last renewal may have run out: it declares the
// lease lost unless a renewal came in meanwhile, then it waits for the new
// deadline.
func (l *Lease) deadline() {
	if l.Err() != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.stopped {
		l.dl.Reset(max(l.valid-l.age(), time.Millisecond))
	}
}

// stop ends the lease's use by the handler: no more renewals (it waits for
// one in progress) and no more deadline. It returns why the lease was
// lost, or nil.
func (l *Lease) stop() error {
	err := l.Err() // a last look: past the deadline when the handler returned is lost too
	l.ended.Store(true)
	l.mu.Lock()
	l.stopped = true
	if l.hb != nil {
		l.hb.Stop()
	}
	if l.dl != nil {
		l.dl.Stop()
	}
	l.mu.Unlock()
	l.extendMu.Lock() // a renewal in progress finishes first
	l.extendMu.Unlock()
	if p := l.lost.Load(); p != nil {
		return *p
	}
	return err
}

// leaseContext is the handler's context: a cancel-cause context that also
// checks the lease's deadline whenever it is asked whether it is done, so
// a handler never sees a live context for a lease it may have lost, even
// when the process was frozen and its timers have not fired yet.
type leaseContext struct {
	context.Context
	l *Lease
}

func (c *leaseContext) Done() <-chan struct{} {
	_ = c.l.Err()
	return c.Context.Done()
}

func (c *leaseContext) Err() error {
	_ = c.l.Err()
	return c.Context.Err()
}

func (c *leaseContext) Value(key any) any {
	if key == (leaseKey{}) {
		return c.l
	}
	return c.Context.Value(key)
}

// newLease returns the lease of a claim sent at sent, and the handler's
// context, cancelled when the lease is lost.
func (g *Guard) newLease(ctx context.Context, key, token string, sent time.Time) (*Lease, context.Context) {
	cctx, cancel := context.WithCancelCause(ctx)
	l := &Lease{key: key, token: token, g: g, cancel: cancel, valid: g.cfg.Lease - g.cfg.LeaseMargin, base: sent}
	l.hctx = leaseContext{Context: cctx, l: l}
	return l, &l.hctx
}
