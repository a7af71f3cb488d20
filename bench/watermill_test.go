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

// benchRedisDB is the Redis database the benchmarks write to: a full run
// leaves millions of keys until their windows end, and the tests, which
// scan their own database (DB 0) at cleanup, stay clear of them.
const benchRedisDB = 15

func redisClient(b testing.TB) redis.UniversalClient {
	u := os.Getenv("IDEMQ_REDIS_URL")
	if u == "" {
		u = "redis://127.0.0.1:6379/0"
	}
	opt, err := redis.ParseURL(u)
	if err != nil {
		b.Fatal(err)
	}
	opt.DB = benchRedisDB
	c := redis.NewClient(opt)
	if err := c.Ping(context.Background()).Err(); err != nil {
		b.Fatalf("Redis not reachable (%v): run `make services`", err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

// watermillConsume runs a Watermill router with one handler on r.Queue
// until r.N messages went through its handler-level middleware (with the
// Deduplicator, a duplicate never reaches the handler). r.Lat gets, per
// message, the time spent in that middleware outside the handler, as for
// idemq (router and subscriber overhead are not in it).
func watermillConsume(b *testing.B, r *run, prefetch int, dedup *middleware.Deduplicator) {
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
	var seen, handled atomic.Int64
	done := make(chan struct{})
	n := int64(r.N)
	// Watermill handlers run one message at a time per subscription; the
	// spans are per message and kept in the message's context.
	h := router.AddNoPublisherHandler("bench", r.Queue, sub, func(msg *message.Message) error {
		if sp := spanFrom(msg.Context()); sp != nil {
			sp.start = time.Now()
			defer func() { sp.end = time.Now() }()
		}
		handled.Add(1)
		return nil
	})
	h.AddMiddleware(func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			sp := &span{enter: time.Now()}
			msg.SetContext(withSpan(msg.Context(), sp))
			out, err := next(msg)
			if err == nil {
				r.Lat.add(sp.overhead(time.Now()))
				if seen.Add(1) == n {
					close(done)
				}
			}
			return out, err
		}
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
	want := n
	if dedup != nil {
		want = n - int64(r.Dups)
	}
	if got := handled.Load(); got != want {
		b.Fatalf("handler ran %d times, want %d", got, want)
	}
}

func BenchmarkWatermill(b *testing.B) {
	consumeCase(b, "watermill-defaults-prefetch1", 0, func(b *testing.B, r *run) {
		watermillConsume(b, r, 1, nil)
	})
	consumeCase(b, "watermill-prefetch200", 0, func(b *testing.B, r *run) {
		watermillConsume(b, r, Prefetch, nil)
	})
	for _, dups := range []int{0, DupEvery} {
		name := "watermill-prefetch200-dedup-redis"
		if dups > 0 {
			name += "-dup20"
		}
		consumeCase(b, name, dups, func(b *testing.B, r *run) {
			c := redisClient(b)
			prefix := "idemq:bench:wm:" + watermill.NewShortUUID() + ":"
			watermillConsume(b, r, Prefetch, &middleware.Deduplicator{
				KeyFactory: func(m *message.Message) (string, error) { return m.Metadata.Get("message_id"), nil },
				Repository: redisKeys{c: c, prefix: prefix, window: time.Hour},
			})
		})
	}
}
