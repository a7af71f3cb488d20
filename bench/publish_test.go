package bench

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
)

// PublishWindow is the number of publishes awaiting their confirm in the
// windowed raw case and the number of concurrent idemq publishers.
const PublishWindow = 256

// publishCase measures publishing b.N persistent BodySize-byte messages to
// a fresh durable queue, each confirmed by the broker before it counts.
// prepare connects (outside the measurement) and returns the function that
// publishes n messages and returns once all are confirmed.
func publishCase(b *testing.B, name string, prepare func(b *testing.B, queue string, body []byte) func(n int)) {
	b.Run(name, func(b *testing.B) {
		queue := freshQueue(b, fmt.Sprintf("idemq.bench.publish.%s", name))
		body := make([]byte, BodySize)
		_, _ = rand.Read(body)
		publish := prepare(b, queue, body)
		b.ResetTimer()
		cpu0 := cpuSeconds()
		start := time.Now()
		publish(b.N)
		el := time.Since(start)
		cpu := cpuSeconds() - cpu0
		b.StopTimer()
		b.ReportMetric(float64(b.N)/el.Seconds(), "msgs/s")
		b.ReportMetric(cpu/float64(b.N)*10000, "cpu-s/10k")
		if got := queueDepth(b, queue); got < b.N {
			b.Fatalf("queue holds %d messages, want at least %d", got, b.N)
		}
	})
}

// queueDepth is the number of ready messages in queue.
func queueDepth(b *testing.B, queue string) int {
	conn := dial(b)
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	return q.Messages
}

func BenchmarkPublish(b *testing.B) {
	publishCase(b, "raw-confirm-each", rawPublisher(1))
	publishCase(b, fmt.Sprintf("raw-confirm-window-%d", PublishWindow), rawPublisher(PublishWindow))
	publishCase(b, "idemq-publisher-sequential", idemqPublisher(1))
	publishCase(b, fmt.Sprintf("idemq-publisher-concurrent-%d", PublishWindow), idemqPublisher(PublishWindow))
}

// rawPublish publishes with amqp091-go in confirm mode, mandatory and
// persistent like idemq's publisher, keeping at most window publishes
// awaiting their confirm (1: publish, wait, publish …).
func rawPublisher(window int) func(b *testing.B, queue string, body []byte) func(n int) {
	return func(b *testing.B, queue string, body []byte) func(n int) {
		conn := dial(b)
		b.Cleanup(func() { conn.Close() })
		ch, err := conn.Channel()
		if err != nil {
			b.Fatal(err)
		}
		if err := ch.Confirm(false); err != nil {
			b.Fatal(err)
		}
		return func(n int) { rawPublish(b, ch, queue, body, n, window) }
	}
}

func rawPublish(b *testing.B, ch *amqp.Channel, queue string, body []byte, n, window int) {
	ctx := context.Background()
	pending := make([]*amqp.DeferredConfirmation, 0, window)
	wait := func(dc *amqp.DeferredConfirmation) {
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			b.Fatalf("confirm: ok=%v err=%v", ok, err)
		}
	}
	for i := 0; i < n; i++ {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, MessageId: fmt.Sprintf("p-%d", i), Body: body,
			ContentType: "application/octet-stream", Timestamp: time.Now(),
		})
		if err != nil {
			b.Fatal(err)
		}
		pending = append(pending, dc)
		if len(pending) == window {
			// Confirms arrive in order: waiting for the oldest frees a slot.
			wait(pending[0])
			pending = append(pending[:0], pending[1:]...)
		}
	}
	for _, dc := range pending {
		wait(dc)
	}
}

// idemqPublish publishes through an idemq.Publisher from `concurrency`
// goroutines, each Publish returning after its own confirm. The publisher
// connects with one publish before the measurement.
func idemqPublisher(concurrency int) func(b *testing.B, queue string, body []byte) func(n int) {
	return func(b *testing.B, queue string, body []byte) func(n int) {
		pub, err := idemq.NewPublisher(idemq.PublisherConfig{
			URL: amqpURL(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { pub.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := pub.Publish(ctx, idemq.Message{ID: "warm-up", RoutingKey: queue, Body: body}); err != nil {
			b.Fatal(err)
		}
		return func(n int) { idemqPublish(b, pub, queue, body, n, concurrency) }
	}
}

func idemqPublish(b *testing.B, pub *idemq.Publisher, queue string, body []byte, n, concurrency int) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, concurrency)
	for w := 0; w < concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += concurrency {
				if err := pub.Publish(ctx, idemq.Message{ID: fmt.Sprintf("p-%d", i), RoutingKey: queue, Body: body}); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
}
