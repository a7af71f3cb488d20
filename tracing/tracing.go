package tracing

import (
	"context"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
)

// ScopeName is the instrumentation scope of idemq's spans.
const ScopeName = "github.com/idemq/idemq/tracing"

// Attribute keys (OpenTelemetry messaging semantic conventions, and
// idemq's own).
const (
	AttrSystem      = attribute.Key("messaging.system")
	AttrDestination = attribute.Key("messaging.destination.name")
	AttrOperation   = attribute.Key("messaging.operation.type")
	AttrMessageID   = attribute.Key("messaging.message.id")
	AttrRoutingKey  = attribute.Key("messaging.rabbitmq.destination.routing_key")
	AttrGroup       = attribute.Key("messaging.consumer.group.name")
	AttrRedelivered = attribute.Key("idemq.redelivered")
	AttrAttempt     = attribute.Key("idemq.attempt")
	AttrOutcome     = attribute.Key("idemq.outcome")
	AttrDupLayer    = attribute.Key("idemq.duplicate.layer")
)

// propagator is W3C trace context; no global.
var propagator = propagation.TraceContext{}

func tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(ScopeName)
}

// headerCarrier adapts an amqp.Table to a TextMapCarrier.
type headerCarrier amqp.Table

func (h headerCarrier) Get(key string) string {
	if v, ok := h[key].(string); ok {
		return v
	}
	return ""
}
func (h headerCarrier) Set(key, value string) { h[key] = value }
func (h headerCarrier) Keys() []string {
	out := make([]string, 0, len(h))
	for k := range h {
		out = append(out, k)
	}
	return out
}

// Inject returns a copy of headers with ctx's trace context (traceparent,
// tracestate) set; headers itself is not modified. Without a valid span in
// ctx it returns headers unchanged.
func Inject(ctx context.Context, headers amqp.Table) amqp.Table {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return headers
	}
	out := make(amqp.Table, len(headers)+2)
	for k, v := range headers {
		out[k] = v
	}
	propagator.Inject(ctx, headerCarrier(out))
	return out
}

// Extract returns ctx with the remote span context carried in headers.
func Extract(ctx context.Context, headers amqp.Table) context.Context {
	if headers == nil {
		return ctx
	}
	return propagator.Extract(ctx, headerCarrier(headers))
}

// OutboxMessage returns m with ctx's trace context in its headers, so the
// relay's publish of the row continues ctx's trace (insert it with the
// outbox as usual).
func OutboxMessage(ctx context.Context, m outbox.Message) outbox.Message {
	m.Headers = Inject(ctx, m.Headers)
	return m
}

// Sender wraps s with a producer span per publish and injects that span's
// context into the published headers. The span's attributes are set only
// when it is recording (sampled).
func Sender(s idemq.Sender, tp trace.TracerProvider) idemq.Sender {
	return &sender{s: s, t: tracer(tp)}
}

type sender struct {
	s     idemq.Sender
	t     trace.Tracer
	names spanNames
}

var (
	producerOpts = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer)}
	consumerOpts = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
)

func (s *sender) Publish(ctx context.Context, m idemq.Message) error {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		// The relay (no span of its own): continue the trace stored with
		// the row.
		ctx = Extract(ctx, m.Headers)
	}
	dest := m.Exchange
	if dest == "" {
		dest = m.RoutingKey
	}
	ctx, span := s.t.Start(ctx, s.names.get("publish ", dest), producerOpts...)
	defer span.End()
	if span.IsRecording() {
		span.SetAttributes(AttrSystem.String("rabbitmq"), AttrOperation.String("send"),
			AttrDestination.String(dest), AttrRoutingKey.String(m.RoutingKey), AttrMessageID.String(m.ID))
	}
	m.Headers = Inject(ctx, m.Headers)
	err := s.s.Publish(ctx, m)
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return err
}

// spanNames caches "<verb><destination>" span names: one allocation per
// destination, not one per message. Destinations are a bounded set
// (queues, exchanges).
type spanNames struct {
	m sync.Map // string(dest) -> string(name)
}

func (n *spanNames) get(verb, dest string) string {
	if v, ok := n.m.Load(dest); ok {
		return v.(string)
	}
	name := verb + dest
	n.m.Store(dest, name)
	return name
}

// Middleware starts a consumer span per delivery ("process <queue>"),
// child of the trace context in its headers, and records the outcome.
//
// Its cost follows the sampling decision, so that a production sampler
// (ParentBased(TraceIDRatioBased(r)), see the package doc) keeps it near
// zero for the deliveries it does not sample:
//
//   - a delivery whose traceparent says "not sampled" gets no span of its
//     own: the upstream decided (parent-based sampling). Its handler's
//     spans and publishes carry that unsampled context on;
//   - a span the sampler drops records nothing: attributes, outcome and
//     error are set only on a recording span;
//   - no allocation per delivery beyond the tracer's own (span names are
//     cached per queue, start options are shared).
func Middleware(tp trace.TracerProvider) idemq.Middleware {
	t := tracer(tp)
	var names spanNames
	return func(next idemq.Handler) idemq.Handler {
		return idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
			ctx = Extract(ctx, d.Headers)
			if sc := trace.SpanContextFromContext(ctx); sc.IsValid() && !sc.IsSampled() {
				return next.Handle(ctx, d)
			}
			ctx, span := t.Start(ctx, names.get("process ", d.Queue), consumerOpts...)
			if !span.IsRecording() {
				err := next.Handle(ctx, d)
				span.End()
				return err
			}
			defer span.End()
			span.SetAttributes(AttrSystem.String("rabbitmq"), AttrOperation.String("process"),
				AttrDestination.String(d.Queue), AttrGroup.String(d.Group), AttrMessageID.String(d.MessageID),
				AttrRoutingKey.String(d.RoutingKey), AttrRedelivered.Bool(d.Redelivered))
			if a, ok := d.Headers[idemq.HeaderAttempt]; ok {
				if n, ok := a.(int32); ok {
					span.SetAttributes(AttrAttempt.Int(int(n)))
				} else if n, ok := a.(int64); ok {
					span.SetAttributes(AttrAttempt.Int64(n))
				}
			}
			err := next.Handle(ctx, d)
			switch {
			case err == nil:
				span.SetAttributes(AttrOutcome.String("processed"))
			case idemq.IsDuplicate(err):
				span.SetAttributes(AttrOutcome.String("duplicate"), AttrDupLayer.String(idemq.DuplicateLayer(err)))
			default:
				span.SetAttributes(AttrOutcome.String("failed"))
				span.RecordError(err)
				span.SetStatus(codes.Error, err.Error())
			}
			return err
		})
	}
}
