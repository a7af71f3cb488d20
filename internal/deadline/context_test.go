package deadline

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

type ctxKey struct{}

// newHandlerContext is a handler context as the deadline middleware makes
// it, limit from now.
func newHandlerContext(parent context.Context, limit time.Duration) *Context {
	return New(parent, time.Now().Add(limit), limit)
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
		wait func(t *testing.T, ctx *Context)
	}{
		{"err-polled", func(t *testing.T, ctx *Context) {
			deadline := time.Now().Add(10 * time.Second)
			for ctx.Err() == nil {
				if time.Now().After(deadline) {
					t.Fatal("Err still nil 10s after the deadline")
				}
				time.Sleep(time.Millisecond)
			}
		}},
		{"done", func(t *testing.T, ctx *Context) { waitDone(t, ctx, "Done") }},
		{"child", func(t *testing.T, ctx *Context) {
			child, cancel := context.WithCancel(ctx)
			defer cancel()
			waitDone(t, child, "a child of the handler context")
			if !errors.Is(context.Cause(child), ErrHandlerTimeout) {
				t.Fatalf("child's cause %v, want ErrHandlerTimeout", context.Cause(child))
			}
		}},
		{"cause-first", func(t *testing.T, ctx *Context) {
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
			var hte cause
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
			ctx.End()
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
		ctx.End()
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
		ctx.End()
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
			ctx.End()
		} else {
			waitDone(t, ctx, tc.name)
		}
		first := ctx.Err()
		waitDone(t, parent, "the parent")
		if got := ctx.Err(); !errors.Is(first, tc.want) || got != first || !errors.Is(context.Cause(ctx), tc.wantCause) {
			t.Fatalf("%s: Err %v, then %v after the parent's deadline, Cause %v; want %v throughout, cause %v",
				tc.name, first, got, context.Cause(ctx), tc.want, tc.wantCause)
		}
		ctx.End()
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
		ctx.End()
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
			ctx.End()
		}
		wg.Wait()
		ctx.End()
		waitDone(t, ctx, "Done after end")
		if ctx.Err() == nil || context.Cause(ctx) == nil {
			t.Fatalf("after end: Err %v, Cause %v", ctx.Err(), context.Cause(ctx))
		}
		if l := ctx.live.Load(); l != nil && l.ctx.Err() == nil {
			t.Fatal("the timer context outlives the handler")
		}
	}
}
