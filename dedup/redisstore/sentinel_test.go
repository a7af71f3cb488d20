package redisstore_test

import (
	"testing"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/dedup/storetest"
	"github.com/idemq/idemq/internal/testenv"
)

// The store passes the conformance suite through go-redis' failover client
// (a primary found through three Sentinels, two replicas), plain and
// autopipelined.
func TestConformanceSentinel(t *testing.T) {
	cl := testenv.StartCluster(t, testenv.ClusterConfig{Redis: true})
	rdb := cl.FailoverClient()
	for _, auto := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "autopipeline"}[auto], func(t *testing.T) {
			storetest.Run(t, storetest.Suite{
				New: func(t *testing.T) dedup.Store {
					return redisstore.New(rdb, redisstore.Config{KeyPrefix: testenv.Name(t, "t") + ":", AutoPipeline: auto})
				},
			})
		})
	}
}
