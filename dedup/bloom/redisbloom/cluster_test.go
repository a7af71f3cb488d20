package redisbloom_test

import (
	"testing"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/bloom"
	"github.com/idemq/idemq/dedup/bloom/redisbloom"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/dedup/storetest"
	"github.com/idemq/idemq/internal/testenv"
)

// The tiered store on a Redis Cluster of three primaries, with the exact
// Redis store as its record of truth on the same cluster.
func TestTieredStoreConformanceOnCluster(t *testing.T) {
	rc := testenv.StartRedisCluster(t, 3)
	storetest.Run(t, storetest.Suite{
		Features: storetest.Features{Batch: true, Parallel: true,
			NotModelled: "a Complete marks the record of truth done before it checks the lease"},
		New: func(t *testing.T) dedup.Store {
			c := rc.Client()
			prefix := testenv.Name(t, "c")
			truth, err := redisstore.New(c, redisstore.Config{KeyPrefix: prefix + ":truth:"})
			if err != nil {
				t.Fatal(err)
			}
			s, err := redisbloom.NewStore(c, redisbloom.StoreConfig{Filter: tieredFilter(prefix), Verifier: bloom.RecordOfTruth(truth)})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	})
}
