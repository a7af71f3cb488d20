package idemq_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/backoff"
	"github.com/idemq/idemq/internal/testenv"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func publishN(t *testing.T, queue string, n int, prefix string) []string {
	t.Helper()
	ids := make([]string, n)
	msgs := make([]amqp.Publishing, n)
	for i := range msgs {
		ids[i] = fmt.Sprintf("%s-%d", prefix, i)
		msgs[i] = amqp.Publishing{MessageId: ids[i], Body: []byte(ids[i])}
	}
	testenv.Publish(t, "", queue, msgs...)
	return ids
}

// tracker counts handler runs per message ID.
type tracker struct {
	mu   sync.Mutex
	seen map[string]int
	n    atomic.Int64
}

func newTracker() *tracker { return &tracker{seen: map[string]int{}} }

func (tr *tracker) add(id string) {
	tr.mu.Lock()
	tr.seen[id]++
	tr.mu.Unlock()
	tr.n.Add(1)
}

func (tr *tracker) distinct() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return len(tr.seen)
}

func (tr *tracker) count(id string) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.seen[id]
}

// runConsumer starts a consumer and returns it with a stop function that
// cancels it and waits for Run to return (idempotent; also run at cleanup).
func runConsumer(t *testing.T, cfg idemq.ConsumerConfig, h idemq.Handler) (*idemq.Consumer, func() error) {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	if cfg.Dial == nil {
		cfg.Dial = testenv.Dial // the fake broker under IDEMQ_TEST_BROKER=fake
	}
	cfg.Pipeline.Handler = h
	c, err := idemq.NewConsumer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var runErr error
	go func() { runErr = c.Run(ctx); close(done) }()
	stop := func() error {
		cancel()
		select {
		case <-done:
			return runErr
		case <-time.After(60 * time.Second):
			return errors.New("consumer did not stop within 60s")
		}
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	})
	select {
	case <-c.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("consumer not ready within 30s")
	}
	return c, stop
}

// Every delivery is acked exactly once whatever order the workers finish in:
// random handler latencies over 8 workers, several seeds. A double ack or an
// ack of an unknown tag closes the channel (PRECONDITION_FAILED), which would
// show up as a reconnect and as redeliveries.
func TestAckCoalescingRandomOrders(t *testing.T) {
	testenv.RequireAMQP(t)
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			queue := testenv.Queue(t, nil)
			const n = 1500
			ids := publishN(t, queue, n, "m")
			tr := newTracker()
			var mu sync.Mutex
			rng := rand.New(rand.NewPCG(seed, 42))
			c, stop := runConsumer(t, idemq.ConsumerConfig{
				Queue: queue, Workers: 8, Prefetch: 100, AckBatch: int(seed * 13),
			}, idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
				mu.Lock()
				sleep := time.Duration(rng.IntN(400)) * time.Microsecond
				mu.Unlock()
				time.Sleep(sleep)
				tr.add(d.MessageID)
				return nil
			}))
			testenv.Eventually(t, 60*time.Second, "all messages handled", func() bool { return tr.n.Load() >= n })
			if left := stopAndDrain(t, stop, queue); left != 0 {
				t.Fatalf("%d deliveries were handled but not acked", left)
			}
			if got := c.Counters().Get(idemq.CountAcked); got != n {
				t.Fatalf("acked %d, want %d", got, n)
			}
			for _, id := range ids {
				if got := tr.count(id); got != 1 {
					t.Fatalf("%s handled %d times, want 1", id, got)
				}
			}
			if r := c.Counters().Get(idemq.CountReconnects); r != 0 {
				t.Fatalf("channel was re-established %d times: an ack frame broke it", r)
			}
			if r := c.Counters().Get(idemq.CountRedelivered); r != 0 {
				t.Fatalf("%d redeliveries: some ack was lost or doubled", r)
			}
		})
	}
}

// stopAndDrain stops the consumer and counts what is left in the queue: a
// delivery the consumer handled but never acked goes back to ready when its
// channel closes, so it shows up here.
func stopAndDrain(t *testing.T, stop func() error, queue string) int {
	t.Helper()
	if err := stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	return len(testenv.Drain(t, queue))
}

// The consumer keeps consuming after its connection is cut (the socket
// closed under it), several times, and nothing is lost.
func TestConsumerSurvivesConnectionCuts(t *testing.T) {
	testenv.RequireRealBroker(t, "cuts TCP connections through a proxy")
	proxy, url := testenv.AMQPProxy(t)
	queue := testenv.Queue(t, nil)
	const n = 3000
	ids := publishN(t, queue, n, "cut")
	tr := newTracker()
	c, stop := runConsumer(t, idemq.ConsumerConfig{
		URL: url, Queue: queue, Workers: 4, Prefetch: 50,
		Reconnect: backoffFast(),
	}, idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
		time.Sleep(200 * time.Microsecond)
		tr.add(d.MessageID)
		return nil
	}))
	for cut := 1; cut <= 3; cut++ {
		target := int64(cut * n / 4)
		testenv.Eventually(t, 60*time.Second, "progress before cut", func() bool { return tr.n.Load() >= target })
		proxy.Cut()
		testenv.Eventually(t, 30*time.Second, "reconnect", func() bool { return c.Counters().Get(idemq.CountReconnects) >= int64(cut) })
	}
	testenv.Eventually(t, 60*time.Second, "every message handled", func() bool { return tr.distinct() == n })
	if left := stopAndDrain(t, stop, queue); left != 0 {
		t.Fatalf("%d deliveries left unacked", left)
	}
	for _, id := range ids {
		if tr.count(id) == 0 {
			t.Fatalf("%s lost", id)
		}
	}
	t.Logf("handled %d deliveries for %d messages across 3 cuts (redelivered %d)", tr.n.Load(), n, c.Counters().Get(idemq.CountRedelivered))
}

// Graceful shutdown: cancel while deliveries are in flight; Run returns,
// every message is either handled-and-acked or still ready in the queue —
// never both, never neither, nothing left unacked.
func TestGracefulShutdownLosesNothing(t *testing.T) {
	testenv.RequireAMQP(t)
	queue := testenv.Queue(t, nil)
	const n = 600
	ids := publishN(t, queue, n, "g")
	tr := newTracker()
	c, stop := runConsumer(t, idemq.ConsumerConfig{Queue: queue, Workers: 6, Prefetch: 60},
		idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
			time.Sleep(2 * time.Millisecond)
			tr.add(d.MessageID)
			return nil
		}))
	testenv.Eventually(t, 30*time.Second, "some progress", func() bool { return tr.n.Load() >= n/4 })
	if err := stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	handled := tr.n.Load()
	if handled >= n {
		t.Fatalf("handled all %d before shutdown; the test needs a slower handler", n)
	}
	if got := c.Counters().Get(idemq.CountAcked); got != handled {
		t.Fatalf("acked %d, handled %d", got, handled)
	}
	rest := testenv.Drain(t, queue)
	if int64(len(rest))+handled != n {
		t.Fatalf("handled %d + left in queue %d != %d", handled, len(rest), n)
	}
	for _, d := range rest {
		if tr.count(d.MessageId) != 0 {
			t.Fatalf("%s was handled and is still in the queue (not acked)", d.MessageId)
		}
	}
	_ = ids
}

// A panicking handler is a failed handler; the process and the consumer
// live on, and the delivery is rejected, not requeued in a loop.
func TestPanicIsAFailedHandler(t *testing.T) {
	testenv.RequireAMQP(t)
	dlq := testenv.Queue(t, nil)
	queue := testenv.Queue(t, amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
	publishN(t, queue, 10, "p")
	var runs atomic.Int64
	c, _ := runConsumer(t, idemq.ConsumerConfig{Queue: queue, Workers: 2},
		idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
			runs.Add(1)
			if d.MessageID == "p-3" {
				panic("boom")
			}
			if d.MessageID == "p-4" {
				return errors.New("plain failure")
			}
			return nil
		}))
	testenv.Eventually(t, 20*time.Second, "all handled", func() bool {
		return c.Counters().Get(idemq.CountAcked) == 8 && c.Counters().Get(idemq.CountRejected) == 2
	})
	testenv.Eventually(t, 10*time.Second, "two dead letters", func() bool { r, _ := testenv.QueueCounts(t, dlq); return r == 2 })
	if got := c.Counters().Get(idemq.CountPanics); got != 1 {
		t.Fatalf("panics = %d, want 1", got)
	}
	if runs.Load() != 10 {
		t.Fatalf("handler ran %d times, want 10 (no requeue loop)", runs.Load())
	}
}

// A RequeueError brings the delivery back later, without holding a worker.
func TestRequeueErrorComesBackLater(t *testing.T) {
	testenv.RequireAMQP(t)
	queue := testenv.Queue(t, nil)
	publishN(t, queue, 1, "r")
	var runs atomic.Int64
	var first, second atomic.Int64
	c, _ := runConsumer(t, idemq.ConsumerConfig{Queue: queue},
		idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
			if runs.Add(1) == 1 {
				first.Store(time.Now().UnixNano())
				return idemq.Requeue(150*time.Millisecond, "test", errors.New("not now"))
			}
			second.Store(time.Now().UnixNano())
			return nil
		}))
	testenv.Eventually(t, 10*time.Second, "second run", func() bool { return c.Counters().Get(idemq.CountAcked) == 1 })
	if gap := time.Duration(second.Load() - first.Load()); gap < 150*time.Millisecond {
		t.Fatalf("requeued delivery came back after %v, want ≥150ms", gap)
	}
}

func backoffFast() backoff.Policy {
	return backoff.Policy{Min: 20 * time.Millisecond, Max: 500 * time.Millisecond}
}

func TestNewConsumerValidates(t *testing.T) {
	h := idemq.HandlerFunc(func(context.Context, *idemq.Delivery) error { return nil })
	if _, err := idemq.NewConsumer(idemq.ConsumerConfig{Pipeline: idemq.Pipeline{Handler: h}}); err == nil {
		t.Fatal("want error for a missing queue")
	}
	if _, err := idemq.NewConsumer(idemq.ConsumerConfig{Queue: "q"}); !errors.Is(err, idemq.ErrNoHandler) {
		t.Fatalf("nil handler: err = %v, want ErrNoHandler", err)
	}
}
