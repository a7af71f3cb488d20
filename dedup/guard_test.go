package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// guardMW builds a guard over store and returns it as a middleware that
// does with its outcome what the consumer does: counts a processed or a
// duplicate delivery into the context's recorder, and acks (nil) a
// duplicate.
func guardMW(store dedup.Store, cfg dedup.Config) idemq.Middleware {
	cfg.Store = store
	g, err := dedup.NewGuard(cfg)
	if err != nil {
		panic(err)
	}
	return func(next idemq.Handler) idemq.Handler {
		inner := g.Wrap(next)
		return idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
			err := inner.Handle(ctx, d)
			switch {
			case err == nil:
				idemq.RecorderFrom(ctx).Add(idemq.CountProcessed, 1)
			case idemq.IsDuplicate(err):
				idemq.RecorderFrom(ctx).Add(idemq.CountDuplicates, 1)
				return nil
			}
			return err
		})
	}
}

// harness runs one guarded handler against a memory store, with counters.
type harness struct {
	store    *dedup.Memory
	counters *idemq.Counters
	ctx      context.Context
	runs     int
}

func newHarness() *harness {
	h := &harness{store: dedup.NewMemory(dedup.MemoryConfig{}), counters: &idemq.Counters{}}
	h.ctx = idemq.WithRecorder(context.Background(), h.counters)
	return h
}

func (h *harness) handler(cfg dedup.Config, fn func(ctx context.Context, d *idemq.Delivery) error) idemq.Handler {
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	return idemq.Chain(idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
		h.runs++
		if fn == nil {
			return nil
		}
		return fn(ctx, d)
	}), idemq.Recover(), guardMW(h.store, cfg))
}

func delivery(id string) *idemq.Delivery {
	return &idemq.Delivery{MessageID: id, Queue: "q", Group: "g"}
}

func (h *harness) record(t *testing.T, id string) (dedup.Record, bool) {
	t.Helper()
	rec, ok, err := h.store.Get(context.Background(), dedup.Key("idemq", "g", id))
	if err != nil {
		t.Fatal(err)
	}
	return rec, ok
}

func TestGuardSuccessCompletesAndSuppressesDuplicates(t *testing.T) {
	h := newHarness()
	g := h.handler(dedup.Config{}, nil)
	for i := 0; i < 3; i++ {
		if err := g.Handle(h.ctx, delivery("m1")); err != nil {
			t.Fatalf("delivery %d: %v", i, err)
		}
	}
	if h.runs != 1 {
		t.Fatalf("handler ran %d times, want 1", h.runs)
	}
	if rec, ok := h.record(t, "m1"); !ok || rec.State != dedup.StateDone {
		t.Fatalf("record %+v %v, want done", rec, ok)
	}
	if p, d := h.counters.Get(idemq.CountProcessed), h.counters.Get(idemq.CountDuplicates); p != 1 || d != 2 {
		t.Fatalf("processed %d duplicates %d, want 1 and 2", p, d)
	}
	// Another consumer group processes the same message once too.
	d := delivery("m1")
	d.Group = "other"
	if err := g.Handle(h.ctx, d); err != nil || h.runs != 2 {
		t.Fatalf("other group: err %v runs %d", err, h.runs)
	}
}

func TestGuardFailureReleasesAndReturnsTheError(t *testing.T) {
	h := newHarness()
	boom := errors.New("boom")
	fail := true
	g := h.handler(dedup.Config{}, func(context.Context, *idemq.Delivery) error {
		if fail {
			return boom
		}
		return nil
	})
	if err := g.Handle(h.ctx, delivery("m1")); err != boom {
		t.Fatalf("err = %v, want the handler's error unchanged", err)
	}
	if _, ok := h.record(t, "m1"); ok {
		t.Fatal("a record remains after a failed handler: the redelivery would be lost")
	}
	fail = false
	if err := g.Handle(h.ctx, delivery("m1")); err != nil || h.runs != 2 {
		t.Fatalf("redelivery: err %v runs %d, want processed", err, h.runs)
	}
	if h.counters.Get(idemq.CountProcessed) != 1 {
		t.Fatalf("processed = %d", h.counters.Get(idemq.CountProcessed))
	}
}

func TestGuardPanicReleases(t *testing.T) {
	h := newHarness()
	g := h.handler(dedup.Config{}, func(context.Context, *idemq.Delivery) error { panic("oops") })
	var pe *idemq.PanicError
	if err := g.Handle(h.ctx, delivery("m1")); !errors.As(err, &pe) {
		t.Fatalf("err = %v, want a PanicError", err)
	}
	if _, ok := h.record(t, "m1"); ok {
		t.Fatal("a record remains after a panic")
	}
}

func TestGuardInFlightIsRequeuedNeverAcked(t *testing.T) {
	h := newHarness()
	key := dedup.Key("idemq", "g", "m1")
	if _, err := h.store.Claim(context.Background(), key, "someone-else", time.Minute); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		cfg  dedup.Config
		min  time.Duration
		max  time.Duration
	}{
		{"lease left", dedup.Config{}, 50 * time.Second, time.Minute},
		{"configured", dedup.Config{InFlightRetryAfter: 200 * time.Millisecond}, 200 * time.Millisecond, 200 * time.Millisecond},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := h.handler(c.cfg, nil).Handle(h.ctx, delivery("m1"))
			var re *idemq.RequeueError
			if !errors.As(err, &re) || re.Reason != dedup.RequeueInFlight || !errors.Is(err, dedup.ErrInFlight) {
				t.Fatalf("err = %v, want an in-flight RequeueError", err)
			}
			if re.After < c.min || re.After > c.max {
				t.Fatalf("After = %v, want within [%v, %v]", re.After, c.min, c.max)
			}
		})
	}
	if h.runs != 0 {
		t.Fatalf("handler ran %d times", h.runs)
	}
	if n := h.counters.Get(idemq.CountInFlight); n != 2 {
		t.Fatalf("in-flight deferrals = %d, want 2", n)
	}
}

func TestGuardStoreUnavailable(t *testing.T) {
	for _, failOpen := range []bool{false, true} {
		t.Run(map[bool]string{false: "fail-closed", true: "fail-open"}[failOpen], func(t *testing.T) {
			h := newHarness()
			_ = h.store.Close()
			err := h.handler(dedup.Config{FailOpen: failOpen, StoreRetryAfter: 3 * time.Second}, nil).Handle(h.ctx, delivery("m1"))
			if h.counters.Get(idemq.CountStoreErrors) != 1 {
				t.Fatalf("store errors = %d", h.counters.Get(idemq.CountStoreErrors))
			}
			if failOpen {
				if err != nil || h.runs != 1 || h.counters.Get(idemq.CountFailOpen) != 1 {
					t.Fatalf("fail-open: err %v runs %d fail_open %d", err, h.runs, h.counters.Get(idemq.CountFailOpen))
				}
				return
			}
			var re *idemq.RequeueError
			var se *dedup.StoreError
			if !errors.As(err, &re) || re.After != 3*time.Second || re.Reason != dedup.RequeueStoreUnavailable || !errors.As(err, &se) {
				t.Fatalf("err = %v, want a store-unavailable RequeueError after 3s", err)
			}
			if h.runs != 0 {
				t.Fatal("fail-closed ran the handler")
			}
		})
	}
}

func TestGuardRejectsMissingAndInvalidIDs(t *testing.T) {
	h := newHarness()
	g := h.handler(dedup.Config{}, nil)
	for id, reason := range map[string]string{"": idemq.ReasonMissingID, "a\tb": idemq.ReasonInvalidID} {
		err := g.Handle(h.ctx, delivery(id))
		if reasonOf(err) != reason || !idemq.IsPermanent(err) {
			t.Fatalf("ID %q: err %v, want a rejection %s", id, err, reason)
		}
	}
	if h.runs != 0 {
		t.Fatal("handler ran without a valid ID")
	}
}

// The heartbeat keeps the lease alive while a handler runs far past it.
func TestGuardHeartbeatExtendsTheLease(t *testing.T) {
	h := newHarness()
	// Renewals every 100ms; a renewal may come up to 380ms late (a busy
	// machine, -race) before the guard gives the lease up.
	const lease = 600 * time.Millisecond
	key := dedup.Key("idemq", "g", "slow")
	g := h.handler(dedup.Config{Lease: lease, Heartbeat: 100 * time.Millisecond}, func(ctx context.Context, d *idemq.Delivery) error {
		start := time.Now()
		for time.Since(start) < 3*lease {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("the handler's context ended: %w", context.Cause(ctx))
			}
			c, err := h.store.Claim(context.Background(), key, "intruder", time.Minute)
			if err != nil || c.Result != dedup.InFlight {
				return errors.New("the lease was not kept alive: " + c.Result.String())
			}
			time.Sleep(lease / 10) // the handler's "work"
		}
		return nil
	})
	if err := g.Handle(h.ctx, delivery("slow")); err != nil {
		t.Fatal(err)
	}
	if h.counters.Get(idemq.CountLeasesLost) != 0 {
		t.Fatal("lease lost")
	}
	if rec, ok := h.record(t, "slow"); !ok || rec.State != dedup.StateDone {
		t.Fatalf("record %+v %v, want done", rec, ok)
	}
}

// A lease found lost at Complete (the handler returned nil, unaware) is
// counted and logged, and the delivery is given back, never acked as if
// all went well: its redelivery is deferred while the other owner holds
// the record, and acked as a duplicate once it completed.
func TestGuardLeaseLostAtCompleteIsGivenBack(t *testing.T) {
	h := newHarness()
	key := dedup.Key("idemq", "g", "m1")
	g := h.handler(dedup.Config{InFlightRetryAfter: 50 * time.Millisecond}, func(ctx context.Context, d *idemq.Delivery) error {
		if h.runs > 1 {
			return errors.New("ran again")
		}
		// An operator forgets the record and another consumer claims it.
		_ = h.store.Forget(context.Background(), key)
		_, err := h.store.Claim(context.Background(), key, "thief", time.Minute)
		return err
	})
	err := g.Handle(h.ctx, delivery("m1"))
	var rq *idemq.RequeueError
	if !errors.As(err, &rq) || rq.Reason != dedup.RequeueLeaseLost || !rq.InPlace || rq.After != 50*time.Millisecond ||
		!errors.Is(err, idemq.ErrLeaseLost) || !errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("err = %v, want an in-place %s requeue after 50ms", err, dedup.RequeueLeaseLost)
	}
	if n := h.counters.Get(idemq.CountLeasesLost); n != 1 {
		t.Fatalf("leases lost = %d, want 1", n)
	}
	if rec, ok := h.record(t, "m1"); !ok || rec.Owner != "thief" {
		t.Fatalf("record %+v ok=%v, want the thief's lease untouched", rec, ok)
	}
	// The redelivery while the thief holds it: deferred, not run.
	if err := g.Handle(h.ctx, delivery("m1")); !errors.As(err, &rq) || rq.Reason != dedup.RequeueInFlight {
		t.Fatalf("redelivery while held: %v, want an in-flight requeue", err)
	}
	if err := h.store.Complete(context.Background(), key, "thief", time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := g.Handle(h.ctx, delivery("m1")); err != nil || h.runs != 1 || h.counters.Get(idemq.CountDuplicates) != 1 {
		t.Fatalf("redelivery once done: err %v runs %d duplicates %d, want nil, 1 and 1", err, h.runs, h.counters.Get(idemq.CountDuplicates))
	}
}

// Complete happens even when the handler's context ended meanwhile.
func TestGuardCompletesAfterTheHandlerContextEnds(t *testing.T) {
	h := newHarness()
	ctx, cancel := context.WithCancel(h.ctx)
	g := h.handler(dedup.Config{}, func(context.Context, *idemq.Delivery) error { cancel(); return nil })
	if err := g.Handle(ctx, delivery("m1")); err != nil {
		t.Fatal(err)
	}
	if rec, ok := h.record(t, "m1"); !ok || rec.State != dedup.StateDone {
		t.Fatalf("record %+v %v, want done", rec, ok)
	}
}

func TestGuardKeyNamespacing(t *testing.T) {
	h := newHarness()
	g := h.handler(dedup.Config{Prefix: "svc"}, func(ctx context.Context, d *idemq.Delivery) error {
		if id, _ := d.ID(); id != "o-1" {
			t.Errorf("d.ID() = %q, want o-1", id)
		}
		return nil
	})
	d := &idemq.Delivery{Queue: "orders", Body: []byte(`{"order":"o-1"}`)} // no Group: the queue is the group
	idemq.IDConfig{Extractor: idemq.FromJSONField("order")}.Apply(d)       // what the consumer does
	if err := g.Handle(h.ctx, d); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := h.store.Get(context.Background(), "svc:orders:o-1"); !ok {
		t.Fatal(`no record at "svc:orders:o-1"`)
	}
}

// uncertainStore answers every claim "cannot tell" (what a Bloom tier
// without a verifier says on a filter hit).
type uncertainStore struct{ *dedup.Memory }

func (uncertainStore) Claim(context.Context, string, string, time.Duration) (dedup.Claim, error) {
	return dedup.Claim{}, fmt.Errorf("probabilistic tier: %w", dedup.ErrUncertain)
}

// A store that cannot tell done from new makes the guard set the message
// aside with a reason: not run (it may be a duplicate), not acked (it may
// be new), not a store error, and fail-open changes nothing.
func TestGuardUncertainIsSetAsideNeverRunNorAcked(t *testing.T) {
	for _, failOpen := range []bool{false, true} {
		t.Run(map[bool]string{false: "fail-closed", true: "fail-open"}[failOpen], func(t *testing.T) {
			counters := &idemq.Counters{}
			ctx := idemq.WithRecorder(context.Background(), counters)
			runs := 0
			h := idemq.Chain(idemq.HandlerFunc(func(context.Context, *idemq.Delivery) error { runs++; return nil }),
				guardMW(uncertainStore{dedup.NewMemory(dedup.MemoryConfig{})}, dedup.Config{FailOpen: failOpen, Logger: quiet()}))
			err := h.Handle(ctx, delivery("m1"))
			var rj *idemq.RejectError
			if !errors.As(err, &rj) || rj.Reason != idemq.ReasonSuspectedDuplicate || !errors.Is(err, dedup.ErrUncertain) {
				t.Fatalf("err = %v, want a %s rejection wrapping ErrUncertain", err, idemq.ReasonSuspectedDuplicate)
			}
			if runs != 0 {
				t.Fatal("the handler ran on an uncertain answer")
			}
			if u, se, fo := counters.Get(idemq.CountUncertain), counters.Get(idemq.CountStoreErrors), counters.Get(idemq.CountFailOpen); u != 1 || se != 0 || fo != 0 {
				t.Fatalf("uncertain %d store_errors %d fail_open %d, want 1 0 0", u, se, fo)
			}
		})
	}
}

// batchingMemory is the memory store with the BatchStore methods (a loop of
// single calls), counting the batches, so the guard's grouping can be
// checked without a server.
type batchingMemory struct {
	*dedup.Memory
	mu                      sync.Mutex
	claimBatches, claimReqs int
	completeReqs            int
}

func (m *batchingMemory) ClaimBatch(ctx context.Context, reqs []dedup.ClaimRequest) []dedup.ClaimReply {
	time.Sleep(2 * time.Millisecond) // a round trip, so calls pile up
	out := make([]dedup.ClaimReply, len(reqs))
	for i, r := range reqs {
		out[i].Claim, out[i].Err = m.Claim(ctx, r.Key, r.Token, r.Lease)
	}
	m.mu.Lock()
	m.claimBatches++
	m.claimReqs += len(reqs)
	m.mu.Unlock()
	return out
}

func (m *batchingMemory) CompleteBatch(ctx context.Context, reqs []dedup.CompleteRequest) []error {
	out := make([]error, len(reqs))
	for i, r := range reqs {
		out[i] = m.Complete(ctx, r.Key, r.Token, r.Window)
	}
	m.mu.Lock()
	m.completeReqs += len(reqs)
	m.mu.Unlock()
	return out
}

func TestGuardGroupsConcurrentCallsOfABatchStore(t *testing.T) {
	tests := []struct {
		name     string
		maxBatch int
		grouped  bool
	}{
		{"default groups", 0, true},
		{"MaxBatch 1 does not", 1, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := &batchingMemory{Memory: dedup.NewMemory(dedup.MemoryConfig{})}
			counters := &idemq.Counters{}
			ctx := idemq.WithRecorder(context.Background(), counters)
			var runs sync.Map
			h := idemq.Chain(idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
				if _, loaded := runs.LoadOrStore(d.MessageID, true); loaded {
					t.Errorf("handler ran twice for %s", d.MessageID)
				}
				return nil
			}), guardMW(st, dedup.Config{Logger: quiet(), MaxBatch: tc.maxBatch}))
			const workers, ids = 32, 400
			var wg sync.WaitGroup
			for w := 0; w < workers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					// Every ID twice, from different workers: one run, one
					// suppressed duplicate (or an in-flight requeue when
					// both copies are at the guard at once).
					for i := w; i < 2*ids; i += workers {
						err := h.Handle(ctx, delivery(fmt.Sprint(i%ids)))
						var rq *idemq.RequeueError
						if err != nil && !errors.As(err, &rq) {
							t.Errorf("Handle(%d): %v", i%ids, err)
						}
					}
				}()
			}
			wg.Wait()
			n := 0
			runs.Range(func(any, any) bool { n++; return true })
			if n != ids {
				t.Fatalf("%d distinct IDs ran, want %d", n, ids)
			}
			for i := 0; i < ids; i++ {
				rec, ok, err := st.Get(context.Background(), dedup.Key("idemq", "g", fmt.Sprint(i)))
				if _, ran := runs.Load(fmt.Sprint(i)); ran && (err != nil || !ok || rec.State != dedup.StateDone) {
					t.Fatalf("ID %d ran but its record is %+v (ok=%v, err=%v), want done", i, rec, ok, err)
				}
			}
			st.mu.Lock()
			defer st.mu.Unlock()
			if tc.grouped {
				if st.claimBatches == 0 || st.claimReqs <= st.claimBatches {
					t.Fatalf("%d claims in %d batches: not grouped", st.claimReqs, st.claimBatches)
				}
				if st.completeReqs != n {
					t.Fatalf("%d completes through CompleteBatch, want %d", st.completeReqs, n)
				}
			} else if st.claimBatches != 0 || st.completeReqs != 0 {
				t.Fatalf("MaxBatch 1 still used the batch calls (%d claim batches, %d completes)", st.claimBatches, st.completeReqs)
			}
		})
	}
}

func reasonOf(err error) string {
	var r *idemq.RejectError
	if errors.As(err, &r) {
		return r.Reason
	}
	return ""
}

// The consumer's Workers default follows the guard: enough concurrent
// deliveries for a grouping store's batches (the README's snippet gets the
// fast path), the plain default otherwise, and never what the user set.
func TestConsumerWorkersDefaultFollowsTheGuard(t *testing.T) {
	batching := func() dedup.Store { return &batchingMemory{Memory: dedup.NewMemory(dedup.MemoryConfig{})} }
	plain := func() dedup.Store { return dedup.NewMemory(dedup.MemoryConfig{}) }
	tests := []struct {
		name      string
		store     func() dedup.Store
		maxBatch  int
		workers   int
		prefetch  int
		want      int
		withGuard bool
	}{
		{"no guard", nil, 0, 0, 0, 4, false},
		{"guard, store without batches", plain, 0, 0, 0, 4, true},
		{"guard, batching store", batching, 0, 0, 0, 64, true},
		{"guard, batching store, grouping off", batching, 1, 0, 0, 4, true},
		{"capped by the prefetch window", batching, 0, 0, 50, 50, true},
		{"MaxBatch 32", batching, 32, 0, 0, 16, true},
		{"MaxBatch 2", batching, 2, 0, 0, 4, true},
		{"Workers set wins", batching, 0, 8, 0, 8, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := idemq.Pipeline{Handler: idemq.HandlerFunc(func(context.Context, *idemq.Delivery) error { return nil })}
			if tc.withGuard {
				g, err := dedup.NewGuard(dedup.Config{Store: tc.store(), MaxBatch: tc.maxBatch, Logger: quiet()})
				if err != nil {
					t.Fatal(err)
				}
				p.Guard = g
			}
			c, err := idemq.NewConsumer(idemq.ConsumerConfig{Queue: "q", Pipeline: p, Workers: tc.workers, Prefetch: tc.prefetch, Logger: quiet()})
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Config().Workers; got != tc.want {
				t.Fatalf("Workers = %d, want %d", got, tc.want)
			}
		})
	}
}

// mixedMemory is batchingMemory with dedup.MixedBatchStore: it counts the
// Batch calls that carried claims and completes together.
type mixedMemory struct {
	batchingMemory
	mixedMu           sync.Mutex
	calls, bothKinds  int
	mixedClaimReqs    int
	mixedCompleteReqs int
}

func (m *mixedMemory) Batch(ctx context.Context, claims []dedup.ClaimRequest, completes []dedup.CompleteRequest) ([]dedup.ClaimReply, []error) {
	time.Sleep(2 * time.Millisecond) // a round trip, so calls pile up
	cr := make([]dedup.ClaimReply, len(claims))
	for i, r := range claims {
		cr[i].Claim, cr[i].Err = m.Claim(ctx, r.Key, r.Token, r.Lease)
	}
	er := make([]error, len(completes))
	for i, r := range completes {
		er[i] = m.Complete(ctx, r.Key, r.Token, r.Window)
	}
	m.mixedMu.Lock()
	m.calls++
	if len(claims) > 0 && len(completes) > 0 {
		m.bothKinds++
	}
	m.mixedClaimReqs += len(claims)
	m.mixedCompleteReqs += len(completes)
	m.mixedMu.Unlock()
	return cr, er
}

// With a MixedBatchStore the guard sends claims of new deliveries and
// completes of finished ones in the same batches (one round trip where
// there were two), and every delivery keeps its order: claimed before its
// handler runs, completed after.
func TestGuardSharesRoundTripsBetweenClaimsAndCompletes(t *testing.T) {
	st := &mixedMemory{batchingMemory: batchingMemory{Memory: dedup.NewMemory(dedup.MemoryConfig{})}}
	counters := &idemq.Counters{}
	ctx := idemq.WithRecorder(context.Background(), counters)
	var runs sync.Map
	h := idemq.Chain(idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
		if _, loaded := runs.LoadOrStore(d.MessageID, true); loaded {
			t.Errorf("handler ran twice for %s", d.MessageID)
		}
		// Claimed before the handler runs.
		rec, ok, err := st.Get(ctx, dedup.Key("idemq", "g", d.MessageID))
		if err != nil || !ok || rec.State != dedup.StateProcessing {
			t.Errorf("%s in its handler: record %+v ok=%v err=%v, want processing", d.MessageID, rec, ok, err)
		}
		// Handlers of different lengths, as in a consumer: workers do not
		// move in step, so claims and completes meet in batches.
		var n int
		_, _ = fmt.Sscan(d.MessageID, &n)
		time.Sleep(time.Duration(n%4) * time.Millisecond)
		return nil
	}), guardMW(st, dedup.Config{Logger: quiet()}))
	const workers, ids = 32, 400
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < ids; i += workers {
				if err := h.Handle(ctx, delivery(fmt.Sprint(i))); err != nil {
					t.Errorf("Handle(%d): %v", i, err)
				}
				// Completed once Handle returned (the consumer acks then).
				rec, ok, err := st.Get(ctx, dedup.Key("idemq", "g", fmt.Sprint(i)))
				if err != nil || !ok || rec.State != dedup.StateDone {
					t.Errorf("%d after Handle: record %+v ok=%v err=%v, want done", i, rec, ok, err)
				}
			}
		}()
	}
	wg.Wait()
	st.mixedMu.Lock()
	defer st.mixedMu.Unlock()
	if st.mixedClaimReqs != ids || st.mixedCompleteReqs != ids {
		t.Fatalf("Batch got %d claims and %d completes, want %d each", st.mixedClaimReqs, st.mixedCompleteReqs, ids)
	}
	if st.claimBatches != 0 || st.completeReqs != 0 {
		t.Fatalf("ClaimBatch/CompleteBatch used beside Batch (%d, %d)", st.claimBatches, st.completeReqs)
	}
	if st.bothKinds == 0 || st.calls >= 2*ids {
		t.Fatalf("%d Batch calls, %d with both kinds: claims and completes not sharing round trips", st.calls, st.bothKinds)
	}
}
