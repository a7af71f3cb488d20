package idemq

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"sync"
	"testing"
	"time"
)

type ctxKey struct{}

// newHandlerContext is a handler context as the deadline middleware makes
// it, limit from now.
func newHandlerContext(parent context.Context, limit time.Duration) *handlerContext {
	return &handlerContext{parent: parent, at: time.Now().Add(limit), limit: limit}
}

// waitDone waits for ctx to be done, failing the test after a deadline.
func waitDone(t *testing.T, ctx context.Context, what string) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not done after 10s", what)
	}
}

// The lazy handler context behaves as context.WithDeadlineCause under the
// parent would, whichever question is asked first: Err, Done, Cause,
// Value, or a child made from it.
func TestHandlerContextSemantics(t *testing.T) {
	const limit = 30 * time.Millisecond
	for _, tc := range []struct {
		name string
		// wait brings the context to its deadline by the route under test.
		wait func(t *testing.T, ctx *handlerContext)
	}{
		{"err-polled", func(t *testing.T, ctx *handlerContext) {
			deadline := time.Now().Add(10 * time.Second)
			for ctx.Err() == nil {
				if time.Now().After(deadline) {
					t.Fatal("Err still nil 10s after the deadline")
				}
				time.Sleep(time.Millisecond)
			}
		}},
		{"done", func(t *testing.T, ctx *handlerContext) { waitDone(t, ctx, "Done") }},
		{"child", func(t *testing.T, ctx *handlerContext) {
			child, cancel := context.WithCancel(ctx)
			defer cancel()
			waitDone(t, child, "a child of the handler context")
			if !errors.Is(context.Cause(child), ErrHandlerTimeout) {
				t.Fatalf("child's cause %v, want ErrHandlerTimeout", context.Cause(child))
			}
		}},
		{"cause-first", func(t *testing.T, ctx *handlerContext) {
			// Nobody asked before the deadline: the first question
			// after it is Cause.
			for d := time.Until(ctx.at); d > 0; d = time.Until(ctx.at) {
				time.Sleep(d)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := context.WithValue(context.Background(), ctxKey{}, "v")
			ctx := newHandlerContext(parent, limit)
			if ctx.Value(ctxKey{}) != "v" {
				t.Fatal("the parent's values are not seen")
			}
			if at, ok := ctx.Deadline(); !ok || !at.Equal(ctx.at) {
				t.Fatalf("Deadline() = %v, %v; want %v", at, ok, ctx.at)
			}
			tc.wait(t, ctx)
			if !errors.Is(context.Cause(ctx), ErrHandlerTimeout) {
				t.Fatalf("Cause = %v, want ErrHandlerTimeout", context.Cause(ctx))
			}
			var hte handlerTimeoutCause
			if !errors.As(context.Cause(ctx), &hte) || time.Duration(hte) != limit {
				t.Fatalf("Cause = %v, want the limit %v in it", context.Cause(ctx), limit)
			}
			if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				t.Fatalf("Err = %v, want DeadlineExceeded", ctx.Err())
			}
			waitDone(t, ctx, "Done after the deadline")
			if ctx.Value(ctxKey{}) != "v" {
				t.Fatal("the parent's values are lost after the deadline")
			}
			ctx.end()
			if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				t.Fatalf("Err after end = %v, want DeadlineExceeded still", ctx.Err())
			}
		})
	}
}

// After the handler returned its context is cancelled (Canceled), whether
// or not anyone asked before; a parent's cancellation and cause come
// through; the earlier of the two deadlines is reported.
func TestHandlerContextEndAndParent(t *testing.T) {
	for _, asked := range []bool{false, true} {
		ctx := newHandlerContext(context.Background(), time.Hour)
		if asked {
			_ = ctx.Done()
		}
		if ctx.Err() != nil {
			t.Fatalf("asked=%v: Err %v before end", asked, ctx.Err())
		}
		ctx.end()
		waitDone(t, ctx, "Done after end")
		if !errors.Is(ctx.Err(), context.Canceled) || !errors.Is(context.Cause(ctx), context.Canceled) {
			t.Fatalf("asked=%v: after end Err %v, Cause %v; want Canceled", asked, ctx.Err(), context.Cause(ctx))
		}
	}

	// Ended before its deadline, first asked after it (a goroutine the
	// handler left behind): cancelled by the end, not timed out; a
	// parent cancelled after the end does not change that.
	errLater := errors.New("parent cancelled after the handler returned")
	for _, route := range []string{"err", "cause", "child", "parent-after"} {
		parent, cancel := context.WithCancelCause(context.Background())
		ctx := newHandlerContext(parent, 20*time.Millisecond)
		ctx.end()
		for d := time.Until(ctx.at); d > 0; d = time.Until(ctx.at) {
			time.Sleep(d)
		}
		var err, cause error
		switch route {
		case "err":
			err, cause = ctx.Err(), context.Cause(ctx)
		case "cause":
			cause, err = context.Cause(ctx), ctx.Err()
		case "child":
			child, cc := context.WithCancel(ctx)
			waitDone(t, child, "child of an ended context")
			err, cause = child.Err(), context.Cause(child)
			cc()
		case "parent-after":
			cancel(errLater)
			cause, err = context.Cause(ctx), ctx.Err()
		}
		if !errors.Is(err, context.Canceled) || !errors.Is(cause, context.Canceled) {
			t.Fatalf("%s: ended before its deadline, asked after: Err %v, Cause %v; want Canceled for both", route, err, cause)
		}
		cancel(nil)
	}

	// Done by its own end or deadline, it stays so when its parent ends
	// later: Err does not change once non-nil, and agrees with Cause.
	for _, tc := range []struct {
		name      string
		limit     time.Duration
		ask       bool // Done asked before (the timer context made)
		end       bool // the handler returns before the parent ends
		want      error
		wantCause error
	}{
		{"ended-then-parent-deadline", time.Hour, false, true, context.Canceled, context.Canceled},
		{"ended-asked-then-parent-deadline", time.Hour, true, true, context.Canceled, context.Canceled},
		{"own-deadline-then-parent-deadline", 10 * time.Millisecond, true, false, context.DeadlineExceeded, ErrHandlerTimeout},
	} {
		parent, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		ctx := newHandlerContext(parent, tc.limit)
		if tc.ask {
			_ = ctx.Done()
		}
		if tc.end {
			ctx.end()
		} else {
			waitDone(t, ctx, tc.name)
		}
		first := ctx.Err()
		waitDone(t, parent, "the parent")
		if got := ctx.Err(); !errors.Is(first, tc.want) || got != first || !errors.Is(context.Cause(ctx), tc.wantCause) {
			t.Fatalf("%s: Err %v, then %v after the parent's deadline, Cause %v; want %v throughout, cause %v",
				tc.name, first, got, context.Cause(ctx), tc.want, tc.wantCause)
		}
		ctx.end()
		cancel()
	}

	errShutdown := errors.New("shutting down")
	for _, asked := range []bool{false, true} {
		parent, cancel := context.WithCancelCause(context.Background())
		ctx := newHandlerContext(parent, time.Hour)
		if asked {
			_ = ctx.Done()
		}
		cancel(errShutdown)
		waitDone(t, ctx, "Done after the parent's cancel")
		if !errors.Is(ctx.Err(), context.Canceled) || !errors.Is(context.Cause(ctx), errShutdown) {
			t.Fatalf("asked=%v: Err %v, Cause %v; want Canceled, the parent's cause", asked, ctx.Err(), context.Cause(ctx))
		}
		ctx.end()
	}

	early := time.Now().Add(time.Minute)
	parent, cancel := context.WithDeadline(context.Background(), early)
	defer cancel()
	if at, _ := newHandlerContext(parent, time.Hour).Deadline(); !at.Equal(early) {
		t.Fatalf("Deadline %v, want the parent's earlier %v", at, early)
	}
	if at, _ := newHandlerContext(parent, time.Second).Deadline(); !at.After(time.Now()) || !at.Before(early) {
		t.Fatalf("Deadline %v, want its own, before the parent's", at)
	}
}

// Every question from many goroutines while the handler ends and the
// deadline passes: one answer for all (run with -race).
func TestHandlerContextConcurrent(t *testing.T) {
	for i := 0; i < 50; i++ {
		ctx := newHandlerContext(context.Background(), time.Duration(i%5)*time.Millisecond)
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; j < 20; j++ {
					switch (g + j) % 4 {
					case 0:
						_ = ctx.Err()
					case 1:
						_ = ctx.Done()
					case 2:
						_ = context.Cause(ctx)
					default:
						_ = ctx.Value(ctxKey{})
					}
				}
			}()
		}
		if i%2 == 0 {
			ctx.end()
		}
		wg.Wait()
		ctx.end()
		waitDone(t, ctx, "Done after end")
		if ctx.Err() == nil || context.Cause(ctx) == nil {
			t.Fatalf("after end: Err %v, Cause %v", ctx.Err(), context.Cause(ctx))
		}
		if l := ctx.live.Load(); l != nil && l.ctx.Err() == nil {
			t.Fatal("the timer context outlives the handler")
		}
	}
}

// The deadline costs one allocation per delivery for a handler that never
// waits on its context (it was five: a timer context, its timer, its cause
// and the wrapper asking the parent).
func TestHandlerDeadlineAllocations(t *testing.T) {
	c := &Consumer{cfg: ConsumerConfig{HandlerTimeout: time.Minute}.withDefaults(), log: slog.New(slog.DiscardHandler)}
	h := c.deadline(HandlerFunc(func(ctx context.Context, d *Delivery) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		_, _ = ctx.Deadline()
		return nil
	}))
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := &Delivery{ReceivedAt: time.Now()}
	// AllocsPerRun counts the whole process's allocations: the fewest of
	// three runs, so that goroutines left by other tests do not count.
	allocs := math.Inf(1)
	for range 3 {
		allocs = min(allocs, testing.AllocsPerRun(1000, func() {
			if err := h.Handle(parent, d); err != nil {
				t.Fatal(err)
			}
		}))
	}
	if allocs > 1 {
		t.Fatalf("%.1f allocations per delivery for the handler deadline, want ≤ 1", allocs)
	}
}

// The handler deadline around a handler that does not wait on its
// context, with 4 goroutines per core sharing the parent (as a consumer's do).
func BenchmarkHandlerDeadline(b *testing.B) {
	c := &Consumer{cfg: ConsumerConfig{}.withDefaults(), log: slog.New(slog.DiscardHandler)}
	h := c.deadline(HandlerFunc(func(ctx context.Context, d *Delivery) error { return ctx.Err() }))
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.ReportAllocs()
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		d := &Delivery{ReceivedAt: time.Now()}
		for pb.Next() {
			if err := h.Handle(parent, d); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// A handler that fails before its deadline fails with its own error, not
// a timeout: the failure policy dead-letters a poison message instead of
// requeueing it as cut at the consumer timeout. (The lazy context first
// read its Err after ending it, and every failure became a timeout.)
func TestHandlerFailureIsNotATimeout(t *testing.T) {
	errPlain := errors.New("plain failure")
	for _, cfg := range []ConsumerConfig{
		{},                          // the ConsumerTimeout bound only (the default)
		{HandlerTimeout: time.Hour}, // a HandlerTimeout of its own
	} {
		c := &Consumer{cfg: cfg.withDefaults(), log: slog.New(slog.DiscardHandler)}
		h := c.deadline(HandlerFunc(func(ctx context.Context, d *Delivery) error { return errPlain }))
		rec := &Counters{}
		err := h.Handle(WithRecorder(context.Background(), rec), &Delivery{ReceivedAt: time.Now()})
		var hte *HandlerTimeoutError
		if err != errPlain || errors.As(err, &hte) || errors.Is(err, ErrHandlerTimeout) {
			t.Fatalf("HandlerTimeout %v: a failed handler returned %v, want its own error unchanged", cfg.HandlerTimeout, err)
		}
		if n := rec.Get(CountHandlerTimeouts); n != 0 {
			t.Fatalf("HandlerTimeout %v: %d handler timeouts counted for a plain failure", cfg.HandlerTimeout, n)
		}
	}
}
