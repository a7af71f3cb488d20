package idemq

import (
	"context"
	"runtime/debug"
)

// Handler processes one delivery. A nil error acks it; any other error goes
// back up the middleware chain to the failure policy (see [Permanent],
// [Reject], [Requeue]).
type Handler interface {
	Handle(ctx context.Context, d *Delivery) error
}

// HandlerFunc adapts a function to [Handler].
type HandlerFunc func(ctx context.Context, d *Delivery) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, d *Delivery) error { return f(ctx, d) }

// Middleware wraps a handler: metrics, tracing, logging — your layers. The
// layers of defence have fixed places of their own in a [Pipeline] (the
// failure policy outside everything, the dedup guard inside the middleware,
// the inbox as the handler).
type Middleware func(Handler) Handler

// Chain wraps h in mws; the first middleware is the outermost, so
// Chain(h, a, b) runs a → b → h.
func Chain(h Handler, mws ...Middleware) Handler {
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	return h
}

// Recover turns a panic in the wrapped handler into a [*PanicError].
// The consumer installs it innermost, around [Pipeline].Handler, so every
// layer above sees a panic as an error.
func Recover() Middleware {
	return func(next Handler) Handler {
		return HandlerFunc(func(ctx context.Context, d *Delivery) (err error) {
			defer func() {
				if v := recover(); v != nil {
					err = &PanicError{Value: v, Stack: debug.Stack()}
				}
			}()
			return next.Handle(ctx, d)
		})
	}
}
