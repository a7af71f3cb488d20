package e2etest

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/internal/redistest"
	"github.com/idemq/idemq/internal/testenv"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

const wait = 45 * time.Second

// storeKind builds a fresh store for a test.
type storeKind struct {
	name string
	new  func(t *testing.T) dedup.Store
}

var storeKinds = []storeKind{
	{"memory", func(t *testing.T) dedup.Store { return dedup.NewMemory(dedup.MemoryConfig{}) }},
	{"redis", func(t *testing.T) dedup.Store {
		c, prefix := testenv.Redis(t)
		return redistest.Store(t, c, redisstore.Config{KeyPrefix: prefix + ":"})
	}},
}

// newConsumer is idemq.NewConsumer with h as the pipeline's handler.
func newConsumer(cfg idemq.ConsumerConfig, h idemq.Handler) (*idemq.Consumer, error) {
	cfg.Pipeline.Handler = h
	return idemq.NewConsumer(cfg)
}

// mustGuard is dedup.NewGuard over store; it panics on a bad config.
func mustGuard(store dedup.Store, cfg dedup.Config) *dedup.Guard {
	cfg.Store = store
	g, err := dedup.NewGuard(cfg)
	if err != nil {
		panic(err)
	}
	return g
}

// runConsumer starts a consumer, waits until it consumes and stops it at
// cleanup (or when stop is called).
func runConsumer(t *testing.T, cfg idemq.ConsumerConfig, h idemq.Handler) (*idemq.Consumer, func()) {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	c, err := newConsumer(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Run(ctx); close(done) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(60 * time.Second):
				t.Error("consumer did not stop within 60s")
			}
		})
	}
	t.Cleanup(stop)
	select {
	case <-c.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("consumer not ready within 30s")
	}
	return c, stop
}

func publishIDs(t *testing.T, queue string, ids ...string) {
	t.Helper()
	msgs := make([]amqp.Publishing, len(ids))
	for i, id := range ids {
		msgs[i] = amqp.Publishing{MessageId: id, Body: []byte("body of " + id)}
	}
	testenv.Publish(t, "", queue, msgs...)
}

// tracker counts handler runs per message ID.
type tracker struct {
	mu   sync.Mutex
	seen map[string]int
}

func newTracker() *tracker { return &tracker{seen: map[string]int{}} }

func (tr *tracker) add(id string) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.seen[id]++
	return tr.seen[id]
}

func (tr *tracker) snapshot() map[string]int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	out := make(map[string]int, len(tr.seen))
	for k, v := range tr.seen {
		out[k] = v
	}
	return out
}

func (tr *tracker) total() int {
	n := 0
	for _, v := range tr.snapshot() {
		n += v
	}
	return n
}

// selfDeadLetteringQueue declares a queue whose rejected messages are
// dead-lettered back into itself (the default exchange, its own name).
func selfDeadLetteringQueue(t *testing.T) string {
	t.Helper()
	name := testenv.Name(t, "q")
	ch := testenv.Channel(t)
	args := amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": name}
	if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
		t.Fatalf("declare %s: %v", name, err)
	}
	t.Cleanup(func() { testenv.DeleteQueue(name) })
	return name
}

var errTransient = errors.New("transient failure (test)")
