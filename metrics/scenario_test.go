package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/metrics"
	"github.com/idemq/idemq/retry"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// scenario is a consumer run with duplicates and failing messages: good
// messages processed once, resends of them stopped by the guard, bad
// ones dead-lettered after one attempt.
type scenario struct {
	queue, dlq, group  string
	good, resends, bad int
	m                  *metrics.Metrics
	consumer           *idemq.Consumer
	stop               func()
}

// runScenario starts the consumer, publishes, and returns once the
// consumer has settled every delivery (by the in-memory counters, not the
// metrics under test).
func runScenario(t *testing.T, m *metrics.Metrics, good, resends, bad int) *scenario {
	t.Helper()
	s := &scenario{good: good, resends: resends, bad: bad, m: m}
	s.queue = testenv.Queue(t, nil)
	s.dlq = s.queue + ".dlq"
	s.group = "g-" + s.queue
	ch := testenv.Channel(t)
	if _, err := ch.QueueDeclare(s.dlq, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.DeleteQueue(s.dlq) })

	pub, err := idemq.NewPublisher(idemq.PublisherConfig{URL: testenv.RequireAMQP(t), Recorder: m.Publisher("retry"), Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	policy, err := retry.New(retry.Config{Sender: pub, QuickAttempts: 1, MaxAttempts: 1,
		DeadLetterQueue: func(string) string { return s.dlq }})
	if err != nil {
		t.Fatal(err)
	}
	guard, err := dedup.NewGuard(dedup.Config{Store: m.Store("memory", dedup.NewMemory(dedup.MemoryConfig{})), Prefix: s.queue})
	if err != nil {
		t.Fatal(err)
	}
	rec := m.Consumer(s.queue, s.group)
	c, err := idemq.NewConsumer(idemq.ConsumerConfig{URL: testenv.RequireAMQP(t), Queue: s.queue, Group: s.group,
		Recorder: rec, Logger: quiet(), Pipeline: idemq.Pipeline{Policy: policy, Guard: guard,
			Handler: idemq.HandlerFunc(func(_ context.Context, d *idemq.Delivery) error {
				if strings.HasPrefix(d.MessageID, "bad-") {
					return errors.New("bad message")
				}
				return nil
			})}})
	if err != nil {
		t.Fatal(err)
	}
	rec.Watch(c)
	s.consumer = c
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Run(ctx); close(done) }()
	s.stop = func() { cancel(); <-done }
	t.Cleanup(s.stop)

	msgs := func(prefix string, n int) []amqp.Publishing {
		out := make([]amqp.Publishing, n)
		for i := range out {
			out[i] = amqp.Publishing{MessageId: fmt.Sprintf("%s-%d", prefix, i), Timestamp: time.Now(), Body: []byte("x")}
		}
		return out
	}
	testenv.Publish(t, "", s.queue, msgs("good", good)...)
	testenv.Publish(t, "", s.queue, msgs("bad", bad)...)
	// Resends only once the originals are done, so each is a duplicate
	// the guard's store remembers.
	counters := func(name string) float64 {
		return value(t, m.Gatherer(), "idemq_deliveries_total", map[string]string{"queue": s.queue, "outcome": name})
	}
	testenv.Eventually(t, 2*time.Minute, "originals settled", func() bool {
		return counters("processed") == float64(good) && counters("dead_lettered") == float64(bad)
	})
	testenv.Publish(t, "", s.queue, msgs("good", resends)...)
	testenv.Eventually(t, 2*time.Minute, "resends settled", func() bool { return counters("duplicate") == float64(resends) })
	return s
}

// value sums the samples of metric whose labels include want.
func value(t testing.TB, g prometheus.Gatherer, metric string, want map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != metric {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !matches(m, want) {
				continue
			}
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Histogram != nil:
				sum += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return sum
}

func matches(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, l := range m.GetLabel() {
		if v, ok := want[l.GetName()]; ok {
			if v != l.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

// series counts every sample series the gatherer returns.
func series(t testing.TB, g prometheus.Gatherer) int {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		n += len(mf.GetMetric())
	}
	return n
}
