package fakemq_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/retry"
	"github.com/idemq/idemq/topology"
)

// runs counts a handler's runs per message ID.
type runs struct {
	mu  sync.Mutex
	n   map[string]int
	red map[string][]bool // Redelivered of each run
}

func (r *runs) add(d *idemq.Delivery) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n, r.red = map[string]int{}, map[string][]bool{}
	}
	r.n[d.MessageID]++
	r.red[d.MessageID] = append(r.red[d.MessageID], d.Redelivered)
	return r.n[d.MessageID]
}

func (r *runs) get(id string) (int, []bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[id], append([]bool(nil), r.red[id]...)
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", wait, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// startConsumer runs an idemq Consumer with the retry policy on tg until
// the test ends.
func startConsumer(t *testing.T, tg target, p topology.Plan, h idemq.HandlerFunc) *idemq.Consumer {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	pub, err := idemq.NewPublisher(idemq.PublisherConfig{URL: tg.url, Dial: tg.dial, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	policy, err := retry.New(retry.Config{Sender: pub, Delays: p.Delays, QuickAttempts: 1, MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	c, err := idemq.NewConsumer(idemq.ConsumerConfig{URL: tg.url, Dial: tg.dial, Queue: p.Queue, Group: "g1",
		Logger: quiet, Prefetch: 4, Pipeline: idemq.Pipeline{Policy: policy, Handler: h}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-c.Ready():
	case <-time.After(wait):
		t.Fatal("consumer not ready")
	}
	return c
}

// declarePlan declares a work queue with one 50ms retry queue and a DLQ on
// tg, as `idemq topology apply` would, deleted at cleanup.
func declarePlan(t *testing.T, tg target) topology.Plan {
	t.Helper()
	_, ch := tg.channel(t)
	q := topology.Queue{Name: testenv.Name(t, "w"), RetryDelays: []time.Duration{50 * time.Millisecond}}
	p := topology.ForQueue(q)
	if err := topology.DeclareQueue(context.Background(), ch, q); err != nil {
		t.Fatalf("%s: declare: %v", tg.name, err)
	}
	t.Cleanup(func() {
		_, ch := tg.channel(t)
		for _, n := range append([]string{p.Queue, p.DLQ}, retryNames(p)...) {
			_, _ = ch.QueueDelete(n, false, false, false)
		}
	})
	return p
}

func retryNames(p topology.Plan) []string {
	var s []string
	for _, r := range p.Retries {
		s = append(s, r.Name)
	}
	return s
}

// The idemq Consumer with its retry policy, on the fake and on RabbitMQ: a
// message that succeeds, one that fails once (retried through the retry
// queue's TTL), one that always fails (dead-lettered after MaxAttempts),
// and one the handler rejects as malformed. Same runs, same redelivered
// flags, same attempts, same dead letters.
func TestConsumerSameVerdicts(t *testing.T) {
	var got [2][]string
	for i, mk := range []func(*testing.T) target{fake, rabbit} {
		tg := mk(t)
		p := declarePlan(t, tg)
		var r runs
		startConsumer(t, tg, p, func(ctx context.Context, d *idemq.Delivery) error {
			n := r.add(d)
			switch d.MessageID {
			case "flaky":
				if n == 1 {
					return errors.New("hiccup")
				}
			case "bad":
				return errors.New("always broken")
			case "malformed":
				return idemq.Permanent(errors.New("cannot parse"))
			}
			return nil
		})
		ids := []string{"ok", "flaky", "bad", "malformed"}
		publish(t, tg, "", p.Queue, ids...)
		_, ch := tg.channel(t)
		var dead []amqp.Delivery
		eventually(t, tg.name+": two dead letters", func() bool {
			d, ok, err := ch.Get(p.DLQ, true)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				dead = append(dead, d)
			}
			return len(dead) == 2
		})
		eventually(t, tg.name+": ok and flaky handled", func() bool {
			a, _ := r.get("ok")
			b, _ := r.get("flaky")
			return a == 1 && b == 2
		})
		eventually(t, tg.name+": queues empty", func() bool {
			return ready(t, ch, p.Queue) == 0 && ready(t, ch, p.Retries[0].Name) == 0
		})
		var lines []string
		for _, id := range ids {
			n, red := r.get(id)
			lines = append(lines, fmt.Sprintf("%s: %d runs, redelivered %v", id, n, red))
		}
		sort.Slice(dead, func(i, j int) bool { return dead[i].MessageId < dead[j].MessageId })
		for _, d := range dead {
			lines = append(lines, fmt.Sprintf("dead letter %s: reason %v attempts %v body %s",
				d.Body, d.Headers[idemq.HeaderReason], d.Headers["x-idemq-attempts"], d.Body))
		}
		got[i] = lines
	}
	for i := range max(len(got[0]), len(got[1])) {
		f, b := at(got[0], i), at(got[1], i)
		if f != b {
			t.Errorf("line %d differs\n  fake:     %s\n  rabbitmq: %s", i, f, b)
		} else {
			t.Logf("same: %s", f)
		}
	}
}

func at(s []string, i int) string {
	if i < len(s) {
		return s[i]
	}
	return "<none>"
}

// A connection cut while a delivery is in the handler: the broker gives it
// back redelivered, the consumer reconnects and the handler runs it again.
func TestDropConnectionsRedelivers(t *testing.T) {
	b := fakemqNew(t)
	tg := target{name: "fake", url: "amqp://fake/", dial: b.Dial}
	p := declarePlan(t, tg)
	var r runs
	inHandler := make(chan struct{}, 1)
	release := make(chan struct{})
	startConsumer(t, tg, p, func(ctx context.Context, d *idemq.Delivery) error {
		if r.add(d) == 1 {
			inHandler <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done(): // the channel died
			}
			return ctx.Err()
		}
		return nil
	})
	publish(t, tg, "", p.Queue, "m")
	select {
	case <-inHandler:
	case <-time.After(wait):
		t.Fatal("handler never ran")
	}
	b.DropConnections()
	eventually(t, "the delivery runs again", func() bool { n, _ := r.get("m"); return n == 2 })
	close(release)
	_, red := r.get("m")
	if red[0] || !red[1] {
		t.Fatalf("redelivered flags %v, want [false true]", red)
	}
	eventually(t, "queue settled", func() bool {
		qi, _ := b.Queue(p.Queue)
		return qi.Ready == 0 && qi.Unacked == 0
	})
}
