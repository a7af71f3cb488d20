package bench

import (
	"context"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
)

// idMarshaler makes Watermill key on the AMQP message_id (its default
// marshaler ignores it and uses its own _watermill_message_uuid header).
type idMarshaler struct{ wamqp.DefaultMarshaler }

func (m idMarshaler) Unmarshal(d amqp.Delivery) (*message.Message, error) {
	msg, err := m.DefaultMarshaler.Unmarshal(d)
	if err != nil {
		return nil, err
	}
	msg.UUID = d.MessageId
	msg.Metadata.Set("message_id", d.MessageId)
	return msg, nil
}

// redisKeys is a Watermill ExpiringKeyRepository on Redis SET NX PX, the
// usual way teams back the Deduplicator with Redis.
type redisKeys struct {
	c      redis.UniversalClient
	prefix string
	window time.Duration
}

func (r redisKeys) IsDuplicate(ctx context.Context, key string) (bool, error) {
	ok, err := r.c.SetNX(ctx, r.prefix+key, 1, r.window).Result()
	if err != nil {
		return false, err
	}
	return !ok, nil
}

func redisClient(b *testing.B) redis.UniversalClient {
	u := os.Getenv("IDEMQ_REDIS_URL")
	if u == "" {
		u = "redis://127.0.0.1:6379/0"
	}
	opt, err := redis.ParseURL(u)
	if err != nil {
		b.Fatal(err)
	}
	c := redis.NewClient(opt)
	if err := c.Ping(context.Background()).Err(); err != nil {
		b.Fatalf("Redis not reachable (%v): run `make services`", err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

// watermillConsume runs a Watermill router with one handler on queue until
// n messages were handled.
func watermillConsume(b *testing.B, queue string, n, prefetch int, dedup *middleware.Deduplicator) {
	cfg := wamqp.NewDurableQueueConfig(amqpURL())
	cfg.Consume.Qos.PrefetchCount = prefetch
	cfg.Marshaler = idMarshaler{}
	logger := watermill.NopLogger{}
	sub, err := wamqp.NewSubscriber(cfg, logger)
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Close()
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		b.Fatal(err)
	}
	var handled atomic.Int64
	done := make(chan struct{})
	h := router.AddNoPublisherHandler("bench", queue, sub, func(msg *message.Message) error {
		if handled.Add(1) == int64(n) {
			close(done)
		}
		return nil
	})
	if dedup != nil {
		h.AddMiddleware(dedup.Middleware)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = router.Run(ctx) }()
	select {
	case <-done:
	case <-time.After(20 * time.Minute):
		b.Fatal("watermill timed out")
	}
	_ = router.Close()
}

func BenchmarkWatermill(b *testing.B) {
	consumeCase(b, "watermill-defaults-prefetch1", func(b *testing.B, queue string, n int) {
		watermillConsume(b, queue, n, 1, nil)
	})
	consumeCase(b, "watermill-prefetch200", func(b *testing.B, queue string, n int) {
		watermillConsume(b, queue, n, Prefetch, nil)
	})
	consumeCase(b, "watermill-prefetch200-dedup-redis", func(b *testing.B, queue string, n int) {
		c := redisClient(b)
		prefix := "idemq:bench:wm:" + watermill.NewShortUUID() + ":"
		watermillConsume(b, queue, n, Prefetch, &middleware.Deduplicator{
			KeyFactory: func(m *message.Message) (string, error) { return m.Metadata.Get("message_id"), nil },
			Repository: redisKeys{c: c, prefix: prefix, window: time.Hour},
		})
	})
}
