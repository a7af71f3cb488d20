package tracing_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/tracing"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// One trace from a business span through an outbox row's headers, the
// relay's publish (no span in its context), the broker, the consumer's
// span and the handler's own span; a resend is a duplicate in the same
// trace, its layer recorded.
func TestTraceAcrossOutboxPublishConsume(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	url := testenv.RequireAMQP(t)
	q := testenv.Queue(t, nil)

	// The business transaction writes an outbox row with its trace context.
	bctx, business := tp.Tracer("test").Start(context.Background(), "place order")
	row := tracing.OutboxMessage(bctx, outbox.Message{ID: "order-1", RoutingKey: q, Body: []byte("{}")})
	business.End()
	if row.Headers["traceparent"] == nil {
		t.Fatalf("outbox row headers carry no traceparent: %v", row.Headers)
	}

	pub, err := idemq.NewPublisher(idemq.PublisherConfig{URL: url, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	send := tracing.Sender(pub, tp)
	// The relay publishes the row on a context of its own (no span).
	relayed := idemq.Message{ID: row.ID, RoutingKey: row.RoutingKey, Body: row.Body, Headers: row.Headers}
	for range 2 { // the second is a resend: a duplicate
		if err := send.Publish(context.Background(), relayed); err != nil {
			t.Fatal(err)
		}
	}

	handled := make(chan trace.SpanContext, 2)
	guard, err := dedup.NewGuard(dedup.Config{Store: dedup.NewMemory(dedup.MemoryConfig{}), Prefix: q})
	if err != nil {
		t.Fatal(err)
	}
	c, err := idemq.NewConsumer(idemq.ConsumerConfig{URL: url, Queue: q, Logger: quiet(), Workers: 1,
		Pipeline: idemq.Pipeline{Middleware: []idemq.Middleware{tracing.Middleware(tp)}, Guard: guard,
			Handler: idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
				_, span := tp.Tracer("test").Start(ctx, "handle order")
				defer span.End()
				handled <- span.SpanContext()
				return nil
			})}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	var hs trace.SpanContext
	select {
	case hs = <-handled:
	case <-time.After(time.Minute):
		t.Fatal("handler did not run")
	}
	testenv.Eventually(t, time.Minute, "two consumer spans ended", func() bool {
		n := 0
		for _, s := range rec.Ended() {
			if s.SpanKind() == trace.SpanKindConsumer {
				n++
			}
		}
		return n == 2
	})

	want := business.SpanContext().TraceID()
	if hs.TraceID() != want {
		t.Fatalf("handler span in trace %s, want the business trace %s", hs.TraceID(), want)
	}
	byName := map[string]int{}
	outcomes := map[string]string{}
	for _, s := range rec.Ended() {
		if s.SpanContext().TraceID() != want {
			t.Errorf("span %q in trace %s, want %s", s.Name(), s.SpanContext().TraceID(), want)
		}
		byName[s.Name()]++
		if s.SpanKind() == trace.SpanKindConsumer {
			for _, a := range s.Attributes() {
				if a.Key == tracing.AttrOutcome || a.Key == tracing.AttrDupLayer {
					outcomes[string(a.Key)+"="+a.Value.AsString()] = s.Name()
				}
			}
			if !s.Parent().IsRemote() {
				t.Errorf("consumer span %q has a local parent, want the publish span from the headers", s.Name())
			}
		}
	}
	for name, n := range map[string]int{"place order": 1, "publish " + q: 2, "process " + q: 2, "handle order": 1} {
		if byName[name] != n {
			t.Errorf("%d spans named %q, want %d (all: %v)", byName[name], name, n, byName)
		}
	}
	for _, o := range []string{"idemq.outcome=processed", "idemq.outcome=duplicate", "idemq.duplicate.layer=guard"} {
		if _, ok := outcomes[o]; !ok {
			t.Errorf("no consumer span with %s (got %v)", o, outcomes)
		}
	}
}

// Without a TracerProvider (the global no-op) nothing is injected.
func TestNoopWithoutProvider(t *testing.T) {
	m := tracing.OutboxMessage(context.Background(), outbox.Message{ID: "x"})
	if m.Headers != nil {
		t.Fatalf("headers %v, want none", m.Headers)
	}
}

// A delivery given back and run again stays in its trace: both consumer
// spans are children of the one publish span.
func TestRetriedDeliverySharesTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	url := testenv.RequireAMQP(t)
	q := testenv.Queue(t, nil)
	pub, err := idemq.NewPublisher(idemq.PublisherConfig{URL: url, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	pctx, root := tp.Tracer("test").Start(context.Background(), "request")
	if err := tracing.Sender(pub, tp).Publish(pctx, idemq.Message{ID: "retry-1", RoutingKey: q, Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	root.End()

	runs := make(chan struct{}, 4)
	c, err := idemq.NewConsumer(idemq.ConsumerConfig{URL: url, Queue: q, Logger: quiet(), Workers: 1,
		Pipeline: idemq.Pipeline{Middleware: []idemq.Middleware{tracing.Middleware(tp)},
			Handler: idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
				runs <- struct{}{}
				if !d.Redelivered {
					return idemq.Requeue(0, "test", errors.New("first run fails"))
				}
				return nil
			})}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	testenv.Eventually(t, time.Minute, "two consumer spans ended", func() bool {
		n := 0
		for _, s := range rec.Ended() {
			if s.SpanKind() == trace.SpanKindConsumer {
				n++
			}
		}
		return n == 2
	})
	var publish trace.SpanContext
	for _, s := range rec.Ended() {
		if s.SpanKind() == trace.SpanKindProducer {
			publish = s.SpanContext()
		}
	}
	for _, s := range rec.Ended() {
		if s.SpanContext().TraceID() != root.SpanContext().TraceID() {
			t.Errorf("span %q in trace %s, want %s", s.Name(), s.SpanContext().TraceID(), root.SpanContext().TraceID())
		}
		if s.SpanKind() == trace.SpanKindConsumer && s.Parent().SpanID() != publish.SpanID() {
			t.Errorf("consumer span's parent %s, want the publish span %s", s.Parent().SpanID(), publish.SpanID())
		}
	}
}
