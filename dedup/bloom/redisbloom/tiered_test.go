package redisbloom_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/bloom"
	"github.com/idemq/idemq/dedup/bloom/redisbloom"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/dedup/storetest"
	"github.com/idemq/idemq/internal/redistest"
	"github.com/idemq/idemq/internal/testenv"
)

func tieredFilter(prefix string) redisbloom.Config {
	return redisbloom.Config{Filter: bloom.FilterConfig{Window: time.Hour, ExpectedIDs: 10_000}, KeyPrefix: prefix + ":"}
}

// The single-script tiered store with an exact Redis store as its record
// of truth passes the conformance suite, plain and auto-pipelined.
func TestTieredStoreConformance(t *testing.T) {
	for _, auto := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "autopipeline"}[auto], func(t *testing.T) {
			storetest.Run(t, storetest.Suite{
				// The record of truth is marked done before the lease
				// record, in parallel for a batch: a Complete whose lease
				// another owner holds still marks it done (its handler did
				// apply the effect, so done is true, but the model says
				// "unchanged"), and two same-key completes in one batch
				// answer the second "busy". Both seen by the model case.
				Features: storetest.Features{Batch: true, Parallel: true,
					NotModelled: "a Complete marks the record of truth done before it checks the lease"},
				New: func(t *testing.T) dedup.Store {
					c, prefix := testenv.Redis(t)
					truth, err := redisstore.New(c, redisstore.Config{KeyPrefix: prefix + ":truth:"})
					if err != nil {
						t.Fatal(err)
					}
					s, err := redisbloom.NewStore(c, redisbloom.StoreConfig{Filter: tieredFilter(prefix), Verifier: bloom.RecordOfTruth(truth), AutoPipeline: auto})
					if err != nil {
						t.Fatal(err)
					}
					return s
				},
				Broken: func(t *testing.T) dedup.Store {
					c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)), MaxRetries: -1, DialTimeout: time.Second})
					t.Cleanup(func() { c.Close() })
					s, err := redisbloom.NewStore(c, redisbloom.StoreConfig{Filter: tieredFilter("broken"), Verifier: bloom.RecordOfTruth(redistest.Store(t, c, redisstore.Config{}))})
					if err != nil {
						t.Fatal(err)
					}
					return s
				},
			})
		})
	}
}

// Without a verifier: a recent duplicate is answered Done exactly by the
// marker; once the marker is gone the filter's "maybe" is a suspect —
// never Done, never Acquired — and a fresh key is acquired in one script.
func TestTieredStoreWithoutVerifier(t *testing.T) {
	c, prefix := testenv.Redis(t)
	counters := &idemq.Counters{}
	s, err := redisbloom.NewStore(c, redisbloom.StoreConfig{Filter: tieredFilter(prefix), Recent: 300 * time.Millisecond, Recorder: counters})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	claim := func(key, token string) (dedup.Claim, error) { return s.Claim(ctx, key, token, time.Minute) }
	if c, err := claim("k1", "t1"); err != nil || c.Result != dedup.Acquired {
		t.Fatalf("fresh key: %v %v", c, err)
	}
	if c, err := claim("k1", "t2"); err != nil || c.Result != dedup.InFlight || c.LeaseLeft <= 0 {
		t.Fatalf("leased key: %v %v", c, err)
	}
	if err := s.Complete(ctx, "k1", "t1", time.Hour); err != nil {
		t.Fatal(err)
	}
	if c, err := claim("k1", "t3"); err != nil || c.Result != dedup.Done {
		t.Fatalf("recent duplicate: %v %v, want Done from the marker", c, err)
	}
	if ok, err := s.Filter().Test(ctx, "k1"); err != nil || !ok {
		t.Fatalf("the filter does not hold the completed key: %v %v", ok, err)
	}
	rk := s.RecordKey("k1")
	testenv.Eventually(t, 10*time.Second, "the recent marker expires", func() bool { return c.Exists(ctx, rk).Val() == 0 })
	_, err = claim("k1", "t4")
	var sde *bloom.SuspectedDuplicateError
	if !errors.As(err, &sde) || !errors.Is(err, dedup.ErrUncertain) {
		t.Fatalf("old duplicate without verifier: %v, want a suspect wrapping ErrUncertain", err)
	}
	if c.Exists(ctx, rk).Val() != 0 {
		t.Fatal("a suspect claim wrote a lease")
	}
	if h, sus := counters.Get(bloom.CountFilterHits), counters.Get(bloom.CountSuspects); h != 1 || sus != 1 {
		t.Fatalf("hits %d suspects %d, want 1 and 1", h, sus)
	}
	// Release and Extend act on our lease only.
	if _, err := claim("k2", "a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Extend(ctx, "k2", "b", time.Minute); !errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("extend by another token: %v", err)
	}
	if err := s.Release(ctx, "k2", "a"); err != nil {
		t.Fatal(err)
	}
	if c, err := claim("k2", "b"); err != nil || c.Result != dedup.Acquired {
		t.Fatalf("after release: %v %v", c, err)
	}
}

// A false positive (the filter holds every bit) with a verifier that says
// "not done" is claimed and run, once.
func TestTieredStoreVerifiedFalsePositive(t *testing.T) {
	c, prefix := testenv.Redis(t)
	counters := &idemq.Counters{}
	cfg := redisbloom.Config{Filter: bloom.FilterConfig{Window: time.Hour, Bits: 8, Hashes: 1}, KeyPrefix: prefix + ":"}
	truth, err := redisstore.New(c, redisstore.Config{KeyPrefix: prefix + ":truth:"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := redisbloom.NewStore(c, redisbloom.StoreConfig{Filter: cfg, Verifier: bloom.RecordOfTruth(truth), Recent: -1, Recorder: counters})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := 0; i < 40; i++ { // fill the 8 bits
		k := "fill-" + strconv.Itoa(i)
		if _, err := s.Claim(ctx, k, "t", time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, k, "t", time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	cl, err := s.Claim(ctx, "fresh", "t", time.Minute)
	if err != nil || cl.Result != dedup.Acquired {
		t.Fatalf("fresh key behind a full filter: %v %v, want Acquired after verification", cl, err)
	}
	if counters.Get(bloom.CountFalsePositives) == 0 {
		t.Fatal("no false positive counted with a full filter")
	}
	if cl, err := s.Claim(ctx, "fill-3", "u", time.Minute); err != nil || cl.Result != dedup.Done {
		t.Fatalf("true duplicate without marker: %v %v, want Done from the record of truth", cl, err)
	}
}

// barrierMarker is a record of truth whose MarkDone returns only once n
// calls are in progress at the same time (or fails after a deadline).
type barrierMarker struct {
	n       int
	arrived chan struct{}
	open    chan struct{}
}

func newBarrierMarker(n int) *barrierMarker {
	return &barrierMarker{n: n, arrived: make(chan struct{}, n), open: make(chan struct{})}
}

func (m *barrierMarker) Done(context.Context, string) (bool, error) { return false, nil }

func (m *barrierMarker) MarkDone(ctx context.Context, _ string, _ time.Duration) error {
	select {
	case m.arrived <- struct{}{}:
		if len(m.arrived) == m.n {
			close(m.open)
		}
	default: // past the first n: the barrier is open
	}
	select {
	case <-m.open:
		return nil
	case <-time.After(3 * time.Second):
		return errors.New("MarkDone calls were not concurrent")
	case <-ctx.Done():
		return ctx.Err()
	}
}

// A batch of completes marks its keys done in the record of truth side by
// side, not one after another (with a SQL record of truth, one by one would
// hold every complete of the process behind them).
func TestTieredCompleteBatchMarksDoneConcurrently(t *testing.T) {
	c, prefix := testenv.Redis(t)
	const n = 8
	s, err := redisbloom.NewStore(c, redisbloom.StoreConfig{Filter: tieredFilter(prefix), Verifier: newBarrierMarker(n)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	claims := make([]dedup.ClaimRequest, n)
	completes := make([]dedup.CompleteRequest, n)
	for i := range claims {
		key, tok := "k"+strconv.Itoa(i), "t"+strconv.Itoa(i)
		claims[i] = dedup.ClaimRequest{Key: key, Token: tok, Lease: time.Minute}
		completes[i] = dedup.CompleteRequest{Key: key, Token: tok, Window: time.Hour}
	}
	for i, r := range s.ClaimBatch(ctx, claims) {
		if r.Err != nil || r.Claim.Result != dedup.Acquired {
			t.Fatalf("claim %d: %+v", i, r)
		}
	}
	for i, err := range s.CompleteBatch(ctx, completes) {
		if err != nil {
			t.Fatalf("complete %d: %v", i, err)
		}
	}
	for i, r := range s.ClaimBatch(ctx, claims) {
		if r.Err != nil || r.Claim.Result != dedup.Done {
			t.Fatalf("claim %d after complete: %+v", i, r)
		}
	}
}
