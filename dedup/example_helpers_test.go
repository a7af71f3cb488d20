package dedup_test

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/topology"
)

// deleteQueues deletes an example's work queue, its retry queues and its
// dead-letter queue.
func deleteQueues(q topology.Queue) {
	names := []string{q.Name, topology.DLQName(q.Name)}
	for _, d := range q.EffectiveDelays() {
		names = append(names, topology.RetryQueueName(q.Name, d))
	}
	testenv.DeleteQueue(names...)
}

// deleteKeys deletes an example's Redis keys.
func deleteKeys(rdb redis.UniversalClient, pattern string) {
	ctx := context.Background()
	iter := rdb.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		rdb.Del(ctx, iter.Val())
	}
}
