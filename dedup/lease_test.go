package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
)

// extendFails is a store whose renewals fail as an unreachable backend's do
// (claims and the rest work).
type extendFails struct{ *dedup.Memory }

func (extendFails) Extend(context.Context, string, string, time.Duration) error {
	return &dedup.StoreError{Op: "extend", Err: errors.New("connection refused (test)")}
}

// A lost lease cancels the handler's context, with idemq.ErrLeaseLost as
// the cause, and the delivery is given back (an in-place requeue: not a
// failed attempt, not acked): whether a renewal finds the lease taken, or
// renewals fail until the lease may have run out (Lease minus LeaseMargin
// since the last successful one).
func TestGuardCancelsTheHandlerWhenTheLeaseIsLost(t *testing.T) {
	const lease = 400 * time.Millisecond
	tests := []struct {
		name  string
		store func(*dedup.Memory) dedup.Store
		steal bool          // another consumer takes the record meanwhile
		min   time.Duration // earliest the handler may be cancelled
	}{
		{"renewal finds it taken", func(m *dedup.Memory) dedup.Store { return m }, true, 0},
		{"renewals fail", func(m *dedup.Memory) dedup.Store { return extendFails{m} }, false, lease / 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mem := dedup.NewMemory(dedup.MemoryConfig{})
			counters := &idemq.Counters{}
			ctx := idemq.WithRecorder(context.Background(), counters)
			key := dedup.Key("idemq", "g", "m1")
			var cause error
			var after time.Duration
			h := idemq.Chain(idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
				start := time.Now()
				if tc.steal {
					_ = mem.Forget(context.Background(), key)
					if _, err := mem.Claim(context.Background(), key, "thief", time.Minute); err != nil {
						return err
					}
				}
				select {
				case <-ctx.Done():
				case <-time.After(10 * time.Second):
					return errors.New("the handler's context was never cancelled")
				}
				cause, after = context.Cause(ctx), time.Since(start)
				return ctx.Err()
			}), guardMW(tc.store(mem), dedup.Config{Lease: lease, Logger: quiet()}))
			err := h.Handle(ctx, delivery("m1"))
			if !errors.Is(cause, idemq.ErrLeaseLost) {
				t.Fatalf("handler context cause = %v, want idemq.ErrLeaseLost", cause)
			}
			// Cancelled by the guard (not the 10s fallback), and not before
			// the deadline could pass (generous bounds: a busy machine).
			if after < tc.min || after > 5*time.Second {
				t.Fatalf("cancelled after %v, want within [%v, 5s]", after, tc.min)
			}
			var rq *idemq.RequeueError
			if !errors.As(err, &rq) || rq.Reason != dedup.RequeueLeaseLost || !rq.InPlace || !errors.Is(err, idemq.ErrLeaseLost) {
				t.Fatalf("guard returned %v, want an in-place %s requeue wrapping idemq.ErrLeaseLost", err, dedup.RequeueLeaseLost)
			}
			if n := counters.Get(idemq.CountLeasesLost); n != 1 {
				t.Fatalf("leases lost = %d, want 1", n)
			}
			rec, ok, _ := mem.Get(context.Background(), key)
			switch {
			case tc.steal && (!ok || rec.Owner != "thief" || rec.State != dedup.StateProcessing):
				t.Fatalf("record %+v ok=%v, want the thief's lease untouched", rec, ok)
			case !tc.steal && ok:
				t.Fatalf("record %+v left behind, want it released (a redelivery runs at once)", rec)
			}
		})
	}
}

// The guard gives a lease up at its deadline even when the store still
// holds it (the margin). A handler that returns an error then is given
// back, its record released; one that succeeds anyway is completed with
// its own token and acked — not counted as a lost lease.
func TestGuardDeadlineWithTheStoreStillHolding(t *testing.T) {
	for _, fail := range []bool{false, true} {
		t.Run(map[bool]string{false: "handler succeeds", true: "handler fails"}[fail], func(t *testing.T) {
			frozen := time.Unix(1000, 0)
			mem := dedup.NewMemory(dedup.MemoryConfig{Now: func() time.Time { return frozen }}) // never expires
			counters := &idemq.Counters{}
			ctx := idemq.WithRecorder(context.Background(), counters)
			h := idemq.Chain(idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
				select {
				case <-ctx.Done():
				case <-time.After(10 * time.Second):
					return errors.New("never cancelled")
				}
				if fail {
					return ctx.Err()
				}
				return nil
			}), guardMW(extendFails{mem}, dedup.Config{Lease: 300 * time.Millisecond, Logger: quiet()}))
			err := h.Handle(ctx, delivery("m1"))
			rec, ok, _ := mem.Get(context.Background(), dedup.Key("idemq", "g", "m1"))
			if fail {
				var rq *idemq.RequeueError
				if !errors.As(err, &rq) || rq.Reason != dedup.RequeueLeaseLost || counters.Get(idemq.CountLeasesLost) != 1 {
					t.Fatalf("err = %v, leases lost %d; want a lease-lost requeue, 1", err, counters.Get(idemq.CountLeasesLost))
				}
				if ok {
					t.Fatalf("record %+v left behind, want it released", rec)
				}
				return
			}
			if err != nil || counters.Get(idemq.CountLeasesLost) != 0 {
				t.Fatalf("err = %v, leases lost %d; want nil (Complete succeeded with our token), 0", err, counters.Get(idemq.CountLeasesLost))
			}
			if !ok || rec.State != dedup.StateDone {
				t.Fatalf("record %+v ok=%v, want done", rec, ok)
			}
		})
	}
}

// The handler sees its lease: key, token, and Check, which asks the store
// (and renews); once another owner holds the record Check fails, wrapping
// idemq.ErrLeaseLost, and the handler's context is cancelled with it.
func TestLeaseFromAndCheck(t *testing.T) {
	h := newHarness()
	key := dedup.Key("idemq", "g", "m1")
	var checks []error
	var cause error
	g := h.handler(dedup.Config{}, func(ctx context.Context, d *idemq.Delivery) error {
		lease, ok := dedup.LeaseFrom(ctx)
		if !ok {
			return errors.New("no lease in the handler's context")
		}
		rec, _ := h.record(t, "m1")
		if lease.Key() != key || lease.Token() == "" || rec.Owner != lease.Token() {
			return fmt.Errorf("lease %q/%q, record %+v", lease.Key(), lease.Token(), rec)
		}
		if r := lease.Remaining(); r <= 0 || r > 30*time.Second {
			return fmt.Errorf("Remaining = %v", r)
		}
		checks = append(checks, lease.Check(ctx), lease.Err(), ctx.Err())
		_ = h.store.Forget(context.Background(), key)
		_, _ = h.store.Claim(context.Background(), key, "thief", time.Minute)
		checks = append(checks, lease.Check(ctx), lease.Err(), ctx.Err())
		cause = context.Cause(ctx)
		return ctx.Err()
	})
	err := g.Handle(h.ctx, delivery("m1"))
	if len(checks) != 6 {
		t.Fatalf("handler: %v", err)
	}
	for i, c := range checks[:3] {
		if c != nil {
			t.Fatalf("check %d while held: %v", i, c)
		}
	}
	if !errors.Is(checks[3], idemq.ErrLeaseLost) || !errors.Is(checks[3], dedup.ErrLeaseLost) || !errors.Is(checks[4], idemq.ErrLeaseLost) ||
		!errors.Is(checks[5], context.Canceled) || !errors.Is(cause, idemq.ErrLeaseLost) {
		t.Fatalf("after the theft: Check %v, Err %v, ctx.Err %v, cause %v", checks[3], checks[4], checks[5], cause)
	}
	if !errors.Is(err, idemq.ErrLeaseLost) {
		t.Fatalf("guard returned %v, want a lease-lost requeue", err)
	}
	if _, ok := dedup.LeaseFrom(context.Background()); ok {
		t.Fatal("LeaseFrom outside a guarded handler: ok")
	}
}

// A Lease kept past the handler refuses to be used.
func TestLeaseCheckAfterTheHandlerReturned(t *testing.T) {
	h := newHarness()
	var lease *dedup.Lease
	var hctx context.Context
	g := h.handler(dedup.Config{}, func(ctx context.Context, d *idemq.Delivery) error {
		lease, _ = dedup.LeaseFrom(ctx)
		hctx = ctx
		return nil
	})
	if err := g.Handle(h.ctx, delivery("m1")); err != nil {
		t.Fatal(err)
	}
	if err := lease.Check(context.Background()); !errors.Is(err, dedup.ErrLeaseEnded) {
		t.Fatalf("Check after the handler returned: %v, want ErrLeaseEnded", err)
	}
	if !errors.Is(context.Cause(hctx), dedup.ErrLeaseEnded) {
		t.Fatalf("handler context after return: cause %v, want ErrLeaseEnded", context.Cause(hctx))
	}
}

func TestNewGuardRejectsConfigsItCannotRun(t *testing.T) {
	mem := dedup.NewMemory(dedup.MemoryConfig{})
	tests := []struct {
		name  string
		store dedup.Store
		cfg   dedup.Config
		ok    bool
	}{
		{"defaults", mem, dedup.Config{}, true},
		{"heartbeat just under the lease", mem, dedup.Config{Lease: time.Second, Heartbeat: 900 * time.Millisecond}, true},
		{"nil store", nil, dedup.Config{}, false},
		{"heartbeat equals lease", mem, dedup.Config{Lease: time.Second, Heartbeat: time.Second}, false},
		{"heartbeat longer than lease", mem, dedup.Config{Lease: time.Second, Heartbeat: 2 * time.Second}, false},
		{"default lease, long heartbeat", mem, dedup.Config{Heartbeat: time.Minute}, false},
		{"margin leaves no time to renew", mem, dedup.Config{Lease: time.Second, Heartbeat: 500 * time.Millisecond, LeaseMargin: 500 * time.Millisecond}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Store = tc.store
			g, err := dedup.NewGuard(tc.cfg)
			if tc.ok {
				if err != nil || g == nil {
					t.Fatalf("NewGuard: %v", err)
				}
				return
			}
			if !errors.Is(err, dedup.ErrInvalidConfig) || g != nil {
				t.Fatalf("NewGuard = %v, want an ErrInvalidConfig error", err)
			}
			if verr := tc.cfg.Validate(); verr == nil || verr.Error() != err.Error() {
				t.Fatalf("Validate = %v, want the NewGuard error", verr)
			}
			t.Log(err)
		})
	}
}

// blockingLog is a slog handler that, on the guard's "lease lost" warning,
// tells entered and blocks until release is closed: it holds the goroutine
// that declared the lease lost in the middle of doing so.
type blockingLog struct {
	entered chan struct{}
	release chan struct{}
	once    *sync.Once
}

func (blockingLog) Enabled(context.Context, slog.Level) bool { return true }
func (b blockingLog) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "lease lost") {
		b.once.Do(func() { close(b.entered) })
		<-b.release
	}
	return nil
}
func (b blockingLog) WithAttrs([]slog.Attr) slog.Handler { return b }
func (b blockingLog) WithGroup(string) slog.Handler      { return b }

// Once the lease is declared lost, every reader of the handler's context
// sees it cancelled at once — not only after the goroutine that declared
// it (a timer, the heartbeat) has finished logging and cancelling. A
// thawed process's handler asks its context right before its effect while
// its late timers declare the lease lost: it must not get a nil Err then.
func TestLeaseLostIsSeenByEveryReaderAtOnce(t *testing.T) {
	mem := dedup.NewMemory(dedup.MemoryConfig{})
	logs := blockingLog{entered: make(chan struct{}), release: make(chan struct{}), once: &sync.Once{}}
	var sawErr, sawCause error
	var doneClosed bool
	h := idemq.Chain(idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
		select {
		case <-logs.entered: // a timer is declaring the lease lost, held in its log line
		case <-time.After(10 * time.Second):
			return errors.New("the lease was never declared lost")
		}
		sawErr, sawCause = ctx.Err(), context.Cause(ctx)
		select {
		case <-ctx.Done():
			doneClosed = true
		default:
		}
		close(logs.release)
		return sawErr
	}), guardMW(extendFails{mem}, dedup.Config{Lease: 300 * time.Millisecond, Logger: slog.New(logs)}))
	_ = h.Handle(context.Background(), delivery("m1"))
	if !errors.Is(sawErr, context.Canceled) || !errors.Is(sawCause, idemq.ErrLeaseLost) || !doneClosed {
		t.Fatalf("handler's context while the lease is being declared lost: Err %v, Cause %v, Done closed %v; want Canceled, ErrLeaseLost, true",
			sawErr, sawCause, doneClosed)
	}
}
