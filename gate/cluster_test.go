package gate_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/internal/redistest"
	"github.com/idemq/idemq/internal/testenv"
)

// The gate with its dedup records on a Redis Cluster of three primaries:
// 300 IDs, each published three times, are forwarded once each; their
// records spread over the shards.
func TestGateOnRedisCluster(t *testing.T) {
	r := newRig(t)
	rc := testenv.StartRedisCluster(t, 3)
	c := rc.Client()
	r.store = redistest.Store(t, c, redisstore.Config{KeyPrefix: r.prefix + ":"})
	g, _ := start(t, r.config())
	const n = 300
	var msgs []amqp.Publishing
	for copy := 0; copy < 3; copy++ {
		for i := 0; i < n; i++ {
			msgs = append(msgs, amqp.Publishing{MessageId: "c-" + strconv.Itoa(i)})
		}
	}
	testenv.Publish(t, "", r.ingress, msgs...)
	testenv.Eventually(t, 60*time.Second, "every copy settled", func() bool {
		s := g.Stats()
		return s.Forwarded+s.Duplicates == 3*n
	})
	got := collect(t, r.out, n, 30*time.Second)
	got = append(got, drain(t, testenv.Channel(t), r.out)...)
	seen := map[string]int{}
	for _, id := range ids(got) {
		seen[id]++
	}
	if len(seen) != n || len(got) != n {
		t.Fatalf("forwarded %d messages, %d distinct IDs; want %d once each", len(got), len(seen), n)
	}
	var mu sync.Mutex
	shards := 0
	err := c.ForEachMaster(t.Context(), func(ctx context.Context, node *redis.Client) error {
		keys, err := node.Keys(ctx, r.prefix+":*").Result()
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if len(keys) > 0 {
			shards++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if shards < 2 {
		t.Fatalf("the records are on %d primaries, want them spread", shards)
	}
}
