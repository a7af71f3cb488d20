package bloom_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/bloom"
	"github.com/idemq/idemq/dedup/storetest"
)

func TestConformanceMemoryLeasesLocalFilterMemoryVerifier(t *testing.T) {
	storetest.Run(t, storetest.Suite{
		New: func(t *testing.T) dedup.Store {
			f, err := bloom.NewLocal(bloom.FilterConfig{Window: time.Hour, ExpectedIDs: 10_000})
			if err != nil {
				t.Fatal(err)
			}
			s, err := bloom.NewStore(bloom.StoreConfig{Leases: dedup.NewMemory(dedup.MemoryConfig{}), Filter: f,
				Verifier: bloom.RecordOfTruth(dedup.NewMemory(dedup.MemoryConfig{}))})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Broken: func(t *testing.T) dedup.Store {
			f, _ := bloom.NewLocal(bloom.FilterConfig{})
			leases, truth := dedup.NewMemory(dedup.MemoryConfig{}), dedup.NewMemory(dedup.MemoryConfig{})
			leases.Close()
			truth.Close()
			s, _ := bloom.NewStore(bloom.StoreConfig{Leases: leases, Filter: f, Verifier: bloom.RecordOfTruth(truth)})
			return s
		},
		Features: storetest.Features{Parallel: true},
	})
}

func TestParamsArithmetic(t *testing.T) {
	for _, p := range []float64{1e-3, 1e-4, 1e-6} {
		pp, err := bloom.FilterConfig{ExpectedIDs: 1_000_000, FPRate: p}.Params()
		if err != nil {
			t.Fatal(err)
		}
		worst := 1.0
		for i := 0; i < pp.Checked; i++ {
			worst *= 1 - bloom.TheoreticalFP(pp.Bits, pp.Hashes, pp.IDsPerGen)
		}
		t.Logf("P=%g: G=%d L=%v p_g=%.3g m=%d bits/gen k=%d bytes/ID=%.3f theoretical worst FP=%.3g",
			p, pp.Generations, pp.GenLength, pp.GenFPRate, pp.Bits, pp.Hashes, pp.BytesPerID(), 1-worst)
		if 1-worst > p*1.0001 {
			t.Fatalf("P=%g: sized filter's worst FP %g exceeds the target", p, 1-worst)
		}
		if p == 1e-4 && pp.BytesPerID() > 4 {
			t.Fatalf("1e-4: %.2f bytes per ID, target ≤ 4", pp.BytesPerID())
		}
		if time.Duration(pp.Generations)*pp.GenLength < pp.Window {
			t.Fatal("G·L < window")
		}
	}
	for _, bad := range []bloom.FilterConfig{{FPRate: 1}, {FPRate: -1}, {Generations: -1}, {Bits: 8}, {Window: -time.Second}} {
		if _, err := bad.Params(); !errors.Is(err, bloom.ErrInvalidConfig) {
			t.Fatalf("%+v: %v, want ErrInvalidConfig", bad, err)
		}
	}
}

// fakeClock is a settable clock safe for concurrent use.
type fakeClock struct{ ns atomic.Int64 }

func newClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Now().UnixNano())
	return c
}
func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// measureFP fills every checked generation with n/G IDs (the worst case:
// the current one full too), then probes fresh IDs.
func measureFP(t *testing.T, n uint64, p float64, probes int) (measured, estimated float64, st bloom.Stats) {
	t.Helper()
	clk := newClock()
	f, err := bloom.NewLocal(bloom.FilterConfig{Window: time.Hour, ExpectedIDs: n, FPRate: p, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	pp := f.Params()
	ctx := context.Background()
	id := 0
	for g := 0; g < pp.Checked; g++ {
		if g > 0 {
			clk.Advance(pp.GenLength)
		}
		for i := uint64(0); i < pp.IDsPerGen; i++ {
			f.Add(ctx, fmt.Sprintf("added-%d", id))
			id++
		}
	}
	for i := 0; i < id; i += 997 {
		if ok, _ := f.Test(ctx, fmt.Sprintf("added-%d", i)); !ok {
			t.Fatalf("false negative for added-%d", i)
		}
	}
	fp := 0
	for i := 0; i < probes; i++ {
		if ok, _ := f.Test(ctx, fmt.Sprintf("fresh-%d", i)); ok {
			fp++
		}
	}
	st, _ = f.Stats(ctx)
	return float64(fp) / float64(probes), st.EstimatedFPRate, st
}

func TestFalsePositiveRateSmall(t *testing.T) {
	for _, p := range []float64{1e-3, 1e-4} {
		measured, est, st := measureFP(t, 200_000, p, 1_000_000)
		t.Logf("P=%g n=200k probes=1M: measured FP %.3g, estimated from fill %.3g, %.2f bytes per ID (%d bytes)",
			p, measured, est, float64(st.Bytes)/200_000, st.Bytes)
		if measured > 2*p || measured < p/2 {
			t.Fatalf("P=%g: measured FP %g not within 2x", p, measured)
		}
		if est > 2*p || est < p/2 {
			t.Fatalf("P=%g: estimated FP %g not within 2x", p, est)
		}
	}
}

func TestFalsePositiveRateBig(t *testing.T) {
	if testing.Short() || os.Getenv("IDEMQ_BLOOM_BIG") != "1" {
		t.Skip("set IDEMQ_BLOOM_BIG=1 (and no -short): 1M IDs per window, 10M probes")
	}
	for _, p := range []float64{1e-3, 1e-4, 1e-6} {
		measured, est, st := measureFP(t, 1_000_000, p, 10_000_000)
		t.Logf("P=%g n=1M probes=10M: measured FP %.3g, estimated %.3g, %.2f bytes per ID", p, measured, est, float64(st.Bytes)/1e6)
		if p >= 1e-4 && (measured > 2*p || measured < p/2) {
			t.Fatalf("P=%g: measured FP %g not within 2x", p, measured)
		}
	}
}

// Every ID stays found for the whole window while concurrent writers add
// and the clock crosses many rotations.
func TestRotationKeepsIDsForTheWindow(t *testing.T) {
	clk := newClock()
	const window = 4 * time.Second
	f, err := bloom.NewLocal(bloom.FilterConfig{Window: window, Generations: 4, ExpectedIDs: 50_000, FPRate: 1e-4, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// at is read before Add and done after it: the ID went in at a time
	// between the two. Remembered-for-the-window checks use at (the
	// earliest), forgotten-after checks use done (the latest).
	type added struct {
		id       string
		at, done int64
	}
	var mu sync.Mutex
	var all []added
	// allowed caps the IDs added so far, so that fast writers cannot fill
	// the filter past its sizing (false positives would then be expected).
	var allowed, count atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				for count.Load() >= allowed.Load() {
					select {
					case <-stop:
						return
					default:
						time.Sleep(50 * time.Microsecond)
					}
				}
				select {
				case <-stop:
					return
				default:
				}
				count.Add(1)
				id := fmt.Sprintf("w%d-%d", w, i)
				at := clk.Now().UnixNano()
				f.Add(ctx, id)
				done := clk.Now().UnixNano()
				mu.Lock()
				all = append(all, added{id, at, done})
				mu.Unlock()
			}
		}()
	}
	checked := 0
	for step := 0; step < 300; step++ { // 300 × 50ms = 15s of fake time, ~15 rotations
		clk.Advance(50 * time.Millisecond)
		allowed.Store(int64(40 * (step + 1)))
		for { // let the writers add some at this time
			mu.Lock()
			n := len(all)
			mu.Unlock()
			if n >= 20*(step+1) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		mu.Lock()
		snap := append([]added(nil), all...)
		mu.Unlock()
		for i := len(snap) - 1; i >= 0 && i >= len(snap)-400; i-- {
			a := snap[i]
			ok, _ := f.Test(ctx, a.id)
			if after := clk.Now().UnixNano(); after-a.at <= int64(window) {
				checked++
				if !ok {
					t.Fatalf("%s added at %v is forgotten after %v, window %v", a.id, time.Unix(0, a.at), time.Duration(after-a.at), window)
				}
			}
		}
		// The oldest ones, a window and a generation later, are gone.
		for _, a := range snap[:min(len(snap), 50)] {
			if clk.Now().UnixNano()-a.done > int64(window+2*time.Second) {
				if ok, _ := f.Test(ctx, a.id); ok {
					t.Fatalf("%s still found %v after it was added", a.id, time.Duration(clk.Now().UnixNano()-a.done))
				}
			}
		}
	}
	close(stop)
	wg.Wait()
	// Sweep: everything added in the last window is found now.
	now := clk.Now().UnixNano()
	for _, a := range all {
		if now-a.at <= int64(window) {
			checked++
			if ok, _ := f.Test(ctx, a.id); !ok {
				t.Fatalf("%s forgotten within the window", a.id)
			}
		}
	}
	if checked < 1000 {
		t.Fatalf("only %d checks", checked)
	}
	t.Logf("%d IDs added, %d window checks", len(all), checked)
}

// Without a verifier a filter hit is never Done unless the lease store
// knows it exactly, and never Acquired: a *SuspectedDuplicateError.
func TestNoVerifierHitIsASuspect(t *testing.T) {
	ctx := context.Background()
	f, _ := bloom.NewLocal(bloom.FilterConfig{Bits: 8, Hashes: 1})
	leases := dedup.NewMemory(dedup.MemoryConfig{})
	s, err := bloom.NewStore(bloom.StoreConfig{Leases: leases, Filter: f, Hold: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// Fill all 8 bits.
	for i := 0; i < 200; i++ {
		f.Add(ctx, fmt.Sprint("fill-", i))
	}
	// A true duplicate within Recent: exact Done from the marker.
	mustClaim := func(k, tok string) (dedup.Claim, error) { return s.Claim(ctx, k, tok, time.Minute) }
	// New key: the filter says maybe, nobody knows it: a suspect.
	_, err = mustClaim("new-key", "t1")
	var sde *bloom.SuspectedDuplicateError
	if !errors.As(err, &sde) || !errors.Is(err, bloom.ErrSuspectedDuplicate) || sde.Key != "new-key" {
		t.Fatalf("Claim of a filter hit without verifier: %v, want *SuspectedDuplicateError", err)
	}
	// The lease was given back: nothing lingers.
	if _, ok, _ := leases.Get(ctx, "new-key"); ok {
		t.Fatal("the suspect's lease was not given back")
	}
	// A completed key is Done exactly while its marker lives (Recent).
	f2, _ := bloom.NewLocal(bloom.FilterConfig{})
	s2, _ := bloom.NewStore(bloom.StoreConfig{Leases: dedup.NewMemory(dedup.MemoryConfig{}), Filter: f2, Hold: 300 * time.Millisecond})
	if c, err := s2.Claim(ctx, "k", "a", time.Minute); err != nil || c.Result != dedup.Acquired {
		t.Fatalf("Claim = %v, %v", c.Result, err)
	}
	if err := s2.Complete(ctx, "k", "a", time.Hour); err != nil {
		t.Fatal(err)
	}
	if c, err := s2.Claim(ctx, "k", "b", time.Minute); err != nil || c.Result != dedup.Done {
		t.Fatalf("duplicate within Recent = %v, %v; want Done", c.Result, err)
	}
	// After the marker: a suspect, never Done, never Acquired.
	testenvEventually(t, func() bool {
		_, err := s2.Claim(ctx, "k", "c", time.Minute)
		return errors.As(err, &sde)
	})
	// With a verifier that knows nothing, the same hit is a counted false positive and is processed.
	s3, _ := bloom.NewStore(bloom.StoreConfig{Leases: dedup.NewMemory(dedup.MemoryConfig{}), Filter: f,
		Verifier: bloom.VerifierFunc(func(context.Context, string) (bool, error) { return false, nil })})
	if c, err := s3.Claim(ctx, "new-key", "t", time.Minute); err != nil || c.Result != dedup.Acquired {
		t.Fatalf("verified false positive = %v, %v; want Acquired", c.Result, err)
	}
}

func testenvEventually(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
