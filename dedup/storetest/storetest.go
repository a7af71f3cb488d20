// Package storetest is the conformance suite every dedup store runs. A store
// is done when it passes the suite — nothing more and nothing less:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, storetest.Suite{
//			New:      func(t *testing.T) dedup.Store { return newIsolatedStore(t) },
//			Broken:   func(t *testing.T) dedup.Store { return storeAgainstADeadBackend(t) },
//			Features: storetest.Features{Batch: true, Parallel: true},
//		})
//	}
//
// The suite uses real time with short leases (a few hundred milliseconds) and
// waits on conditions with deadlines, so it works for stores whose clock is
// the backend's (Redis PX, SQL now()). It is self-contained: it needs only
// the store (no broker). With [Features.Parallel] the cases that do not
// measure time run in parallel.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
)

// Suite describes the store under test.
type Suite struct {
	// New returns a fresh store whose keys no other test sees (its own key
	// prefix, database or table). Required.
	New func(t *testing.T) dedup.Store
	// Broken returns a store whose backend is unreachable or closed; every
	// operation must fail with an error, never answer Done. Optional only
	// for stores that cannot fail (memory).
	Broken func(t *testing.T) dedup.Store
	// NewClocked, when set, returns a fresh store whose clock is now (the
	// memory store: MemoryConfig.Now). The model case then also runs long
	// sequences on a clock the test drives. Optional.
	NewClocked func(t *testing.T, now func() time.Time) dedup.Store
	// Features says what the store has; the suite checks exactly that.
	Features Features
	// Lease is the short lease the expiry cases use. Default 300ms; raise it
	// for backends with a coarse clock (e.g. 1s for SQL stores that keep
	// second precision).
	Lease time.Duration
}

// Features describes the store under test, as Watermill's pub/sub suite
// describes a Pub/Sub.
type Features struct {
	// Batch: the store implements dedup.BatchStore, and the batch cases
	// check it. Without it they are skipped, saying so.
	Batch bool
	// Parallel: the cases that do not measure time run in parallel
	// (t.Parallel); New must then hand out isolated stores that may be
	// used at the same time.
	Parallel bool
	// NotModelled, when set, says why the randomized model case
	// (RandomInterleavingsMatchTheModel) does not hold for this store: the
	// case is skipped with that reason, every other case runs. Only for a
	// store whose documented contract is looser than the model's.
	NotModelled string
}

// Run runs every conformance case as a subtest.
func Run(t *testing.T, s Suite) {
	if s.New == nil {
		t.Fatal("storetest: Suite.New is required")
	}
	if s.Lease <= 0 {
		s.Lease = 300 * time.Millisecond
	}
	cases := []struct {
		name   string
		fn     func(*testing.T, Suite)
		timing bool // measures time: never in parallel
		batch  bool // needs Features.Batch
	}{
		{name: "ClaimAbsentAcquires", fn: claimAbsent},
		{name: "FiftyGoroutinesOneAcquires", fn: fiftyGoroutines},
		{name: "ManyKeysConcurrently", fn: manyKeys},
		{name: "ReleaseThenReclaim", fn: releaseThenReclaim},
		{name: "WrongTokenRefused", fn: wrongToken},
		{name: "CompleteThenDone", fn: completeThenDone},
		{name: "LeaseExpiryLetsAnotherClaim", fn: leaseExpiry, timing: true},
		{name: "DoneExpiresAfterWindow", fn: doneExpires, timing: true},
		{name: "ExtendKeepsLeaseAlive", fn: extendKeepsAlive, timing: true},
		{name: "CompleteAfterLostLeaseIsReported", fn: completeAfterLostLease, timing: true},
		{name: "CancelledContextIsAnError", fn: cancelledContext},
		{name: "InvalidKeyRejected", fn: invalidKey},
		{name: "StoreErrorsSurfaceAsErrors", fn: storeErrors},
		{name: "BatchAnswersAsSingleCalls", fn: batchAnswers, batch: true},
		{name: "BatchConcurrentOneAcquires", fn: batchConcurrent, batch: true},
		{name: "BatchOnBrokenStoreFails", fn: batchBroken, batch: true},
		{name: "MixedBatchAnswersAsSingleCalls", fn: mixedBatchAnswers, batch: true},
		{name: "ConcurrentHistoryIsLinearizable", fn: func(t *testing.T, s Suite) {
			if s.Features.NotModelled != "" {
				t.Skip("not modelled: " + s.Features.NotModelled)
			}
			linearizable(t, s)
		}},
		{name: "ConcurrentHistoryWithEndingLeasesIsLinearizable", fn: func(t *testing.T, s Suite) {
			if s.Features.NotModelled != "" {
				t.Skip("not modelled: " + s.Features.NotModelled)
			}
			leasesEnd(t, s)
		}},
		{name: "RandomInterleavingsMatchTheModel", timing: true, fn: func(t *testing.T, s Suite) {
			if s.Features.NotModelled != "" {
				t.Skip("not modelled: " + s.Features.NotModelled)
			}
			modelRandom(t, s)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.batch && !s.Features.Batch {
				t.Skip("Features.Batch is not set: the store has no batch calls")
			}
			if s.Features.Parallel && !c.timing {
				t.Parallel()
			}
			c.fn(t, s)
		})
	}
}

const long = time.Minute

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func key(t *testing.T, n string) string { return "conf:" + t.Name() + ":" + n }

func mustClaim(t *testing.T, s dedup.Store, k, token string, lease time.Duration, want dedup.ClaimResult) dedup.Claim {
	t.Helper()
	c, err := s.Claim(ctx(t), k, token, lease)
	if err != nil {
		t.Fatalf("Claim(%q, %q): %v", k, token, err)
	}
	if c.Result != want {
		t.Fatalf("Claim(%q, %q) = %v, want %v", k, token, c.Result, want)
	}
	return c
}

// eventually polls cond until it holds or 10s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func claimAbsent(t *testing.T, s Suite) {
	st := s.New(t)
	k := key(t, "a")
	mustClaim(t, st, k, "t1", long, dedup.Acquired)
	c := mustClaim(t, st, k, "t2", long, dedup.InFlight)
	if c.LeaseLeft < 0 || c.LeaseLeft > long {
		t.Fatalf("LeaseLeft = %v, want within [0, %v]", c.LeaseLeft, long)
	}
	// The owner claiming again (a retry of the same call) is still the owner.
	mustClaim(t, st, k, "t1", long, dedup.Acquired)
	// Another key is independent.
	mustClaim(t, st, key(t, "b"), "t2", long, dedup.Acquired)
}

func fiftyGoroutines(t *testing.T, s Suite) {
	st := s.New(t)
	k := key(t, "hot")
	var wg sync.WaitGroup
	results := make([]dedup.ClaimResult, 50)
	errs := make([]error, 50)
	start := make(chan struct{})
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			c, err := st.Claim(ctx(t), k, fmt.Sprintf("tok-%d", i), long)
			results[i], errs[i] = c.Result, err
		}()
	}
	close(start)
	wg.Wait()
	acquired := 0
	for i, r := range results {
		if errs[i] != nil {
			t.Fatalf("claim %d: %v", i, errs[i])
		}
		switch r {
		case dedup.Acquired:
			acquired++
		case dedup.InFlight:
		default:
			t.Fatalf("claim %d = %v, want acquired or in-flight", i, r)
		}
	}
	if acquired != 1 {
		t.Fatalf("%d goroutines acquired the lease, want exactly 1", acquired)
	}
}

func manyKeys(t *testing.T, s Suite) {
	st := s.New(t)
	const keys, racers = 200, 4
	var mu sync.Mutex
	won := map[string]int{}
	var wg sync.WaitGroup
	for r := 0; r < racers; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < keys; i++ {
				k := key(t, fmt.Sprint(i))
				c, err := st.Claim(ctx(t), k, fmt.Sprintf("r%d", r), long)
				if err != nil {
					t.Errorf("claim: %v", err)
					return
				}
				if c.Result == dedup.Acquired {
					mu.Lock()
					won[k]++
					mu.Unlock()
					if err := st.Complete(ctx(t), k, fmt.Sprintf("r%d", r), long); err != nil {
						t.Errorf("complete: %v", err)
					}
				}
			}
		}()
	}
	wg.Wait()
	if len(won) != keys {
		t.Fatalf("%d keys acquired, want %d", len(won), keys)
	}
	for k, n := range won {
		if n != 1 {
			t.Fatalf("%s acquired %d times", k, n)
		}
	}
}

func releaseThenReclaim(t *testing.T, s Suite) {
	st := s.New(t)
	k := key(t, "r")
	mustClaim(t, st, k, "t1", long, dedup.Acquired)
	if err := st.Release(ctx(t), k, "t1"); err != nil {
		t.Fatalf("Release: %v", err)
	}
	mustClaim(t, st, k, "t2", long, dedup.Acquired)
	// Releasing twice, or a record someone else now holds, is a lost lease.
	if err := st.Release(ctx(t), k, "t1"); !errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("second Release by old owner: %v, want ErrLeaseLost", err)
	}
	mustClaim(t, st, k, "t3", long, dedup.InFlight)
}

func wrongToken(t *testing.T, s Suite) {
	st := s.New(t)
	k := key(t, "w")
	mustClaim(t, st, k, "owner", long, dedup.Acquired)
	if err := st.Release(ctx(t), k, "intruder"); !errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("Release by wrong token: %v, want ErrLeaseLost", err)
	}
	if err := st.Complete(ctx(t), k, "intruder", long); !errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("Complete by wrong token: %v, want ErrLeaseLost", err)
	}
	if err := st.Extend(ctx(t), k, "intruder", long); !errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("Extend by wrong token: %v, want ErrLeaseLost", err)
	}
	// The owner's lease is untouched by all of that.
	mustClaim(t, st, k, "third", long, dedup.InFlight)
	if err := st.Complete(ctx(t), k, "owner", long); err != nil {
		t.Fatalf("Complete by owner: %v", err)
	}
	mustClaim(t, st, k, "third", long, dedup.Done)
}

func completeThenDone(t *testing.T, s Suite) {
	st := s.New(t)
	k := key(t, "c")
	mustClaim(t, st, k, "t1", long, dedup.Acquired)
	if err := st.Complete(ctx(t), k, "t1", long); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	mustClaim(t, st, k, "t2", long, dedup.Done)
	mustClaim(t, st, k, "t1", long, dedup.Done)
	if err := st.Release(ctx(t), k, "t1"); !errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("Release after Complete: %v, want ErrLeaseLost (done must stay done)", err)
	}
	mustClaim(t, st, k, "t2", long, dedup.Done)
}

func leaseExpiry(t *testing.T, s Suite) {
	st := s.New(t)
	k := key(t, "e")
	mustClaim(t, st, k, "dead-owner", s.Lease, dedup.Acquired)
	eventually(t, "the lease to expire and another token to acquire", func() bool {
		c, err := st.Claim(ctx(t), k, "heir", long)
		if err != nil {
			t.Fatalf("Claim: %v", err)
		}
		return c.Result == dedup.Acquired
	})
	if err := st.Extend(ctx(t), k, "dead-owner", long); !errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("Extend by expired owner: %v, want ErrLeaseLost", err)
	}
	if err := st.Release(ctx(t), k, "dead-owner"); !errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("Release by expired owner: %v, want ErrLeaseLost", err)
	}
	mustClaim(t, st, k, "third", long, dedup.InFlight)
}

func doneExpires(t *testing.T, s Suite) {
	st := s.New(t)
	// Done must hold for the whole window. The window here is short (the
	// suite's lease), so on a loaded machine the Complete and the Claim
	// after it can take longer than the window itself: such a round says
	// nothing and is run again on a fresh key; a round that fits in the
	// window must see done.
	var k string
	for round := 0; ; round++ {
		k = key(t, fmt.Sprintf("d%d", round))
		mustClaim(t, st, k, "t1", long, dedup.Acquired)
		start := time.Now()
		if err := st.Complete(ctx(t), k, "t1", s.Lease); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		c, err := st.Claim(ctx(t), k, "t2", long)
		if err != nil {
			t.Fatalf("Claim: %v", err)
		}
		if took := time.Since(start); took >= s.Lease {
			if round >= 20 {
				t.Fatalf("Complete+Claim took %v, longer than the %v window, 20 times in a row", took, s.Lease)
			}
			t.Logf("round %d: Complete+Claim took %v >= window %v; trying again", round, took, s.Lease)
			continue
		}
		if c.Result != dedup.Done {
			t.Fatalf("Claim(%q, t2) within the window = %v, want done", k, c.Result)
		}
		break
	}
	eventually(t, "done to be forgotten after its window", func() bool {
		c, err := st.Claim(ctx(t), k, "t3", long)
		if err != nil {
			t.Fatalf("Claim: %v", err)
		}
		if c.Result == dedup.InFlight {
			t.Fatalf("Claim after window = in-flight, want done or acquired")
		}
		return c.Result == dedup.Acquired
	})
}

func extendKeepsAlive(t *testing.T, s Suite) {
	st := s.New(t)
	// A lease long enough that a loaded machine (2 cores, -race, other
	// packages' tests) rarely misses a heartbeat window by accident:
	// renewed every fifth of it, it has four fifths of slack. When it does
	// miss (a gap between two successful Extends, or between the last one
	// and a Claim, as long as the lease), the round proves nothing and is
	// run again on a fresh key; a claim that wins inside a live lease fails.
	lease := 4 * s.Lease
	if lease < time.Second {
		lease = time.Second
	}
	for round := 0; ; round++ {
		k := key(t, fmt.Sprintf("x%d", round))
		mustClaim(t, st, k, "owner", lease, dedup.Acquired)
		renewed := time.Now() // the lease runs at least until renewed+lease
		until := renewed.Add(5 * lease / 2)
		missed := false
		for time.Now().Before(until) && !missed {
			time.Sleep(lease / 5)
			sent := time.Now()
			err := st.Extend(ctx(t), k, "owner", lease)
			if errors.Is(err, dedup.ErrLeaseLost) && time.Since(renewed) >= lease {
				missed = true
				break
			}
			if err != nil {
				t.Fatalf("Extend: %v", err)
			}
			renewed = sent
			c, err := st.Claim(ctx(t), k, "other", long)
			if err != nil {
				t.Fatalf("Claim: %v", err)
			}
			switch {
			case c.Result == dedup.InFlight:
			case time.Since(renewed) >= lease:
				missed = true
			default:
				t.Fatalf("Claim(%q, other) %v after a successful Extend = %v, want in-flight", k, time.Since(renewed), c.Result)
			}
		}
		if missed {
			if round >= 10 {
				t.Fatalf("the machine missed the heartbeat window 10 times in a row (lease %v)", lease)
			}
			t.Logf("round %d: a step took longer than the %v lease; trying again", round, lease)
			continue
		}
		// Past 2.5 first-lease lengths the lease is alive only thanks to Extend.
		if err := st.Complete(ctx(t), k, "owner", long); err != nil {
			t.Fatalf("Complete after extends: %v", err)
		}
		mustClaim(t, st, k, "other", long, dedup.Done)
		return
	}
}

func completeAfterLostLease(t *testing.T, s Suite) {
	st := s.New(t)
	k := key(t, "l")
	mustClaim(t, st, k, "slow", s.Lease, dedup.Acquired)
	// Wait for expiry without claiming (claiming would take the lease).
	time.Sleep(s.Lease + s.Lease/2)
	err := st.Complete(ctx(t), k, "slow", long)
	if !errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("Complete after the lease expired: %v, want ErrLeaseLost (never hidden)", err)
	}
	// The effect was applied; the record remembers it.
	mustClaim(t, st, k, "next", long, dedup.Done)

	// And when someone else took the lease meanwhile, their lease stands.
	k2 := key(t, "l2")
	mustClaim(t, st, k2, "slow", s.Lease, dedup.Acquired)
	eventually(t, "another token to take the expired lease", func() bool {
		c, err := st.Claim(ctx(t), k2, "fast", long)
		return err == nil && c.Result == dedup.Acquired
	})
	if err := st.Complete(ctx(t), k2, "slow", long); !errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("Complete by the old owner: %v, want ErrLeaseLost", err)
	}
	mustClaim(t, st, k2, "third", long, dedup.InFlight)
}

func cancelledContext(t *testing.T, s Suite) {
	st := s.New(t)
	c, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := st.Claim(c, key(t, "k"), "t", long)
	if err == nil {
		t.Fatalf("Claim with a cancelled context = %v, nil error; want an error", res.Result)
	}
}

func invalidKey(t *testing.T, s Suite) {
	st := s.New(t)
	if _, err := st.Claim(ctx(t), "", "t", long); !errors.Is(err, dedup.ErrInvalidKey) {
		t.Fatalf("Claim of an empty key: %v, want ErrInvalidKey", err)
	}
}

func storeErrors(t *testing.T, s Suite) {
	if s.Broken == nil {
		t.Skip("this store has no failure mode to test (no Suite.Broken)")
	}
	st := s.Broken(t)
	k := key(t, "k")
	c, err := st.Claim(ctx(t), k, "t", long)
	if err == nil {
		t.Fatalf("Claim on a broken store = %v with no error; it must fail", c.Result)
	}
	var se *dedup.StoreError
	if !errors.As(err, &se) {
		t.Fatalf("Claim error %v is not a *dedup.StoreError", err)
	}
	if err := st.Complete(ctx(t), k, "t", long); err == nil || errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("Complete on a broken store: %v, want a store error", err)
	}
	if err := st.Release(ctx(t), k, "t"); err == nil || errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("Release on a broken store: %v, want a store error", err)
	}
	if err := st.Extend(ctx(t), k, "t", long); err == nil || errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("Extend on a broken store: %v, want a store error", err)
	}
}

// batchStore returns st as a dedup.BatchStore: Features.Batch says it is
// one.
func batchStore(t *testing.T, st dedup.Store) dedup.BatchStore {
	t.Helper()
	bs, ok := st.(dedup.BatchStore)
	if !ok {
		t.Fatalf("Features.Batch is set but %T does not implement dedup.BatchStore", st)
	}
	return bs
}

// batchAnswers: every request of a batch gets the answer the single call
// would give, whatever state its key is in, and in order.
func batchAnswers(t *testing.T, s Suite) {
	st := s.New(t)
	bs := batchStore(t, st)
	kNew, kMine, kOther, kDone := key(t, "new"), key(t, "mine"), key(t, "other"), key(t, "done")
	mustClaim(t, st, kMine, "me", long, dedup.Acquired)
	mustClaim(t, st, kOther, "them", long, dedup.Acquired)
	mustClaim(t, st, kDone, "x", long, dedup.Acquired)
	if err := st.Complete(ctx(t), kDone, "x", long); err != nil {
		t.Fatal(err)
	}
	reqs := []dedup.ClaimRequest{
		{Key: kNew, Token: "me", Lease: long},
		{Key: kMine, Token: "me", Lease: long},
		{Key: kOther, Token: "me", Lease: long},
		{Key: kDone, Token: "me", Lease: long},
		{Key: "", Token: "me", Lease: long},
	}
	want := []dedup.ClaimResult{dedup.Acquired, dedup.Acquired, dedup.InFlight, dedup.Done, 0}
	got := bs.ClaimBatch(ctx(t), reqs)
	if len(got) != len(reqs) {
		t.Fatalf("ClaimBatch answered %d of %d requests", len(got), len(reqs))
	}
	for i, r := range got {
		if want[i] == 0 {
			if !errors.Is(r.Err, dedup.ErrInvalidKey) {
				t.Errorf("request %d (empty key): %+v, want ErrInvalidKey", i, r)
			}
			continue
		}
		if r.Err != nil || r.Claim.Result != want[i] {
			t.Errorf("request %d (%s): %+v, want %v", i, reqs[i].Key, r, want[i])
		}
	}
	if got[2].Claim.LeaseLeft < 0 || got[2].Claim.LeaseLeft > long {
		t.Errorf("in-flight LeaseLeft = %v, want within [0, %v]", got[2].Claim.LeaseLeft, long)
	}
	// The new key is now ours: another token is refused.
	mustClaim(t, st, kNew, "them", long, dedup.InFlight)

	errs := bs.CompleteBatch(ctx(t), []dedup.CompleteRequest{
		{Key: kNew, Token: "me", Window: long},
		{Key: kOther, Token: "me", Window: long}, // not ours: their lease stands
		{Key: kMine, Token: "me", Window: long},
		{Key: "", Token: "me", Window: long},
	})
	if len(errs) != 4 {
		t.Fatalf("CompleteBatch answered %d of 4 requests", len(errs))
	}
	if errs[0] != nil || errs[2] != nil {
		t.Errorf("CompleteBatch of our own leases: %v, %v", errs[0], errs[2])
	}
	if !errors.Is(errs[1], dedup.ErrLeaseLost) {
		t.Errorf("CompleteBatch of another token's lease: %v, want ErrLeaseLost", errs[1])
	}
	if !errors.Is(errs[3], dedup.ErrInvalidKey) {
		t.Errorf("CompleteBatch of an empty key: %v, want ErrInvalidKey", errs[3])
	}
	mustClaim(t, st, kNew, "later", long, dedup.Done)
	mustClaim(t, st, kMine, "later", long, dedup.Done)
	mustClaim(t, st, kOther, "later", long, dedup.InFlight)
}

// batchConcurrent: batches racing on the same keys still let exactly one
// token acquire each key.
func batchConcurrent(t *testing.T, s Suite) {
	st := s.New(t)
	bs := batchStore(t, st)
	const keys, racers = 20, 8
	var mu sync.Mutex
	winners := map[string]int{}
	var wg sync.WaitGroup
	for r := 0; r < racers; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reqs := make([]dedup.ClaimRequest, keys)
			for i := range reqs {
				reqs[i] = dedup.ClaimRequest{Key: key(t, fmt.Sprint(i)), Token: fmt.Sprintf("r%d", r), Lease: long}
			}
			for i, rep := range bs.ClaimBatch(ctx(t), reqs) {
				if rep.Err != nil {
					t.Errorf("racer %d key %d: %v", r, i, rep.Err)
					continue
				}
				if rep.Claim.Result == dedup.Acquired {
					mu.Lock()
					winners[reqs[i].Key]++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if len(winners) != keys {
		t.Fatalf("%d of %d keys acquired", len(winners), keys)
	}
	for k, n := range winners {
		if n != 1 {
			t.Errorf("%s acquired by %d racers, want 1", k, n)
		}
	}
}

// batchBroken: a batch against an unreachable backend fails every request
// (never an answer, above all never Done).
func batchBroken(t *testing.T, s Suite) {
	if s.Broken == nil {
		return
	}
	bs := batchStore(t, s.Broken(t))
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, r := range bs.ClaimBatch(c, []dedup.ClaimRequest{{Key: key(t, "a"), Token: "t", Lease: long}, {Key: key(t, "b"), Token: "t", Lease: long}}) {
		if r.Err == nil {
			t.Errorf("ClaimBatch request %d on a broken store answered %v", i, r.Claim.Result)
		}
	}
	for i, err := range bs.CompleteBatch(c, []dedup.CompleteRequest{{Key: key(t, "a"), Token: "t", Window: long}}) {
		if err == nil || errors.Is(err, dedup.ErrLeaseLost) {
			t.Errorf("CompleteBatch request %d on a broken store: %v, want a store error", i, err)
		}
	}
}

// mixedBatchAnswers: a store with dedup.MixedBatchStore answers claims and
// completes of one Batch call as the single calls would (claims first).
func mixedBatchAnswers(t *testing.T, s Suite) {
	st := s.New(t)
	ms, ok := st.(dedup.MixedBatchStore)
	if !ok {
		t.Skipf("%T has no mixed batches", st)
	}
	kNew, kMine, kOther, kDone, kFree := key(t, "new"), key(t, "mine"), key(t, "other"), key(t, "done"), key(t, "free")
	mustClaim(t, st, kMine, "me", long, dedup.Acquired)
	mustClaim(t, st, kOther, "them", long, dedup.Acquired)
	mustClaim(t, st, kDone, "x", long, dedup.Acquired)
	if err := st.Complete(ctx(t), kDone, "x", long); err != nil {
		t.Fatal(err)
	}
	claims := []dedup.ClaimRequest{
		{Key: kNew, Token: "me", Lease: long},
		{Key: kOther, Token: "me", Lease: long},
		{Key: kDone, Token: "me", Lease: long},
		{Key: "", Token: "me", Lease: long},
	}
	completes := []dedup.CompleteRequest{
		{Key: kMine, Token: "me", Window: long},
		{Key: kOther, Token: "me", Window: long}, // not ours: their lease stands
		{Key: kNew, Token: "me", Window: long},   // claimed in the same batch, before
		{Key: kFree, Token: "me", Window: long},  // absent: marked done, not ours
		{Key: "", Token: "me", Window: long},
	}
	reps, errs := ms.Batch(ctx(t), claims, completes)
	if len(reps) != len(claims) || len(errs) != len(completes) {
		t.Fatalf("Batch answered %d of %d claims, %d of %d completes", len(reps), len(claims), len(errs), len(completes))
	}
	want := []dedup.ClaimResult{dedup.Acquired, dedup.InFlight, dedup.Done}
	for i, w := range want {
		if reps[i].Err != nil || reps[i].Claim.Result != w {
			t.Errorf("claim %d (%s): %+v, want %v", i, claims[i].Key, reps[i], w)
		}
	}
	if !errors.Is(reps[3].Err, dedup.ErrInvalidKey) {
		t.Errorf("claim of an empty key: %+v, want ErrInvalidKey", reps[3])
	}
	if errs[0] != nil || errs[2] != nil {
		t.Errorf("completes of our own leases: %v, %v", errs[0], errs[2])
	}
	if !errors.Is(errs[1], dedup.ErrLeaseLost) || !errors.Is(errs[3], dedup.ErrLeaseLost) {
		t.Errorf("completes of another token's lease, of an absent record: %v, %v, want ErrLeaseLost", errs[1], errs[3])
	}
	if !errors.Is(errs[4], dedup.ErrInvalidKey) {
		t.Errorf("complete of an empty key: %v, want ErrInvalidKey", errs[4])
	}
	mustClaim(t, st, kNew, "later", long, dedup.Done)
	mustClaim(t, st, kMine, "later", long, dedup.Done)
	mustClaim(t, st, kFree, "later", long, dedup.Done)
	mustClaim(t, st, kOther, "later", long, dedup.InFlight)
}
