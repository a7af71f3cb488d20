package bench

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

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/retry"
	"github.com/idemq/idemq/topology"
)

// retryDelay is the delayed retry of BenchmarkRetryRoute.
const retryDelay = 200 * time.Millisecond

// BenchmarkRetryRoute prices the two ways a delayed retry gets back to its
// work queue: "release" (idemq's default: the consumer takes each one
// from its retry queue when due, republishes it confirmed, then acks it)
// and "dead-letter" (the broker's message TTL and at-least-once
// dead-lettering, the former default). b.N messages are pre-filled; every
// one fails its first run and goes through a 200 ms delayed retry; the
// case ends when every message has run twice. It reports msgs/s (each
// message handled twice plus its retry hop) and how late the second run
// came after its due time (the failure plus the delay): late-p50-ms,
// late-p99-ms. Run with -count 5: the two cases alternate.
func BenchmarkRetryRoute(b *testing.B) {
	for _, route := range []topology.RetryRoute{topology.RouteRelease, topology.RouteDeadLetter} {
		b.Run(string(route), func(b *testing.B) { retryRouteCase(b, route) })
	}
}

func retryRouteCase(b *testing.B, route topology.RetryRoute) {
	name := fmt.Sprintf("idemq.bench.retry-%s", route)
	q := topology.Queue{Name: name, Type: topology.Quorum, RetryRoute: route, RetryDelays: []time.Duration{retryDelay}}
	plan := topology.ForQueue(q)
	// A fresh declaration: the route changes the retry queue's arguments.
	cleanup := func() {
		conn := dial(b)
		defer conn.Close()
		for _, n := range []string{plan.Queue, plan.DLQ, plan.Retries[0].Name} {
			if ch, err := conn.Channel(); err == nil {
				_, _ = ch.QueueDelete(n, false, false, false)
				_ = ch.Close()
			}
		}
	}
	cleanup()
	b.Cleanup(cleanup)
	conn := dial(b)
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := topology.Declare(context.Background(), ch, topology.Topology{Queues: []topology.Queue{q}}); err != nil {
		b.Fatal(err)
	}
	conn.Close()
	fill(b, plan.Queue, b.N, fmt.Sprintf("retry-%s-%d", route, time.Now().UnixNano()), 0)

	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	pub, err := idemq.NewPublisher(idemq.PublisherConfig{URL: amqpURL(), Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	policy, err := retry.New(retry.ForTopology(q, retry.Config{Sender: pub, QuickAttempts: 1, MaxAttempts: 3}))
	if err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	failedAt := make(map[string]time.Time, b.N)
	late := make([]time.Duration, 0, b.N)
	done := make(chan struct{})
	handler := idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
		id, err := d.ID()
		if err != nil {
			return err
		}
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		t0, again := failedAt[id]
		if !again {
			failedAt[id] = now
			return errors.New("first run fails")
		}
		late = append(late, now.Sub(t0.Add(retryDelay)))
		if len(late) == b.N {
			close(done)
		}
		return nil
	})
	cons, err := idemq.NewConsumer(idemq.ConsumerConfig{
		URL: amqpURL(), Queue: plan.Queue, Logger: quiet, Prefetch: Prefetch,
		Release:  idemq.ReleaseConfig{Disabled: route == topology.RouteDeadLetter},
		Pipeline: idemq.Pipeline{Policy: policy, Handler: handler},
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	b.ResetTimer()
	start := time.Now()
	go func() { _ = cons.Run(ctx); close(stopped) }()
	select {
	case <-done:
	case <-time.After(5*time.Minute + time.Duration(b.N)*time.Millisecond):
		mu.Lock()
		n := len(late)
		mu.Unlock()
		cancel()
		<-stopped
		b.Fatalf("%d of %d messages ran again within the time allowed", n, b.N)
	}
	el := time.Since(start)
	b.StopTimer()
	cancel()
	<-stopped
	b.ReportMetric(float64(b.N)/el.Seconds(), "msgs/s")
	sort.Slice(late, func(i, j int) bool { return late[i] < late[j] })
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(late[len(late)/2]), "late-p50-ms")
	b.ReportMetric(ms(late[min(len(late)-1, len(late)*99/100)]), "late-p99-ms")
	if c := cons.Counters(); c.Get(idemq.CountDeadLettered) != 0 {
		b.Fatalf("%d dead-lettered", c.Get(idemq.CountDeadLettered))
	}
}
