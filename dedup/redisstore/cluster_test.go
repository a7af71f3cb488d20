package redisstore_test

import (
	"testing"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/dedup/storetest"
	"github.com/idemq/idemq/internal/redistest"
	"github.com/idemq/idemq/internal/testenv"
)

// The conformance suite on a Redis Cluster of three primaries (and three
// replicas): the store's keys carry the message ID's hash tag, so each
// record lives on one shard and its scripts run there; batches span
// shards.
func TestConformanceOnCluster(t *testing.T) {
	rc := testenv.StartRedisCluster(t, 3)
	for _, auto := range []bool{false, true} {
		name := "plain"
		if auto {
			name = "autopipeline"
		}
		t.Run(name, func(t *testing.T) {
			storetest.Run(t, storetest.Suite{
				New: func(t *testing.T) dedup.Store {
					return redistest.Store(t, rc.Client(), redisstore.Config{KeyPrefix: testenv.Name(t, "c") + ":", AutoPipeline: auto})
				},
				Features: storetest.Features{Batch: true, Parallel: true},
			})
		})
	}
}
