package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq"
)

// Prefetch is the QoS every consumer case uses.
const Prefetch = 200

// consumeCase measures one consumer against a queue pre-filled with b.N
// messages. run starts consuming and must return once n messages are acked.
func consumeCase(b *testing.B, name string, run func(b *testing.B, queue string, n int)) {
	b.Run(name, func(b *testing.B) {
		queue := freshQueue(b, fmt.Sprintf("idemq.bench.%s", name))
		fill(b, queue, b.N, name, 0)
		b.ResetTimer()
		cpu0 := cpuSeconds()
		start := time.Now()
		run(b, queue, b.N)
		el := time.Since(start)
		cpu := cpuSeconds() - cpu0
		b.StopTimer()
		b.ReportMetric(float64(b.N)/el.Seconds(), "msgs/s")
		b.ReportMetric(cpu/float64(b.N)*10000, "cpu-s/10k")
	})
}

func BenchmarkConsume(b *testing.B) {
	consumeCase(b, "raw-ack-each", func(b *testing.B, queue string, n int) { rawConsume(b, queue, n, 1) })
	consumeCase(b, "raw-multiple-ack-50", func(b *testing.B, queue string, n int) { rawConsume(b, queue, n, 50) })
	consumeCase(b, "idemq-noop", func(b *testing.B, queue string, n int) {
		idemqConsume(b, queue, n, idemq.HandlerFunc(func(context.Context, *idemq.Delivery) error { return nil }))
	})
}

// rawConsume is a plain amqp091-go consumer: ack each (every=1) or ack
// multiple every `every` deliveries.
func rawConsume(b *testing.B, queue string, n, every int) {
	conn := dial(b)
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := ch.Qos(Prefetch, 0, false); err != nil {
		b.Fatal(err)
	}
	ds, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	for i := 1; i <= n; i++ {
		d := <-ds
		if every == 1 {
			if err := d.Ack(false); err != nil {
				b.Fatal(err)
			}
		} else if i%every == 0 || i == n {
			if err := d.Ack(true); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// idemqConsume runs an idemq consumer (4 workers) until n deliveries are acked.
func idemqConsume(b *testing.B, queue string, n int, h idemq.Handler, mws ...idemq.Middleware) *idemq.Counters {
	return idemqConsumeWorkers(b, queue, n, 4, h, mws...)
}

// idemqConsumeWorkers runs an idemq consumer until n deliveries are acked.
func idemqConsumeWorkers(b *testing.B, queue string, n, workers int, h idemq.Handler, mws ...idemq.Middleware) *idemq.Counters {
	var rec idemq.Counters
	var acked atomic.Int64
	done := make(chan struct{})
	counting := idemq.Middleware(func(next idemq.Handler) idemq.Handler {
		return idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
			err := next.Handle(ctx, d)
			if err == nil && acked.Add(1) == int64(n) {
				close(done)
			}
			return err
		})
	})
	c, err := idemq.NewConsumer(idemq.ConsumerConfig{
		Queue: queue, Prefetch: Prefetch, Workers: workers, Recorder: &rec,
		Middleware: append([]idemq.Middleware{counting}, mws...),
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
	}, h)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- c.Run(ctx) }()
	select {
	case <-done:
	case <-time.After(10 * time.Minute):
		b.Fatal("timed out")
	}
	cancel() // graceful: flushes the last coalesced ack
	if err := <-runDone; err != nil {
		b.Fatal(err)
	}
	return &rec
}
