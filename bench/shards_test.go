package bench

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/internal/redistest"
	"github.com/idemq/idemq/internal/testenv"
)

// BenchmarkRedisShards runs the consumer with the Redis dedup guard (its
// defaults) on one private Redis and on a private Redis Cluster of three
// primaries (each with a replica), every node with appendonly and
// appendfsync always, so that the only difference is the sharding: the
// cluster client splits each batch of claims or completes per shard (one
// round trip per primary it touches) and the records spread over three
// servers. On a machine with more cores than servers the shards add
// capacity; on this one (2 cores shared with the broker) they cannot, and
// the case prices the cluster's routing. raw-ack-each (a plain amqp091-go
// consumer) is the baseline of the same run. For interleaved figures run
// the process 5 times (-count repeats each case in a row).
func BenchmarkRedisShards(b *testing.B) {
	// The servers start once, outside the timed runs.
	single := testenv.StartPrivateRedis(b, true).Client()
	b.Cleanup(func() { single.Close() })
	cluster := testenv.StartRedisCluster(b, 3).Client()
	consumeCase(b, "raw-ack-each", 0, func(b *testing.B, r *run) { rawConsume(b, r.Queue, r.N, 1) })
	for _, c := range []struct {
		name   string
		client redis.UniversalClient
	}{{"redis-1-primary", single}, {"redis-cluster-3-primaries", cluster}} {
		consumeCase(b, c.name, 0, func(b *testing.B, r *run) {
			guardConsumeBatch(b, r, consumerOpts{}, dedup.Store(redistest.Store(b, c.client, redisstore.Config{})), 0)
		})
	}
}
