package redisbloom_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/dedup/bloom"
	"github.com/idemq/idemq/dedup/bloom/redisbloom"
	"github.com/idemq/idemq/internal/testenv"
)

// fakeClock is a clock the test moves; it starts at the real time so that
// the keys' PEXPIREAT deadlines are in Redis' future.
type fakeClock struct{ ns atomic.Int64 }

func newClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Now().UnixNano())
	return c
}
func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// Step moves the clock d ahead, or to the real time if that is later.
// Redis expires the keys (PEXPIREAT) by the real clock: a fake clock that
// fell behind it (a slow, loaded machine taking more real time per step
// than d) would see a generation's keys expire while its lookups still
// read them — the filter allows a clock skew of Config.Skew, not more.
func (c *fakeClock) Step(d time.Duration) {
	for {
		old := c.ns.Load()
		next := max(old+int64(d), time.Now().UnixNano())
		if c.ns.CompareAndSwap(old, next) {
			return
		}
	}
}

// parallel runs fn(i) for i in [0, n) on w goroutines and returns the
// first error.
func parallel(n, w int, fn func(i int) error) error {
	var next atomic.Int64
	var first atomic.Value
	var wg sync.WaitGroup
	for g := 0; g < w; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || first.Load() != nil {
					return
				}
				if err := fn(i); err != nil {
					first.CompareAndSwap(nil, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err, ok := first.Load().(error); ok {
		return err
	}
	return nil
}

// fill adds IDsPerGen IDs to every checked generation (the worst case: the
// current one full too), moving the clock one generation at a time, and
// returns the IDs added.
func fill(t *testing.T, f bloom.Filter, clk *fakeClock, tag string) []string {
	t.Helper()
	ctx := context.Background()
	p := f.Params()
	var ids []string
	for g := 0; g < p.Checked; g++ {
		if g > 0 {
			clk.Advance(p.GenLength)
		}
		base := len(ids)
		for i := uint64(0); i < p.IDsPerGen; i++ {
			ids = append(ids, fmt.Sprintf("%s-added-%d", tag, base+int(i)))
		}
		gen := ids[base:]
		if err := parallel(len(gen), 16, func(i int) error { return f.Add(ctx, gen[i]) }); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// The Redis filter and the in-process one, filled alike, both find every
// ID added (no false negatives) and both answer "maybe" for fresh IDs at
// the configured rate, within 2×; the fill-based estimate agrees too.
func TestRedisFilterFalsePositiveRateMatchesLocal(t *testing.T) {
	c, prefix := testenv.Redis(t)
	ctx := context.Background()
	const n, p, probes = 20_000, 1e-3, 100_000
	clkR, clkL := newClock(), newClock()
	rf, err := redisbloom.New(c, redisbloom.Config{Filter: bloom.FilterConfig{Window: time.Hour, ExpectedIDs: n, FPRate: p, Now: clkR.Now}, KeyPrefix: prefix + ":"})
	if err != nil {
		t.Fatal(err)
	}
	lf, err := bloom.NewLocal(bloom.FilterConfig{Window: time.Hour, ExpectedIDs: n, FPRate: p, Now: clkL.Now})
	if err != nil {
		t.Fatal(err)
	}
	if rf.Params() != lf.Params() {
		t.Fatalf("sizing differs: redis %+v local %+v", rf.Params(), lf.Params())
	}
	ids := fill(t, rf, clkR, "x")
	if got := fill(t, lf, clkL, "x"); len(got) != len(ids) {
		t.Fatalf("filled %d and %d", len(got), len(ids))
	}
	for name, f := range map[string]bloom.Filter{"redis": rf, "local": lf} {
		var missing atomic.Int64
		if err := parallel(len(ids), 16, func(i int) error {
			ok, err := f.Test(ctx, ids[i])
			if !ok {
				missing.Add(1)
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if m := missing.Load(); m != 0 {
			t.Fatalf("%s: %d of %d added IDs not found", name, m, len(ids))
		}
		var fp atomic.Int64
		if err := parallel(probes, 32, func(i int) error {
			ok, err := f.Test(ctx, fmt.Sprintf("fresh-%d", i))
			if ok {
				fp.Add(1)
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		st, err := f.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		measured := float64(fp.Load()) / probes
		t.Logf("%s: P=%g n=%d probes=%d: measured FP %.3g, estimated from fill %.3g, %d generations, %.2f bitmap bytes per ID",
			name, p, n, probes, measured, st.EstimatedFPRate, len(st.Generations), float64(st.Bytes)/n)
		if measured > 2*p || measured < p/2 {
			t.Fatalf("%s: measured FP %g not within 2× of %g", name, measured, p)
		}
		if st.EstimatedFPRate > 2*p || st.EstimatedFPRate < p/2 {
			t.Fatalf("%s: estimated FP %g not within 2× of %g", name, st.EstimatedFPRate, p)
		}
	}
}

// Several filter instances (as many processes) on one prefix add from
// concurrent writers while the clock crosses many generations: every ID is
// found by every instance for the whole window, and IDs a window and two
// generations old are gone. There is no rotation step to race: the
// generation follows from the clock and old keys expire by themselves.
func TestRedisFilterRotationConcurrentWriters(t *testing.T) {
	c, prefix := testenv.Redis(t)
	ctx := context.Background()
	clk := newClock()
	const window = 4 * time.Second
	cfg := redisbloom.Config{Filter: bloom.FilterConfig{Window: window, Generations: 4, ExpectedIDs: 50_000, FPRate: 1e-4, Now: clk.Now}, KeyPrefix: prefix + ":"}
	var fs []*redisbloom.Filter
	for i := 0; i < 3; i++ {
		f, err := redisbloom.New(c, cfg)
		if err != nil {
			t.Fatal(err)
		}
		fs = append(fs, f)
	}
	// at is read before Add and done after it (see the in-process test).
	type added struct {
		id       string
		at, done int64
	}
	var mu sync.Mutex
	var all []added
	// allowed caps the IDs added so far: the filter stays within its sizing.
	var allowed, count atomic.Int64
	stop := make(chan struct{})
	errc := make(chan error, 6)
	var wg sync.WaitGroup
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f := fs[w%len(fs)]
			for i := 0; ; i++ {
				for count.Load() >= allowed.Load() {
					select {
					case <-stop:
						return
					default:
						time.Sleep(100 * time.Microsecond)
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
				if err := f.Add(ctx, id); err != nil {
					errc <- err
					return
				}
				done := clk.Now().UnixNano()
				mu.Lock()
				all = append(all, added{id, at, done})
				mu.Unlock()
			}
		}()
	}
	var stopOnce sync.Once
	stopWriters := func() { stopOnce.Do(func() { close(stop); wg.Wait() }) }
	defer stopWriters()
	checked := 0
	for step := 0; step < 120; step++ { // 120 × 125ms = 15s of fake time (more on a slow machine): ~15 generations
		clk.Step(125 * time.Millisecond)
		allowed.Store(int64(40 * (step + 1)))
		testenv.Eventually(t, 10*time.Second, "writers add at this time", func() bool {
			select {
			case err := <-errc:
				t.Fatal(err)
			default:
			}
			mu.Lock()
			defer mu.Unlock()
			return len(all) >= 10*(step+1)
		})
		mu.Lock()
		snap := append([]added(nil), all...)
		mu.Unlock()
		for i := len(snap) - 1; i >= 0 && i >= len(snap)-60; i-- {
			a := snap[i]
			f := fs[i%len(fs)]
			ok, err := f.Test(ctx, a.id)
			if err != nil {
				t.Fatal(err)
			}
			if age := clk.Now().UnixNano() - a.at; age <= int64(window) {
				checked++
				if !ok {
					t.Fatalf("%s forgotten after %v, window %v", a.id, time.Duration(age), window)
				}
			}
		}
		for i, a := range snap[:min(len(snap), 20)] {
			if age := clk.Now().UnixNano() - a.done; age > int64(window+2*time.Second) {
				if ok, _ := fs[i%len(fs)].Test(ctx, a.id); ok {
					t.Fatalf("%s still found %v after it was added", a.id, time.Duration(age))
				}
			}
		}
	}
	stopWriters()
	if checked < 1000 {
		t.Fatalf("only %d window checks", checked)
	}
	// Old generations' keys carry an expiry: nothing is kept forever.
	keys, err := c.Keys(ctx, prefix+":*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		// -1: no expiry. -2: gone, it expired since KEYS listed it (the
		// first generations' keys do on a slow run, their expiry is real
		// time).
		if ttl, err := c.PTTL(ctx, k).Result(); err != nil || ttl == -1 {
			t.Fatalf("key %s has TTL %v (%v), want an expiry", k, ttl, err)
		}
	}
	t.Logf("%d IDs added by 6 writers on 3 instances, %d window checks, %d keys live", len(all), checked, len(keys))
}

// A Redis restart with AOF persistence keeps the filter (every ID still
// found, the set-bit counters intact); without persistence it is gone —
// the contrast shows the check can fail, and why production Redis for the
// filter needs persistence (docs/OPERATIONS.md).
func TestRedisFilterRestart(t *testing.T) {
	for _, persist := range []bool{true, false} {
		t.Run(map[bool]string{true: "with-persistence", false: "without-persistence"}[persist], func(t *testing.T) {
			srv := testenv.StartPrivateRedis(t, persist)
			c := srv.Client()
			t.Cleanup(func() { c.Close() })
			ctx := context.Background()
			f, err := redisbloom.New(c, redisbloom.Config{Filter: bloom.FilterConfig{Window: time.Hour, ExpectedIDs: 10_000}})
			if err != nil {
				t.Fatal(err)
			}
			ids := make([]string, 1000)
			for i := range ids {
				ids[i] = fmt.Sprintf("r-%d", i)
			}
			if err := parallel(len(ids), 8, func(i int) error { return f.Add(ctx, ids[i]) }); err != nil {
				t.Fatal(err)
			}
			before, err := f.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			srv.Restart()
			found := 0
			testenv.Eventually(t, 10*time.Second, "redis answers after the restart", func() bool {
				return c.Ping(ctx).Err() == nil
			})
			for _, id := range ids {
				ok, err := f.Test(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				if ok {
					found++
				}
			}
			after, err := f.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("persist=%v: %d of %d IDs found after the restart; set bits %d before, %d after", persist, found, len(ids), setBits(before), setBits(after))
			if persist {
				if found != len(ids) || setBits(after) != setBits(before) {
					t.Fatalf("after a restart with persistence: %d of %d found, set bits %d → %d", found, len(ids), setBits(before), setBits(after))
				}
			} else if found != 0 || setBits(after) != 0 {
				t.Fatalf("after a restart without persistence: %d found, %d set bits; want none", found, setBits(after))
			}
		})
	}
}

func setBits(st bloom.Stats) uint64 {
	var n uint64
	for _, g := range st.Generations {
		n += g.SetBits
	}
	return n
}

// A generation past MaxShardBytes is split into shards, each under its own
// hash tag (so Redis Cluster may place them on different nodes); every
// ID's bits stay in one shard, found by one script.
func TestRedisFilterShards(t *testing.T) {
	c, prefix := testenv.Redis(t)
	ctx := context.Background()
	f, err := redisbloom.New(c, redisbloom.Config{Filter: bloom.FilterConfig{Window: time.Hour, ExpectedIDs: 40_000, FPRate: 1e-3}, KeyPrefix: prefix + ":", MaxShardBytes: 4096})
	if err != nil {
		t.Fatal(err)
	}
	if f.Shards() < 4 {
		t.Fatalf("%d shards, want several (generation of %d bits, shards of 4096 bytes)", f.Shards(), f.Params().Bits)
	}
	tags := map[string]bool{}
	for s := 0; s < f.Shards(); s++ {
		k := f.BitmapKey(s, 0)
		tags[k[strings.Index(k, "{"):strings.Index(k, "}")+1]] = true
	}
	if len(tags) != f.Shards() {
		t.Fatalf("%d distinct hash tags for %d shards", len(tags), f.Shards())
	}
	ids := make([]string, 5000)
	for i := range ids {
		ids[i] = fmt.Sprintf("s-%d", i)
	}
	if err := parallel(len(ids), 16, func(i int) error { return f.Add(ctx, ids[i]) }); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if ok, err := f.Test(ctx, id); err != nil || !ok {
			t.Fatalf("%s not found (%v)", id, err)
		}
	}
	keys, err := c.Keys(ctx, prefix+":*:gen:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != f.Shards() {
		t.Fatalf("%d bitmap keys, want one per shard (%d): IDs spread over every shard", len(keys), f.Shards())
	}
	for _, k := range keys {
		n, err := c.StrLen(ctx, k).Result()
		if err != nil || n > 4096 {
			t.Fatalf("shard %s is %d bytes (%v), want ≤ 4096", k, n, err)
		}
	}
}

// Bytes per remembered ID in Redis, from MEMORY USAGE of the live bitmaps
// and counters of a full window (the bitmaps are allocated at their full
// size by the first Add, so one Add per generation is enough): the issue's
// target is ≤ 4 bytes per ID at 1e-4, against ~150–180 for an exact key.
func TestRedisBytesPerID(t *testing.T) {
	c, prefix := testenv.Redis(t)
	ctx := context.Background()
	const n = 1_000_000
	for _, p := range []float64{1e-3, 1e-4, 1e-6} {
		clk := newClock()
		kp := fmt.Sprintf("%s:%g:", prefix, p)
		f, err := redisbloom.New(c, redisbloom.Config{Filter: bloom.FilterConfig{Window: time.Hour, ExpectedIDs: n, FPRate: p, Now: clk.Now}, KeyPrefix: kp})
		if err != nil {
			t.Fatal(err)
		}
		pp := f.Params()
		for g := 0; g < pp.Checked; g++ {
			if g > 0 {
				clk.Advance(pp.GenLength)
			}
			if err := f.Add(ctx, fmt.Sprintf("g%d", g)); err != nil {
				t.Fatal(err)
			}
		}
		keys, err := c.Keys(ctx, kp+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		var bytes int64
		for _, k := range keys {
			u, err := c.MemoryUsage(ctx, k, 0).Result()
			if err != nil && err != redis.Nil {
				t.Fatal(err)
			}
			bytes += u
		}
		per := float64(bytes) / n
		t.Logf("P=%g: %d keys, %d bytes of Redis memory for a window of %d IDs: %.2f bytes per ID (k=%d, %d bits per generation, %d generations live)",
			p, len(keys), bytes, n, per, pp.Hashes, pp.Bits, pp.Checked)
		if want := 2 * pp.Checked; len(keys) != want {
			t.Fatalf("%d keys, want %d (bitmap and counter per generation)", len(keys), want)
		}
		if p == 1e-4 && per > 4 {
			t.Fatalf("%.2f bytes per ID at 1e-4, target ≤ 4", per)
		}
		if c.Unlink(ctx, keys...).Err() != nil {
			t.Fatal("unlink")
		}
	}
}
