// Package tracing carries OpenTelemetry traces across idemq: publish →
// outbox → relay → broker → consume, with W3C trace context (traceparent,
// tracestate) in the AMQP headers.
//
//   - [Sender] wraps a publisher (an *idemq.Publisher, the relay's, the
//     retry policy's): a producer span per publish, its context injected
//     into the message's headers. Its parent is the caller's span, else the
//     context already in the headers — so a relay publishing an outbox row
//     continues the trace of the transaction that wrote it.
//   - [OutboxMessage] stores the caller's trace context in an outbox row's
//     headers at insert time.
//   - [Middleware] (Pipeline.Middleware) starts a consumer span per
//     delivery, child of the context in its headers, with messaging
//     attributes and the outcome (processed, duplicate and its layer, the
//     error). Handlers start their own spans from their context.
//
// Everything takes a trace.TracerProvider; nil means
// otel.GetTracerProvider(), a no-op unless the application installed an
// SDK. The SDK is used only by tests and examples.
//
// In production sample a ratio of new traces and follow the parent's
// decision, sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.01)): the
// middleware then starts no span for a delivery whose upstream did not
// sample, and sets no attributes on a span the sampler dropped (see
// docs/OBSERVABILITY.md for the cost per delivery).
package tracing
