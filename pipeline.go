package idemq

import (
	"context"
	"errors"
)

// Pipeline is what a [Consumer] runs for each delivery, as data: each part
// has a fixed place, so the order of the layers of defence is enforced
// rather than described.
//
//	Policy      decides what happens after the chain ran (FailurePolicy):
//	            ack, run again, requeue, publish (retry, dead letter), reject;
//	            the consumer carries the decision out
//	Middleware  your layers (metrics, tracing, logging, hooks), first outermost
//	Guard       the dedup guard (claim → … → complete | release)
//	            [handler deadline: HandlerTimeout, the ConsumerTimeout bound]
//	            [Recover: a panic becomes a *PanicError]
//	Handler     the effect: your handler, or an inbox's
//
// The failure policy is not a middleware: nothing can be put outside it,
// so the guard's and the inbox's deferrals and rejections always reach it,
// and the guard is always inside it. Recover is innermost, so every layer
// (the guard releasing its claim, the inbox rolling back) sees a panic as
// an error; a panic in a middleware is caught by the consumer too.
type Pipeline struct {
	// Policy is the failure policy (retry.New). Default [BasePolicy]: no
	// republish, failures rejected, deferrals and outages given back.
	Policy FailurePolicy
	// Middleware wraps the guard and the handler; the first is the
	// outermost. Optional.
	Middleware []Middleware
	// Guard is the dedup layer (dedup.NewGuard). Optional.
	Guard Layer
	// Handler is the effect. Required.
	Handler Handler
}

// Layer is a layer of defence with a fixed place in a [Pipeline] (the dedup
// guard): it wraps the handler below it.
type Layer interface {
	Wrap(next Handler) Handler
}

// WorkerHint is implemented by a [Layer] that needs more concurrent
// deliveries than the consumer's default to keep up: the dedup guard on a
// store that shares one round trip among concurrent calls (the Redis
// store) is as fast as the number of deliveries in flight lets its batches
// be; the batch inbox's batches are as large as the deliveries handed to
// it at once. When [ConsumerConfig.Workers] is unset, the consumer asks
// Pipeline.Guard and Pipeline.Handler and takes the larger suggestion
// (never more than the prefetch window, never less than the default 4).
type WorkerHint interface {
	// SuggestWorkers returns the handler concurrency the layer wants with
	// prefetch deliveries unacked at most; 0: no opinion.
	SuggestWorkers(prefetch int) int
}

// Prober is implemented by a [Layer] that can check the dependency it
// uses (the dedup guard's store, the inbox's database). The consumer adds
// the Probe of Pipeline.Guard and Pipeline.Handler to its breaker's probes
// ([BreakerConfig.Probes]): they decide whether a failure is an outage
// and when a paused consumer resumes. Register probes of your own
// dependencies (an HTTP API the handler calls) in BreakerConfig.Probes.
type Prober interface {
	Probe(ctx context.Context) error
}

// layerProbes returns the probes of the pipeline's layers (see [Prober]).
func (p Pipeline) layerProbes() []func(context.Context) error {
	var out []func(context.Context) error
	for _, l := range []any{p.Guard, p.Handler} {
		if pr, ok := l.(Prober); ok && pr != nil {
			out = append(out, pr.Probe)
		}
	}
	return out
}

// ErrNoHandler is returned for a [Pipeline] without a Handler.
var ErrNoHandler = errors.New("idemq: Pipeline.Handler is required")

// Validate reports a pipeline that cannot run: no handler.
func (p Pipeline) Validate() error {
	if p.Handler == nil {
		return ErrNoHandler
	}
	return nil
}

// chain builds the handler chain below the policy: middleware → guard →
// inner(Recover → handler). inner wraps the recovered handler (the
// consumer's deadline).
func (p Pipeline) chain(inner func(Handler) Handler) Handler {
	h := Recover()(p.Handler)
	if inner != nil {
		h = inner(h)
	}
	if p.Guard != nil {
		h = p.Guard.Wrap(h)
	}
	return Chain(h, p.Middleware...)
}
