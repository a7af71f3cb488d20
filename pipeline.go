package idemq

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/idemq/idemq/backoff"
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
var ErrNoHandler = ConfigErrorClass("idemq: Pipeline.Handler is required")

// ErrWindowTooShort is returned (as a [*WindowError]) for a [Pipeline]
// whose dedup window is shorter than its policy's retry horizon.
var ErrWindowTooShort = ConfigErrorClass("idemq: dedup window shorter than the retry horizon")

// RetryHorizoner is implemented by a [FailurePolicy] whose retries of a
// message end a bounded time after its first delivery (retry.Policy).
type RetryHorizoner interface {
	// RetryHorizon is how long after its first delivery a message's last
	// attempt can start.
	RetryHorizon() time.Duration
}

// Windowed is implemented by a [Layer] or [Handler] that remembers the
// messages it applied for a limited time (the dedup guard's window, the
// inbox's retention).
type Windowed interface {
	// DedupWindow is how long an applied message is remembered.
	DedupWindow() time.Duration
}

// WindowError says which part of a [Pipeline] forgets a message before
// its policy's last retry can arrive. It matches [ErrWindowTooShort].
type WindowError struct {
	Part    string        // "Guard" or "Handler"
	Window  time.Duration // the part's dedup window
	Horizon time.Duration // the policy's retry horizon
}

func (e *WindowError) Error() string {
	return fmt.Sprintf("idemq: Pipeline.%s remembers applied messages for %v, less than the retry horizon %v of Pipeline.Policy: "+
		"a retry arriving after %v would find no record and apply its effect a second time; "+
		"raise the window to at least %v plus how long a dead letter may wait before it is replayed",
		e.Part, e.Window, e.Horizon, e.Window, e.Horizon)
}

func (e *WindowError) Unwrap() error { return ErrWindowTooShort }

// Validate reports a pipeline that cannot run (no Handler) or that would
// apply a retried message twice: a part with a dedup window ([Windowed])
// must remember messages at least as long as the policy retries them
// ([RetryHorizoner]).
func (p Pipeline) Validate() error {
	if p.Handler == nil {
		return ErrNoHandler
	}
	rh, ok := p.Policy.(RetryHorizoner)
	if !ok {
		return nil
	}
	horizon := rh.RetryHorizon()
	for _, part := range []struct {
		name string
		v    any
	}{{"Guard", p.Guard}, {"Handler", p.Handler}} {
		if w, ok := part.v.(Windowed); ok && w.DedupWindow() > 0 && w.DedupWindow() < horizon {
			return &WindowError{Part: part.name, Window: w.DedupWindow(), Horizon: horizon}
		}
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

// Decide runs p for d the way a [Consumer] does and returns the decision
// the consumer's executor would carry out: the failure policy admits d,
// the chain (middleware → guard → Recover → handler) runs as many times as
// the policy asks (quick retries), and the policy decides. It carries
// nothing out — no publish, no ack, no nack — and it is the consumer's own
// decision loop, not a copy of it. It is the seam a test kit (idemqtest)
// or an adapter drives a pipeline through without a broker.
//
// What belongs to the consumer rather than to the pipeline is not applied:
// the handler deadline (HandlerTimeout, the ConsumerTimeout bound), the
// breaker, the counters (put a Recorder in ctx with [WithRecorder] for the
// layers' own), and the ID decision (call [IDConfig.Apply] on d first, or
// d.ID() reads its MessageID). A nil Policy is [BasePolicy]; a pipeline
// without a Handler is rejected with [ErrNoHandler].
func (p Pipeline) Decide(ctx context.Context, d *Delivery) Decision {
	policy := p.Policy
	if policy == nil {
		policy = BasePolicy{}
	}
	if err := p.Validate(); err != nil {
		return Decision{Action: ActionReject, Outcome: OutcomeRejected, Reason: ReasonOf(err), Err: err}
	}
	h := p.chain(nil)
	return decide(ctx, policy, d, func(ctx context.Context, d *Delivery) error {
		return runChain(ctx, h, d)
	}, nil, nil)
}

// decide is the consumer's decision loop, shared with [Pipeline.Decide]:
// the policy admits d, run runs the chain, ran (optional) sees every run's
// error, last (optional) the error of the run the final decision was taken
// on.
func decide(ctx context.Context, policy FailurePolicy, d *Delivery, run func(context.Context, *Delivery) error, ran, last func(error)) Decision {
	if dec, ok := policy.Admit(d); !ok {
		return dec
	}
	for n := 1; ; n++ {
		err := run(ctx, d)
		if ran != nil {
			ran(err)
		}
		dec := policy.Decide(d, Run{Err: err, N: n, Stopping: ctx.Err() != nil})
		if dec.Action == ActionRunAgain && backoff.Sleep(ctx, dec.Delay) != nil {
			// Stopping during the pause: decide without running again.
			dec = policy.Decide(d, Run{Err: err, N: n, Stopping: true})
		}
		if dec.Action != ActionRunAgain {
			if last != nil {
				last(err)
			}
			return dec
		}
	}
}

// runChain runs h once, a panic becoming a [*PanicError].
func runChain(ctx context.Context, h Handler, d *Delivery) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return h.Handle(ctx, d)
}
