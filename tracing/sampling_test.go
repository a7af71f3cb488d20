package tracing_test

import (
	"context"
	"errors"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/tracing"
)

const (
	sampledParent   = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	unsampledParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
)

func delivery(traceparent string) *idemq.Delivery {
	d := &idemq.Delivery{MessageID: "m-1", Queue: "orders", Group: "billing", RoutingKey: "orders"}
	if traceparent != "" {
		d.Headers = amqp.Table{"traceparent": traceparent}
	}
	return d
}

// The span a delivery gets follows the sampling decision: none for an
// unsampled parent, a non-recording one (no attributes) for a dropped
// root, a full one (attributes, outcome, error) when sampled. The handler
// always sees the trace it belongs to.
func TestMiddlewareFollowsSampling(t *testing.T) {
	parentTrace, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	for _, tc := range []struct {
		name        string
		sampler     sdktrace.Sampler
		traceparent string
		handlerErr  error
		wantSpans   int
		wantTrace   bool // the handler's context is in the parent's trace
		wantSampled bool // the handler's context is sampled
	}{
		{"unsampled parent: no span of its own", sdktrace.ParentBased(sdktrace.AlwaysSample()), unsampledParent, nil, 0, true, false},
		{"sampled parent", sdktrace.ParentBased(sdktrace.NeverSample()), sampledParent, nil, 1, true, true},
		{"root dropped by the ratio", sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0)), "", nil, 0, false, false},
		{"root sampled by the ratio", sdktrace.ParentBased(sdktrace.TraceIDRatioBased(1)), "", nil, 1, false, true},
		{"sampled, failing handler", sdktrace.AlwaysSample(), sampledParent, errors.New("boom"), 1, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(tc.sampler), sdktrace.WithSpanProcessor(rec))
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			var seen trace.SpanContext
			h := tracing.Middleware(tp)(idemq.HandlerFunc(func(ctx context.Context, _ *idemq.Delivery) error {
				seen = trace.SpanContextFromContext(ctx)
				return tc.handlerErr
			}))
			if err := h.Handle(context.Background(), delivery(tc.traceparent)); !errors.Is(err, tc.handlerErr) {
				t.Fatalf("Handle: %v, want %v", err, tc.handlerErr)
			}
			spans := rec.Ended()
			if len(spans) != tc.wantSpans {
				t.Fatalf("%d spans recorded, want %d", len(spans), tc.wantSpans)
			}
			if got := seen.TraceID() == parentTrace; got != tc.wantTrace {
				t.Errorf("handler in trace %s: in the parent's = %v, want %v", seen.TraceID(), got, tc.wantTrace)
			}
			if seen.IsSampled() != tc.wantSampled {
				t.Errorf("handler context sampled = %v, want %v", seen.IsSampled(), tc.wantSampled)
			}
			if tc.wantSpans == 0 {
				return
			}
			s := spans[0]
			if s.Name() != "process orders" || s.SpanKind() != trace.SpanKindConsumer {
				t.Errorf("span %q kind %v, want \"process orders\" consumer", s.Name(), s.SpanKind())
			}
			attrs := map[string]string{}
			for _, a := range s.Attributes() {
				attrs[string(a.Key)] = a.Value.Emit()
			}
			want := map[string]string{"messaging.system": "rabbitmq", "messaging.destination.name": "orders",
				"messaging.consumer.group.name": "billing", "messaging.message.id": "m-1", "idemq.outcome": "processed"}
			if tc.handlerErr != nil {
				want["idemq.outcome"] = "failed"
				if len(s.Events()) == 0 {
					t.Errorf("failing handler: no error event on the span")
				}
			}
			for k, v := range want {
				if attrs[k] != v {
					t.Errorf("attribute %s = %q, want %q (all: %v)", k, attrs[k], v, attrs)
				}
			}
		})
	}
}

// Allocations per delivery by the middleware (the handler itself
// allocates nothing). They bound what tracing costs a consumer that does
// not sample: the context of a no-op span without an SDK, the extracted parent's context
// for an unsampled parent, the SDK's non-recording span for a dropped root.
func TestMiddlewareAllocations(t *testing.T) {
	never := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.NeverSample())))
	t.Cleanup(func() { _ = never.Shutdown(context.Background()) })
	for _, tc := range []struct {
		name        string
		tp          trace.TracerProvider
		traceparent string
		max         float64
	}{
		{"no-op provider, no parent", noop.NewTracerProvider(), "", 1},
		{"SDK, unsampled parent", never, unsampledParent, 2},
		{"SDK, root dropped", never, "", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := tracing.Middleware(tc.tp)(idemq.HandlerFunc(func(context.Context, *idemq.Delivery) error { return nil }))
			d := delivery(tc.traceparent)
			ctx := context.Background()
			got := testing.AllocsPerRun(200, func() { _ = h.Handle(ctx, d) })
			if got > tc.max {
				t.Errorf("%.1f allocations per delivery, want at most %.0f", got, tc.max)
			}
		})
	}
}

// BenchmarkMiddleware: the middleware's cost per delivery by sampling
// decision (go test -bench Middleware -benchmem ./tracing).
func BenchmarkMiddleware(b *testing.B) {
	all := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	ratio := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.01))))
	b.Cleanup(func() { _ = all.Shutdown(context.Background()); _ = ratio.Shutdown(context.Background()) })
	for _, bc := range []struct {
		name        string
		tp          trace.TracerProvider
		traceparent string
	}{
		{"noop", noop.NewTracerProvider(), ""},
		{"always/root", all, ""},
		{"always/sampled-parent", all, sampledParent},
		{"ratio-1pct/root", ratio, ""},
		{"ratio-1pct/unsampled-parent", ratio, unsampledParent},
	} {
		b.Run(bc.name, func(b *testing.B) {
			h := tracing.Middleware(bc.tp)(idemq.HandlerFunc(func(context.Context, *idemq.Delivery) error { return nil }))
			d := delivery(bc.traceparent)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				_ = h.Handle(ctx, d)
			}
		})
	}
}
