package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/gate"
	"github.com/idemq/idemq/internal/redistest"
)

// gateCase measures one forwarder: a queue pre-filled with b.N messages is
// forwarded to an output queue (default exchange), each forward publisher
// confirmed before its delivery is acked. fn returns once every delivery
// reached its outcome.
func gateCase(b *testing.B, name string, dupEvery int, fn func(b *testing.B, r *run, out string)) {
	b.Run(name, func(b *testing.B) {
		queue := freshQueue(b, fmt.Sprintf("idemq.bench.gate.%s", name))
		out := freshQueue(b, fmt.Sprintf("idemq.bench.gate.%s.out", name))
		r := &run{Queue: queue, N: b.N}
		r.Dups = fill(b, queue, b.N, fmt.Sprintf("%s-%d", name, time.Now().UnixNano()), dupEvery)
		b.ResetTimer()
		cpu0 := cpuSeconds()
		start := time.Now()
		fn(b, r, out)
		el := time.Since(start)
		cpu := cpuSeconds() - cpu0
		b.StopTimer()
		b.ReportMetric(float64(b.N)/el.Seconds(), "msgs/s")
		b.ReportMetric(cpu/float64(b.N)*10000, "cpu-s/10k")
	})
}

// BenchmarkGate compares the dedup gate (Redis store) with a raw
// amqp091-go forwarder doing the same broker work without dedup: consume,
// publish each to the output with confirms (mandatory, 200 in flight, the
// prefetch), ack each after its confirm.
func BenchmarkGate(b *testing.B) {
	gateCase(b, "raw-forward-ack-each", 0, func(b *testing.B, r *run, out string) { rawForward(b, r.Queue, out, r.N) })
	for _, c := range []struct {
		name     string
		dupEvery int
		workers  int
	}{
		{"gate-redis", 0, 0},
		{"gate-redis-w64", 0, 64},
		{"gate-redis-dup20", DupEvery, 0},
	} {
		gateCase(b, c.name, c.dupEvery, func(b *testing.B, r *run, out string) {
			runGate(b, r, out, c.workers)
		})
	}
}

func rawForward(b *testing.B, queue, out string, n int) {
	conn := dial(b)
	defer conn.Close()
	cch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := cch.Qos(Prefetch, 0, false); err != nil {
		b.Fatal(err)
	}
	pconn := dial(b)
	defer pconn.Close()
	pch, err := pconn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := pch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	ds, err := cch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	type pending struct {
		dc *amqp.DeferredConfirmation
		d  amqp.Delivery
	}
	fifo := make(chan pending, Prefetch)
	done := make(chan error, 1)
	go func() {
		ctx := context.Background()
		for i := 0; i < n; i++ {
			p := <-fifo
			if ok, err := p.dc.WaitContext(ctx); err != nil || !ok {
				done <- fmt.Errorf("confirm: ok=%v err=%v", ok, err)
				return
			}
			if err := p.d.Ack(false); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for i := 0; i < n; i++ {
		d := <-ds
		dc, err := pch.PublishWithDeferredConfirm("", out, true, false, amqp.Publishing{
			Headers: d.Headers, ContentType: d.ContentType, DeliveryMode: d.DeliveryMode,
			MessageId: d.MessageId, Timestamp: d.Timestamp, Body: d.Body,
		})
		if err != nil {
			b.Fatal(err)
		}
		fifo <- pending{dc, d}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

func runGate(b *testing.B, r *run, out string, workers int) {
	g, err := gate.New(gate.Config{
		URL:     amqpURL(),
		Ingress: r.Queue,
		Routes:  []gate.Route{{RoutingKey: out}},
		Store:   redistest.Store(b, redisClient(b), redisstore.Config{}),
		Prefix:  fmt.Sprintf("idemq-bench-gate-%d", time.Now().UnixNano()),
		// A duplicate that overtakes its original (tiny smoke runs only)
		// waits at most this lease.
		Lease:    2 * time.Second,
		Window:   time.Hour,
		Workers:  workers,
		Prefetch: Prefetch,
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Minute)
	for {
		s := g.Stats()
		if s.Forwarded+s.Duplicates >= int64(r.N) {
			if s.Forwarded != int64(r.N-r.Dups) || s.Duplicates != int64(r.Dups) || s.DeadLettered != 0 {
				b.Fatalf("stats %+v, want %d forwarded and %d duplicates", s, r.N-r.Dups, r.Dups)
			}
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("gate stuck: %+v", s)
		}
		time.Sleep(2 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}
