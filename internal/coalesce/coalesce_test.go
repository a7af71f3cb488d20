package coalesce

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

type resp struct {
	v   int
	err error
}

func failResp(err error) resp { return resp{err: err} }

func TestEveryCallGetsItsOwnAnswer(t *testing.T) {
	tests := []struct {
		name              string
		callers, maxBatch int
		inFlight          int
	}{
		{"one caller", 1, 0, 0},
		{"many callers, default", 64, 0, 0},
		{"many callers, batches of 3", 64, 3, 0},
		{"many callers, 2 in flight", 64, 8, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var batches, largest atomic.Int64
			var inFlight, maxInFlight atomic.Int64
			b := New(func(ctx context.Context, reqs []int) []resp {
				n := inFlight.Add(1)
				defer inFlight.Add(-1)
				for {
					m := maxInFlight.Load()
					if n <= m || maxInFlight.CompareAndSwap(m, n) {
						break
					}
				}
				if _, ok := ctx.Deadline(); !ok {
					t.Error("batch context has no deadline")
				}
				batches.Add(1)
				for {
					l := largest.Load()
					if int64(len(reqs)) <= l || largest.CompareAndSwap(l, int64(len(reqs))) {
						break
					}
				}
				time.Sleep(time.Millisecond) // a round trip
				out := make([]resp, len(reqs))
				for i, r := range reqs {
					out[i] = resp{v: r * 2}
				}
				return out
			}, failResp, Config{MaxBatch: tc.maxBatch, MaxInFlight: tc.inFlight})
			var wg sync.WaitGroup
			for c := 0; c < tc.callers; c++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 20; i++ {
						req := c*1000 + i
						if got := b.Do(context.Background(), req); got.err != nil || got.v != req*2 {
							t.Errorf("Do(%d) = %+v, want %d", req, got, req*2)
						}
					}
				}()
			}
			wg.Wait()
			maxBatch := tc.maxBatch
			if maxBatch == 0 {
				maxBatch = 128
			}
			if l := largest.Load(); l > int64(maxBatch) {
				t.Errorf("largest batch %d > MaxBatch %d", l, maxBatch)
			}
			wantInFlight := int64(max(tc.inFlight, 1))
			if m := maxInFlight.Load(); m > wantInFlight {
				t.Errorf("%d batches in flight at once, MaxInFlight %d", m, wantInFlight)
			}
			calls := int64(tc.callers * 20)
			if tc.callers > 1 && batches.Load() >= calls {
				t.Errorf("%d batches for %d calls: nothing was coalesced", batches.Load(), calls)
			}
		})
	}
}

func TestPanicAndShortAnswersFail(t *testing.T) {
	tests := []struct {
		name string
		fn   Func[int, resp]
	}{
		{"panic", func(context.Context, []int) []resp { panic("boom") }},
		{"too few", func(context.Context, []int) []resp { return nil }},
		{"too many", func(_ context.Context, reqs []int) []resp { return make([]resp, len(reqs)+1) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := New(tc.fn, failResp, Config{})
			if got := b.Do(context.Background(), 1); got.err == nil {
				t.Fatalf("Do = %+v, want an error", got)
			}
			// The batcher still works afterwards.
			if got := b.Do(context.Background(), 2); got.err == nil {
				t.Fatalf("second Do = %+v, want an error", got)
			}
		})
	}
}

func TestTimeoutBoundsTheBatch(t *testing.T) {
	b := New(func(ctx context.Context, reqs []int) []resp {
		<-ctx.Done()
		out := make([]resp, len(reqs))
		for i := range out {
			out[i] = resp{err: ctx.Err()}
		}
		return out
	}, failResp, Config{Timeout: 20 * time.Millisecond})
	start := time.Now()
	got := b.Do(context.Background(), 1)
	if !errors.Is(got.err, context.DeadlineExceeded) {
		t.Fatalf("Do = %+v, want DeadlineExceeded", got)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("Do took %v", el)
	}
}

type ctxKey struct{}

func TestBatchContextKeepsValuesNotCancellation(t *testing.T) {
	b := New(func(ctx context.Context, reqs []int) []resp {
		out := make([]resp, len(reqs))
		for i := range out {
			if v, _ := ctx.Value(ctxKey{}).(string); v != "rec" {
				out[i].err = errors.New("value lost")
			}
			out[i].err = errors.Join(out[i].err, ctx.Err())
		}
		return out
	}, failResp, Config{})
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "rec"))
	cancel()
	if got := b.Do(ctx, 1); got.err != nil {
		t.Fatalf("Do = %+v, want the value kept and no cancellation", got)
	}
}

// A request still queued behind a running batch when its context ends is
// withdrawn: answered with the context's error, never sent.
func TestQueuedRequestWithdrawnWhenItsContextEnds(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	var sent sync.Map
	b := New(func(ctx context.Context, reqs []int) []resp {
		for _, r := range reqs {
			sent.Store(r, true)
		}
		if reqs[0] == 1 {
			started <- struct{}{}
			<-release
		}
		out := make([]resp, len(reqs))
		for i, r := range reqs {
			out[i].v = r
		}
		return out
	}, failResp, Config{})

	first := make(chan resp, 1)
	go func() { first <- b.Do(context.Background(), 1) }()
	<-started // request 1's batch is running; request 2 must queue

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	got := b.Do(ctx, 2)
	if !errors.Is(got.err, context.DeadlineExceeded) {
		t.Fatalf("queued Do = %+v, want DeadlineExceeded", got)
	}
	close(release)
	if r := <-first; r.err != nil || r.v != 1 {
		t.Fatalf("first Do = %+v", r)
	}
	// The batcher carries on, and the withdrawn request was never sent.
	if r := b.Do(context.Background(), 3); r.err != nil || r.v != 3 {
		t.Fatalf("later Do = %+v", r)
	}
	if _, ok := sent.Load(2); ok {
		t.Fatal("the withdrawn request was sent")
	}
}

// A Func that ignores its context does not hold the calls queued behind
// it: its batch is answered when its Timeout passes and the next batch
// starts without it. (The caller that runs the stuck batch itself waits
// for the Func to return, then gets the timeout.)
func TestBatchThatOverrunsItsTimeoutIsAnswered(t *testing.T) {
	stuck := make(chan struct{})
	started := make(chan struct{}, 1)
	b := New(func(_ context.Context, reqs []int) []resp {
		out := make([]resp, len(reqs))
		for i, r := range reqs {
			if r == 1 {
				started <- struct{}{}
				<-stuck // ignores its context
			}
			out[i].v = r
		}
		return out
	}, failResp, Config{Timeout: 50 * time.Millisecond})

	first := make(chan resp, 1)
	go func() { first <- b.Do(context.Background(), 1) }()
	<-started
	queued := make(chan resp, 1)
	go func() { queued <- b.Do(context.Background(), 2) }()

	select {
	case got := <-queued:
		if got.err != nil || got.v != 2 {
			t.Fatalf("queued Do = %+v, want 2", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call queued behind a stuck batch was not answered")
	}
	if got := b.Do(context.Background(), 3); got.err != nil || got.v != 3 {
		t.Fatalf("later Do = %+v", got)
	}
	close(stuck)
	if got := <-first; !errors.Is(got.err, context.DeadlineExceeded) {
		t.Fatalf("stuck Do = %+v, want DeadlineExceeded", got)
	}
}
