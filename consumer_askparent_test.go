package idemq

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"
)

// onDemand is a context that decides it is done only when asked (as the
// dedup guard's lease context does after a freeze): no timer, no goroutine.
type onDemand struct {
	context.Context
	cancel context.CancelCauseFunc
	lost   *atomic.Bool
}

var errOnDemand = errors.New("lost on demand")

func (c onDemand) check() {
	if c.lost.Load() {
		c.cancel(errOnDemand)
	}
}
func (c onDemand) Done() <-chan struct{} { c.check(); return c.Context.Done() }
func (c onDemand) Err() error            { c.check(); return c.Context.Err() }

// The handler deadline must not hide a parent that decides when asked:
// the handler's ctx.Err() (and Done) ask the parent, and its cancellation
// reaches the handler's context at once. (TestConsumerFrozenPastItsLease
// failed in CI: the thawed handler's ctx.Err() was nil behind the
// deadline's derived context.)
func TestHandlerDeadlineAsksTheParent(t *testing.T) {
	for _, viaDone := range []bool{false, true} {
		c := &Consumer{cfg: ConsumerConfig{HandlerTimeout: time.Hour}.withDefaults(), log: slog.New(slog.DiscardHandler)}
		base, cancel := context.WithCancelCause(context.Background())
		defer cancel(nil)
		lost := &atomic.Bool{}
		parent := onDemand{Context: base, cancel: cancel, lost: lost}
		var seen error
		h := c.deadline(HandlerFunc(func(ctx context.Context, d *Delivery) error {
			lost.Store(true) // the lease is gone; nobody has asked yet
			if viaDone {
				select {
				case <-ctx.Done():
				default:
					t.Error("ctx.Done() not closed after the parent decided it is done")
				}
			}
			seen = ctx.Err()
			return nil
		}))
		_ = h.Handle(parent, &Delivery{ReceivedAt: time.Now()})
		if seen == nil {
			t.Fatalf("viaDone=%v: handler's ctx.Err() = nil while its parent is done when asked", viaDone)
		}
	}
}
