package idemqtest

import (
	"context"
	"runtime"
	"sync/atomic"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/inbox"
)

// Point is a place in the processing of a delivery where the kit simulates
// a crash of the consumer.
type Point string

// The crash points, in the order a delivery passes them.
const (
	// BeforeClaim: the delivery was received, no layer ran (the kit does
	// not run the pipeline at all).
	BeforeClaim Point = "before-claim"
	// InHandler: inside the handler, the effect written but not committed.
	// The kit cannot see inside a handler: it is reached where the handler
	// calls [CrashPoint](ctx, InHandler), or through [BeforeCommit] around
	// an inbox handler. A scenario whose handler never reaches it says so
	// (Scenario.Reached false).
	InHandler Point = "in-handler"
	// AfterCommit: Pipeline.Handler returned nil — its transaction (its
	// own, or the inbox's) is committed — but the guard has not completed
	// its record and nothing is acked. The kit wraps Pipeline.Handler.
	AfterCommit Point = "after-commit"
	// BeforeAck: the chain returned and the policy decided; the decision
	// is not carried out (no ack).
	BeforeAck Point = "before-ack"
)

// AllPoints are the crash points [Check] simulates by default.
var AllPoints = []Point{BeforeClaim, InHandler, AfterCommit, BeforeAck}

// attempt is what the kit puts in the context of one delivery attempt.
type attempt struct {
	point   Point         // the point armed in this scenario ("" none)
	budget  *atomic.Int32 // crashes left for this message
	crashed atomic.Bool   // this attempt crashed
	reached *atomic.Bool  // the scenario's point was reached at least once
}

type attemptKey struct{}

// CrashPoint is the hook a handler calls at a crash point the kit cannot
// see from outside (InHandler: after writing its effect, right before it
// commits). Outside [Check] it does nothing. Under Check, when the running
// scenario crashes at p and this message still has a crash to take, it
// ends the calling goroutine with runtime.Goexit: nothing after it runs
// (no commit, no Complete, no ack), and the deferred calls pending on the
// goroutine do — an open transaction rolls back, the dedup guard gives its
// claim up — as a process's death amounts to once its connections drop
// and its lease expires. The kit then redelivers the message with Redelivered set.
func CrashPoint(ctx context.Context, p Point) {
	if crash(ctx, p) {
		runtime.Goexit()
	}
}

// crash reports whether the attempt in ctx crashes at p (and records it).
func crash(ctx context.Context, p Point) bool {
	a, ok := ctx.Value(attemptKey{}).(*attempt)
	if !ok || a.point != p || a.crashed.Load() {
		return false
	}
	a.reached.Store(true)
	for {
		n := a.budget.Load()
		if n <= 0 {
			return false
		}
		if a.budget.CompareAndSwap(n, n-1) {
			a.crashed.Store(true)
			return true
		}
	}
}

// BeforeCommit wraps an inbox handler so that the InHandler crash point is
// reached after h wrote its effect in the inbox's transaction, before the
// inbox commits: ib.Handler(idemqtest.BeforeCommit(effect)). Outside
// [Check] it is h.
func BeforeCommit[T any](h inbox.HandlerFunc[T]) inbox.HandlerFunc[T] {
	return func(ctx context.Context, tx T, d *idemq.Delivery) error {
		if err := h(ctx, tx, d); err != nil {
			return err
		}
		CrashPoint(ctx, InHandler)
		return nil
	}
}
