package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/bloom"
	"github.com/idemq/idemq/dedup/bloom/redisbloom"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/internal/redistest"
)

// benchFilter sizes every Bloom filter of these cases: a one-hour window
// (the guard's) of a million IDs at 1e-4. A run fills a tiny part of it, so
// a false positive (a suspect: rejected, and the case fails) is as good as
// impossible.
func benchFilter() bloom.FilterConfig {
	return bloom.FilterConfig{Window: time.Hour, Generations: 4, ExpectedIDs: 1_000_000, FPRate: 1e-4}
}

// dropKeys deletes the case's Redis keys (the filter's bitmaps are the
// size of a generation) when it ends.
func dropKeys(b testing.TB, c redis.UniversalClient, match string) {
	b.Cleanup(func() {
		ctx := context.Background()
		iter := c.Scan(ctx, 0, match, 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if len(keys) > 0 {
			_ = c.Unlink(ctx, keys...).Err()
		}
	})
}

// BenchmarkBloom: the tiered store (exact leases + Bloom filter of done
// IDs) against the exact Redis store (BenchmarkDedup/idemq-dedup-redis,
// same workers, same run; issue target: not slower).
func BenchmarkBloom(b *testing.B) {
	for _, auto := range []bool{false, true} {
		suffix := ""
		if auto {
			suffix = "-autopipeline"
		}
		// The exact store first, in the same benchmark, so that the
		// comparison is between neighbours of one run.
		consumeCase(b, "exact-redis"+suffix, 0, func(b *testing.B, r *run) {
			guardConsume(b, r, consumerOpts{Workers: DedupWorkers}, redistest.Store(b, redisClient(b), redisstore.Config{AutoPipeline: auto}))
		})
		// Lease, recent done marker and filter bits in one hash slot, one
		// script per operation.
		consumeCase(b, "redisbloom-store"+suffix, 0, func(b *testing.B, r *run) {
			c := redisClient(b)
			prefix := fmt.Sprintf("idemq:bench:bloom:%d", time.Now().UnixNano())
			dropKeys(b, c, "*"+prefix+"*")
			st, err := redisbloom.NewStore(c, redisbloom.StoreConfig{
				Filter: redisbloom.Config{Filter: benchFilter(), Prefix: prefix}, AutoPipeline: auto, Logger: quiet(),
			})
			if err != nil {
				b.Fatal(err)
			}
			guardConsume(b, r, consumerOpts{Workers: DedupWorkers}, st)
		})
		// The generic tiered store: redisstore leases, the filter in Redis
		// bitmaps (separate round trips).
		consumeCase(b, "tiered-redis-leases-redis-filter"+suffix, 0, func(b *testing.B, r *run) {
			c := redisClient(b)
			prefix := fmt.Sprintf("idemq:bench:bloom:%d", time.Now().UnixNano())
			dropKeys(b, c, "*"+prefix+"*")
			f, err := redisbloom.New(c, redisbloom.Config{Filter: benchFilter(), Prefix: prefix})
			if err != nil {
				b.Fatal(err)
			}
			guardConsume(b, r, consumerOpts{Workers: DedupWorkers}, tiered(b, redistest.Store(b, c, redisstore.Config{AutoPipeline: auto}), f))
		})
		// The generic tiered store with the filter in process.
		consumeCase(b, "tiered-redis-leases-local-filter"+suffix, 0, func(b *testing.B, r *run) {
			f, err := bloom.NewLocal(benchFilter())
			if err != nil {
				b.Fatal(err)
			}
			guardConsume(b, r, consumerOpts{Workers: DedupWorkers}, tiered(b, redistest.Store(b, redisClient(b), redisstore.Config{AutoPipeline: auto}), f))
		})
	}
}

func tiered(b *testing.B, leases dedup.Store, f bloom.Filter) dedup.Store {
	st, err := bloom.NewStore(bloom.StoreConfig{Leases: leases, Filter: f, Logger: quiet()})
	if err != nil {
		b.Fatal(err)
	}
	return st
}
