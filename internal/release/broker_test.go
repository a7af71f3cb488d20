package release_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/backoff"
	"github.com/idemq/idemq/internal/release"
	"github.com/idemq/idemq/internal/testenv"
)

// taken records what Publish was handed, and when.
type taken struct {
	mu  sync.Mutex
	at  []time.Time
	ids []string
	red []bool
}

func (k *taken) add(d *amqp.Delivery) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.at = append(k.at, time.Now())
	k.ids = append(k.ids, d.MessageId)
	k.red = append(k.red, d.Redelivered)
}

func (k *taken) n() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.at)
}

func start(t *testing.T, cfg release.Config) *release.Releaser {
	t.Helper()
	u := testenv.RequireAMQP(t)
	conn, err := testenv.Dial(u, amqp.Config{Heartbeat: 10 * time.Second, Locale: "en_US"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	cfg.DueHeader = due
	cfg.Tag = "release-test"
	cfg.Logger = slog.New(slog.DiscardHandler)
	r, err := release.Start(context.Background(), conn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A delivery is handed back when due, not before, and acked: the delay
// queue ends empty.
func TestReleaseOnTime(t *testing.T) {
	q := testenv.Queue(t, nil)
	var k taken
	r := start(t, release.Config{Queues: []release.Queue{{Name: q, Delay: 5 * time.Second}},
		Publish: func(ctx context.Context, d *amqp.Delivery) error { k.add(d); return nil }})
	defer r.Stop(time.Second)
	published := time.Now()
	testenv.Publish(t, "", q,
		amqp.Publishing{MessageId: "a", Headers: amqp.Table{due: published.Add(700 * time.Millisecond).UnixMilli()}},
		amqp.Publishing{MessageId: "b", Headers: amqp.Table{due: published.Add(-time.Minute).UnixMilli()}}, // overdue
	)
	testenv.Eventually(t, 10*time.Second, "both released", func() bool { return k.n() == 2 })
	k.mu.Lock()
	at := map[string]time.Time{}
	for i, id := range k.ids {
		at[id] = k.at[i]
	}
	k.mu.Unlock()
	if wait := at["a"].Sub(published); wait < 650*time.Millisecond {
		t.Errorf("a released %v after its publish, want no sooner than its due time (700ms)", wait)
	}
	// The queue is ordered by due time: b, overdue behind a, goes right
	// after it (its republish runs concurrently with a's).
	if d := at["b"].Sub(at["a"]); d > 200*time.Millisecond || d < -200*time.Millisecond {
		t.Errorf("an overdue delivery behind a due one released %v apart from it", d)
	}
	testenv.Eventually(t, 10*time.Second, "delay queue empty (acked)", func() bool {
		n, _ := testenv.QueueCounts(t, q)
		return n == 0
	})
}

// A delivery due later than HoldLimit is given back after HoldLimit and
// taken again (the broker's consumer_timeout never sees it held longer),
// then released when due.
func TestReleaseHoldLimit(t *testing.T) {
	q := testenv.Queue(t, nil)
	var k taken
	r := start(t, release.Config{Queues: []release.Queue{{Name: q, Delay: time.Minute}}, HoldLimit: 300 * time.Millisecond,
		Publish: func(ctx context.Context, d *amqp.Delivery) error { k.add(d); return nil }})
	defer r.Stop(time.Second)
	published := time.Now()
	due15 := published.Add(1500 * time.Millisecond).UnixMilli()
	testenv.Publish(t, "", q, amqp.Publishing{MessageId: "a", Headers: amqp.Table{due: due15}},
		amqp.Publishing{MessageId: "b", Headers: amqp.Table{due: due15}})
	testenv.Eventually(t, 10*time.Second, "released", func() bool { return k.n() == 2 })
	k.mu.Lock()
	defer k.mu.Unlock()
	for i, id := range k.ids {
		if wait := k.at[i].Sub(published); wait < 1400*time.Millisecond {
			t.Errorf("%s released after %v, want at its due time (1.5s)", id, wait)
		}
		if !k.red[i] {
			t.Errorf("%s released on the first take: HoldLimit did not give it back", id)
		}
	}
}

// A failed republish gives the delivery back to its delay queue; it is
// released on a later try, once.
func TestReleaseFailedPublishTriesAgain(t *testing.T) {
	q := testenv.Queue(t, nil)
	var k taken
	var mu sync.Mutex
	fails, failed := 2, 0
	r := start(t, release.Config{Queues: []release.Queue{{Name: q, Delay: time.Second}},
		Retry:  backoff.Policy{Min: 10 * time.Millisecond, Max: 50 * time.Millisecond},
		Failed: func(error) { mu.Lock(); failed++; mu.Unlock() },
		Publish: func(ctx context.Context, d *amqp.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			if fails > 0 {
				fails--
				return errors.New("work queue unreachable")
			}
			k.add(d)
			return nil
		}})
	defer r.Stop(time.Second)
	testenv.Publish(t, "", q, amqp.Publishing{MessageId: "a", Headers: amqp.Table{due: time.Now().UnixMilli()}})
	testenv.Eventually(t, 10*time.Second, "released after two failures", func() bool { return k.n() == 1 })
	testenv.Eventually(t, 10*time.Second, "delay queue empty (acked)", func() bool {
		n, _ := testenv.QueueCounts(t, q)
		return n == 0
	})
	mu.Lock()
	defer mu.Unlock()
	if failed != 2 || k.n() != 1 {
		t.Errorf("failed %d, released %d; want 2 and 1", failed, k.n())
	}
}

// Stop lets a republish in flight finish and ack; what is held and not
// due goes back to the delay queue, ready for the next releaser.
func TestReleaseStop(t *testing.T) {
	q := testenv.Queue(t, nil)
	var k taken
	inflight := make(chan struct{})
	r := start(t, release.Config{Queues: []release.Queue{{Name: q, Delay: time.Hour}},
		Publish: func(ctx context.Context, d *amqp.Delivery) error {
			close(inflight)
			time.Sleep(300 * time.Millisecond) // the republish's confirm
			k.add(d)
			return nil
		}})
	testenv.Publish(t, "", q,
		amqp.Publishing{MessageId: "now", Headers: amqp.Table{due: time.Now().UnixMilli()}},
		amqp.Publishing{MessageId: "later", Headers: amqp.Table{due: time.Now().Add(time.Hour).UnixMilli()}})
	<-inflight
	r.Stop(5 * time.Second)
	if k.n() != 1 {
		t.Fatalf("released %d, want the one in flight", k.n())
	}
	testenv.Eventually(t, 10*time.Second, "the held one back in the queue, the released one acked", func() bool {
		n, _ := testenv.QueueCounts(t, q)
		return n == 1
	})
	d := testenv.Drain(t, q)
	if len(d) != 1 || d[0].MessageId != "later" {
		t.Fatalf("left in the delay queue: %d, want \"later\"", len(d))
	}
}
