package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/metrics"
	"github.com/idemq/idemq/tracing"
)

// DupEvery makes every fifth message of the duplicates variant repeat an
// earlier ID: 20% duplicates.
const DupEvery = 5

// run is one repetition of a consume case: the pre-filled queue, the number
// of deliveries to wait for, how many of them repeat an earlier ID, and the
// per-delivery overhead samples the case records.
type run struct {
	Queue string
	N     int
	Dups  int
	Lat   *latencies
}

// consumeCase measures one consumer against a queue pre-filled with b.N
// messages (dupEvery > 0: with duplicates, see fill). fn starts consuming
// and must return once n deliveries reached a final outcome.
func consumeCase(b *testing.B, name string, dupEvery int, fn func(b *testing.B, r *run)) {
	b.Run(name, func(b *testing.B) {
		queue := freshQueue(b, fmt.Sprintf("idemq.bench.%s", name))
		r := &run{Queue: queue, N: b.N, Lat: newLatencies(b.N)}
		r.Dups = fill(b, queue, b.N, fmt.Sprintf("%s-%d", name, time.Now().UnixNano()), dupEvery)
		b.ResetTimer()
		beam, rds := servicePIDs()
		_, selfWait0 := schedTimes(0)
		beamCPU0, beamWait0 := schedTimes(beam)
		redisCPU0, redisWait0 := schedTimes(rds)
		cpu0 := cpuSeconds()
		start := time.Now()
		fn(b, r)
		el := time.Since(start)
		cpu := cpuSeconds() - cpu0
		b.StopTimer()
		b.ReportMetric(float64(b.N)/el.Seconds(), "msgs/s")
		b.ReportMetric(cpu/float64(b.N)*10000, "cpu-s/10k")
		// Nanoseconds per message, as µs: the consumer's threads waiting
		// for a core; with the services' pids, their CPU and waits too.
		perMsg := func(ns float64) float64 { return ns / 1e3 / float64(b.N) }
		_, selfWait := schedTimes(0)
		b.ReportMetric(perMsg(selfWait-selfWait0), "rq-wait-us/msg")
		if beam > 0 {
			c, w := schedTimes(beam)
			b.ReportMetric(perMsg(c-beamCPU0), "broker-cpu-us/msg")
			b.ReportMetric(perMsg(w-beamWait0), "broker-rq-wait-us/msg")
		}
		if rds > 0 {
			c, w := schedTimes(rds)
			b.ReportMetric(perMsg(c-redisCPU0), "redis-cpu-us/msg")
			b.ReportMetric(perMsg(w-redisWait0), "redis-rq-wait-us/msg")
		}
		r.Lat.report(b)
	})
}

func BenchmarkConsume(b *testing.B) {
	consumeCase(b, "raw-ack-each", 0, func(b *testing.B, r *run) { rawConsume(b, r.Queue, r.N, 1) })
	consumeCase(b, "raw-multiple-ack-50", 0, func(b *testing.B, r *run) { rawConsume(b, r.Queue, r.N, 50) })
	consumeCase(b, "idemq-noop", 0, func(b *testing.B, r *run) {
		idemqConsume(b, r, consumerOpts{}, noop())
	})
}

// BenchmarkConsumeObserved is the idemq-noop case with the metrics
// package, then metrics and tracing on: their overhead per delivery.
// Tracing runs with the production default sampler,
// ParentBased(TraceIDRatioBased(0.01)) (the messages carry no
// traceparent: 1% of deliveries start a sampled trace), and with every
// span sampled (the worst case). No exporter: the cost measured is
// idemq's and the SDK's, not a collector's.
func BenchmarkConsumeObserved(b *testing.B) {
	consumeCase(b, "idemq-noop-plain", 0, func(b *testing.B, r *run) {
		idemqConsume(b, r, consumerOpts{}, noop())
	})
	consumeCase(b, "idemq-noop-metrics", 0, func(b *testing.B, r *run) {
		m, err := metrics.New(metrics.Config{})
		if err != nil {
			b.Fatal(err)
		}
		idemqConsume(b, r, consumerOpts{Metrics: m}, noop())
	})
	consumeCase(b, "idemq-noop-metrics-tracing-all", 0, func(b *testing.B, r *run) {
		m, err := metrics.New(metrics.Config{})
		if err != nil {
			b.Fatal(err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
		defer func() { _ = tp.Shutdown(context.Background()) }()
		idemqConsume(b, r, consumerOpts{Metrics: m}, noop(), tracing.Middleware(tp))
	})
	consumeCase(b, "idemq-noop-metrics-tracing-1pct", 0, func(b *testing.B, r *run) {
		m, err := metrics.New(metrics.Config{})
		if err != nil {
			b.Fatal(err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.01))))
		defer func() { _ = tp.Shutdown(context.Background()) }()
		idemqConsume(b, r, consumerOpts{Metrics: m}, noop(), tracing.Middleware(tp))
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

// consumerOpts are the consumer settings a case varies. Zero values are
// the consumer's defaults (Workers: 4, or what Guard suggests; Prefetch).
type consumerOpts struct {
	Workers  int
	Prefetch int
	// Guard goes in Pipeline.Guard, as the README puts it.
	Guard idemq.Layer
	// BatchesInFlight is the dedup guard's (0: its default).
	BatchesInFlight int
	// Metrics, when set, gets the consumer's outcomes and durations
	// (metrics.Consumer, teed with the in-memory counters).
	Metrics *metrics.Metrics
	// Timeout bounds the run (0: 10 minutes); the case fails past it.
	Timeout time.Duration
	// OnFinal, when set, is called with the number of deliveries that
	// reached a final outcome so far, after each one (the scale run's
	// progress marks).
	OnFinal func(n int64)
}

// idemqConsume runs an idemq consumer until r.N deliveries reached a final
// outcome: acked, or rejected (a suspected duplicate of the Bloom tier).
// Requeued deliveries come back and count when they do. The handler is
// wrapped so that r.Lat gets, per delivery, the time spent in the
// middleware mws outside the handler (see latencies).
func idemqConsume(b testing.TB, r *run, o consumerOpts, h idemq.Handler, mws ...idemq.Middleware) *idemq.Counters {
	if o.Prefetch == 0 {
		o.Prefetch = Prefetch
	}
	var rec idemq.Counters
	var final atomic.Int64
	done := make(chan struct{})
	n := int64(r.N)
	outer := idemq.Middleware(func(next idemq.Handler) idemq.Handler {
		return idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
			sp := &span{}
			sp.enter = time.Now()
			err := next.Handle(withSpan(ctx, sp), d)
			var re *idemq.RequeueError
			if errors.As(err, &re) {
				return err
			}
			r.Lat.add(sp.overhead(time.Now()))
			k := final.Add(1)
			if o.OnFinal != nil {
				o.OnFinal(k)
			}
			if k == n {
				close(done)
			}
			return err
		})
	})
	var recorder idemq.Recorder = &rec
	if o.Metrics != nil {
		recorder = metrics.Tee(&rec, o.Metrics.Consumer(r.Queue, ""))
	}
	c, err := idemq.NewConsumer(idemq.ConsumerConfig{
		Queue: r.Queue, Prefetch: o.Prefetch, Workers: o.Workers, Recorder: recorder,
		Pipeline: idemq.Pipeline{Middleware: append([]idemq.Middleware{outer}, mws...), Guard: o.Guard, Handler: timed(h)},
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- c.Run(ctx) }()
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Minute
	}
	select {
	case <-done:
	case <-time.After(o.Timeout):
		cancel()
		<-runDone
		b.Fatalf("timed out after %v: %d of %d deliveries done", o.Timeout, final.Load(), n)
	}
	cancel() // graceful: flushes the last coalesced ack
	if err := <-runDone; err != nil {
		b.Fatal(err)
	}
	return &rec
}

// span times one delivery through the middleware chain: enter and leave
// are the outermost middleware's, start and end the user handler's.
type span struct {
	enter, start, end time.Time
}

// overhead is the time the delivery spent in the chain outside the user
// handler: all of it when the handler did not run (a suppressed duplicate).
func (s *span) overhead(leave time.Time) time.Duration {
	if s.start.IsZero() {
		return leave.Sub(s.enter)
	}
	return s.start.Sub(s.enter) + leave.Sub(s.end)
}

type spanKey struct{}

func withSpan(ctx context.Context, s *span) context.Context {
	return context.WithValue(ctx, spanKey{}, s)
}

func spanFrom(ctx context.Context) *span {
	s, _ := ctx.Value(spanKey{}).(*span)
	return s
}

// timed wraps the user handler so that its start and end land in the
// delivery's span.
func timed(h idemq.Handler) idemq.Handler {
	if u, ok := h.(untimedHandler); ok {
		return u.Handler
	}
	return idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
		sp := spanFrom(ctx)
		if sp == nil {
			return h.Handle(ctx, d)
		}
		sp.start = time.Now()
		err := h.Handle(ctx, d)
		sp.end = time.Now()
		return err
	})
}

// latencies collects per-delivery overhead samples, safe for concurrent
// use; samples beyond the capacity are dropped.
type latencies struct {
	next atomic.Int64
	d    []time.Duration
}

func newLatencies(n int) *latencies { return &latencies{d: make([]time.Duration, n)} }

func (l *latencies) add(d time.Duration) {
	if i := l.next.Add(1) - 1; i < int64(len(l.d)) {
		l.d[i] = d
	}
}

// report adds p50-us and p99-us when the case recorded samples.
func (l *latencies) report(b *testing.B) {
	n := min(int(l.next.Load()), len(l.d))
	if n == 0 {
		return
	}
	s := append([]time.Duration(nil), l.d[:n]...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	b.ReportMetric(pct(s, 0.50).Seconds()*1e6, "p50-us")
	b.ReportMetric(pct(s, 0.99).Seconds()*1e6, "p99-us")
}

// pct is the p-quantile of sorted samples (nearest rank).
func pct(sorted []time.Duration, p float64) time.Duration {
	return sorted[int(p*float64(len(sorted)-1)+0.5)]
}

// BenchmarkTracingOverhead interleaves the plain idemq-noop consumer with
// the same consumer with metrics and tracing on (the production default
// sampler, ParentBased(TraceIDRatioBased(0.01))), three rounds, the order
// alternating each round, so that each round's ratio compares two runs
// made under the same machine load. docs/OBSERVABILITY.md records the
// median of the three ratios (msgs/s and CPU per message).
func BenchmarkTracingOverhead(b *testing.B) {
	plain := func(b *testing.B, r *run) { idemqConsume(b, r, consumerOpts{}, noop()) }
	observed := func(b *testing.B, r *run) {
		m, err := metrics.New(metrics.Config{})
		if err != nil {
			b.Fatal(err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.01))))
		defer func() { _ = tp.Shutdown(context.Background()) }()
		idemqConsume(b, r, consumerOpts{Metrics: m}, noop(), tracing.Middleware(tp))
	}
	for round := 1; round <= 3; round++ {
		first, second := "plain", "observed"
		ff, sf := plain, observed
		if round%2 == 0 {
			first, second, ff, sf = second, first, sf, ff
		}
		consumeCase(b, fmt.Sprintf("r%d-%s", round, first), 0, ff)
		consumeCase(b, fmt.Sprintf("r%d-%s", round, second), 0, sf)
	}
}
