package bloom_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/bloom"
	"github.com/idemq/idemq/dedup/bloom/redisbloom"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/retry"
)

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// tinyFilter is a filter so small that almost every fresh ID is a false
// positive once a few IDs were added: the suspect path is forced, not
// waited for by chance.
func tinyFilter(t *testing.T, kind string) bloom.Filter {
	t.Helper()
	cfg := bloom.FilterConfig{Window: time.Hour, Bits: 16, Hashes: 1}
	switch kind {
	case "local":
		f, err := bloom.NewLocal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return f
	case "redis":
		c, prefix := testenv.Redis(t)
		f, err := redisbloom.New(c, redisbloom.Config{Filter: cfg, KeyPrefix: prefix + ":"})
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	t.Fatalf("unknown filter kind %q", kind)
	return nil
}

// runs counts handler runs per message ID.
type runs struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *runs) handler() idemq.Handler {
	return idemq.HandlerFunc(func(_ context.Context, d *idemq.Delivery) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.n[d.MessageID]++
		return nil
	})
}

func (r *runs) snapshot() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.n))
	for k, v := range r.n {
		out[k] = v
	}
	return out
}

func publishIDs(t *testing.T, queue string, ids []string) {
	t.Helper()
	msgs := make([]amqp.Publishing, len(ids))
	for i, id := range ids {
		msgs[i] = amqp.Publishing{MessageId: id, Body: []byte(id), DeliveryMode: amqp.Persistent}
	}
	testenv.Publish(t, "", queue, msgs...)
}

func declare(t *testing.T, names ...string) {
	t.Helper()
	ch := testenv.Channel(t)
	for _, n := range names {
		if _, err := ch.QueueDeclare(n, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { testenv.DeleteQueue(names...) })
}

// consume runs a consumer until cleanup.
func consume(t *testing.T, cfg idemq.ConsumerConfig, h idemq.Handler) *idemq.Counters {
	t.Helper()
	cfg.Logger = quietLog()
	cfg.Pipeline.Handler = h
	c, err := idemq.NewConsumer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			t.Error("consumer did not stop within 60s")
		}
	})
	return c.Counters()
}

func guard(t *testing.T, store dedup.Store, cfg dedup.Config) *dedup.Guard {
	t.Helper()
	cfg.Store, cfg.Logger = store, quietLog()
	g, err := dedup.NewGuard(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func router(t *testing.T, cfg bloom.RouterConfig) *bloom.Router {
	t.Helper()
	r, err := bloom.NewRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func retryPolicy(t *testing.T, cfg retry.Config) *retry.Policy {
	t.Helper()
	p, err := retry.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newPublisher(t *testing.T) *idemq.Publisher {
	t.Helper()
	p, err := idemq.NewPublisher(idemq.PublisherConfig{URL: testenv.RequireAMQP(t), Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

const e2eWait = 45 * time.Second

// Through RabbitMQ, with a filter that answers "maybe" for nearly every
// new ID and no verifier: every message is either processed exactly once
// or copied to the suspected-duplicate queue with its reason — none is
// acked unprocessed, none runs twice.
func TestSuspectRouterEndToEndNoSilentAck(t *testing.T) {
	testenv.RequireAMQP(t)
	for _, kind := range []string{"local", "redis"} {
		t.Run(kind, func(t *testing.T) {
			queue := testenv.Queue(t, nil)
			suspects := queue + ".suspected"
			declare(t, suspects)
			store, err := bloom.NewStore(bloom.StoreConfig{Leases: dedup.NewMemory(dedup.MemoryConfig{}), Filter: tinyFilter(t, kind),
				Recent: time.Second, Hold: time.Second, Logger: quietLog()})
			if err != nil {
				t.Fatal(err)
			}
			const n = 150
			all := ids("sr", n)
			publishIDs(t, queue, all)
			r := &runs{n: map[string]int{}}
			cnt := consume(t, idemq.ConsumerConfig{URL: testenv.RequireAMQP(t), Queue: queue, Workers: 4, Prefetch: 50,
				Pipeline: idemq.Pipeline{Policy: router(t, bloom.RouterConfig{Sender: newPublisher(t)}), Guard: guard(t, store, dedup.Config{})},
			}, r.handler())
			testenv.Eventually(t, e2eWait, "every message acked", func() bool { return cnt.Get(idemq.CountAcked) == n })

			got := map[string]int{}
			for id, k := range r.snapshot() {
				if k != 1 {
					t.Errorf("%s ran %d times", id, k)
				}
				got[id] += k
			}
			ran := len(got)
			sus := testenv.Drain(t, suspects)
			for _, d := range sus {
				got[d.MessageId]++
				if d.Headers[idemq.HeaderReason] != bloom.ReasonSuspectedDuplicate || d.Headers[idemq.HeaderOriginalQueue] != queue ||
					d.Headers[idemq.HeaderDedupKey] != dedup.Key("idemq", queue, d.MessageId) || string(d.Body) != d.MessageId {
					t.Errorf("suspect %s: headers %v body %q", d.MessageId, d.Headers, d.Body)
				}
			}
			for _, id := range all {
				if got[id] != 1 {
					t.Errorf("%s: ran or set aside %d times, want exactly once", id, got[id])
				}
			}
			if len(sus) == 0 || ran == 0 {
				t.Fatalf("%d ran, %d suspected: the tiny filter did not force both paths", ran, len(sus))
			}
			if c := cnt.Get(bloom.CountSuspectedRouted); c != int64(len(sus)) {
				t.Errorf("suspected_duplicates counter %d, %d in the queue", c, len(sus))
			}
			if u, se := cnt.Get(idemq.CountUncertain), cnt.Get(idemq.CountStoreErrors); u != int64(len(sus)) || se != 0 {
				t.Errorf("uncertain %d store_errors %d, want %d and 0", u, se, len(sus))
			}
			if ready, _ := testenv.QueueCounts(t, queue); ready != 0 {
				t.Errorf("%d messages left in the work queue", ready)
			}
			t.Logf("%s filter: %d processed, %d set aside as suspected duplicates", kind, ran, len(sus))
		})
	}
}

// Without a router, the failure policy dead-letters a suspect with the
// reason header: still never acked unprocessed.
func TestSuspectWithoutRouterIsDeadLetteredWithReason(t *testing.T) {
	testenv.RequireAMQP(t)
	queue := testenv.Queue(t, nil)
	dlq := queue + ".dlq"
	declare(t, dlq)
	store, err := bloom.NewStore(bloom.StoreConfig{Leases: dedup.NewMemory(dedup.MemoryConfig{}), Filter: tinyFilter(t, "local"), Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	const n = 60
	publishIDs(t, queue, ids("dl", n))
	r := &runs{n: map[string]int{}}
	cnt := consume(t, idemq.ConsumerConfig{URL: testenv.RequireAMQP(t), Queue: queue, Workers: 2, Prefetch: 20,
		Pipeline: idemq.Pipeline{Policy: retryPolicy(t, retry.Config{Sender: newPublisher(t)}), Guard: guard(t, store, dedup.Config{})},
	}, r.handler())
	testenv.Eventually(t, e2eWait, "every message acked", func() bool { return cnt.Get(idemq.CountAcked) == n })
	dead := testenv.Drain(t, dlq)
	for _, d := range dead {
		if d.Headers[idemq.HeaderReason] != idemq.ReasonSuspectedDuplicate {
			t.Errorf("dead letter %s reason %v", d.MessageId, d.Headers[idemq.HeaderReason])
		}
	}
	if len(dead) == 0 || len(r.snapshot())+len(dead) != n {
		t.Fatalf("%d ran + %d dead-lettered, want %d with both > 0", len(r.snapshot()), len(dead), n)
	}
}

// With a verifier (an exact Redis store as the record of truth), filter
// hits are checked: every new message runs once despite the false
// positives, nothing is set aside, and the resent copies are suppressed.
func TestVerifierResolvesFalsePositivesEndToEnd(t *testing.T) {
	testenv.RequireAMQP(t)
	queue := testenv.Queue(t, nil)
	c, prefix := testenv.Redis(t)
	truth, err := redisstore.New(c, redisstore.Config{KeyPrefix: prefix + ":truth:"})
	if err != nil {
		t.Fatal(err)
	}
	store, err := bloom.NewStore(bloom.StoreConfig{Leases: dedup.NewMemory(dedup.MemoryConfig{}), Filter: tinyFilter(t, "local"),
		Verifier: bloom.RecordOfTruth(truth), Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	const n = 100
	all := ids("vf", n)
	publishIDs(t, queue, append(all, all...))
	r := &runs{n: map[string]int{}}
	cnt := consume(t, idemq.ConsumerConfig{URL: testenv.RequireAMQP(t), Queue: queue, Workers: 4, Prefetch: 50,
		Pipeline: idemq.Pipeline{Guard: guard(t, store, dedup.Config{InFlightRetryAfter: 50 * time.Millisecond})},
	}, r.handler())
	testenv.Eventually(t, e2eWait, "every copy acked", func() bool { return cnt.Get(idemq.CountAcked) == 2*n })
	got := r.snapshot()
	for _, id := range all {
		if got[id] != 1 {
			t.Errorf("%s ran %d times, want 1", id, got[id])
		}
	}
	if fp := cnt.Get(bloom.CountFalsePositives); fp == 0 {
		t.Error("no false positive was verified: the tiny filter did not force the verifier path")
	}
	if d := cnt.Get(idemq.CountDuplicates); d != n {
		t.Errorf("%d duplicates suppressed, want %d", d, n)
	}
	if u := cnt.Get(idemq.CountUncertain); u != 0 {
		t.Errorf("%d uncertain with a verifier", u)
	}
}

// senderFunc is a Sender that never reaches a broker.
type senderFunc func(ctx context.Context, m idemq.Message) error

func (f senderFunc) Publish(ctx context.Context, m idemq.Message) error { return f(ctx, m) }

// The router wraps the retry policy: it forwards the policy's delay
// queues, so the consumer releases them (without it the retries of a
// router pipeline would wait in their queues for good).
func TestRouterForwardsDelayQueues(t *testing.T) {
	send := senderFunc(func(context.Context, idemq.Message) error { return nil })
	p := retryPolicy(t, retry.Config{Sender: send, Delays: []time.Duration{time.Second, 5 * time.Second, time.Second}})
	r := router(t, bloom.RouterConfig{Sender: send, Policy: p})
	s, qs := idemq.DelayQueuesOf(r, "orders")
	if s == nil || len(qs) != 2 || qs[0].Name != "orders.retry.1000" || qs[1].Name != "orders.retry.5000" || qs[1].Delay != 5*time.Second {
		t.Fatalf("DelayQueuesOf(router) = %v, %+v; want the retry policy's two queues", s, qs)
	}
	if s, qs := idemq.DelayQueuesOf(idemq.BasePolicy{}, "orders"); s != nil || qs != nil {
		t.Fatalf("BasePolicy parks nothing, got %v %v", s, qs)
	}
}
