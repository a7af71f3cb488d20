package idemq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Handler time limits, and the broker's consumer_timeout.
//
// RabbitMQ closes a channel (PRECONDITION_FAILED, "delivery acknowledgement
// timed out") when one of its deliveries stays unacknowledged for longer
// than consumer_timeout, and redelivers every unacked delivery of that
// channel — while the first handler may still run. The consumer bounds each
// handler below that timeout, so a slow handler is cancelled and its
// delivery given back through the failure policy before the broker acts.

// DefaultConsumerTimeout is RabbitMQ's default consumer_timeout (since 3.8.15).
const DefaultConsumerTimeout = 30 * time.Minute

// Counter names for handler time limits.
const (
	// CountHandlerTimeouts: handlers whose context reached its deadline
	// (HandlerTimeout or the ConsumerTimeout bound) and that failed.
	CountHandlerTimeouts = "handler_timeouts"
	// CountStuckHandlers: deliveries still being handled after
	// StuckHandlerAfter (counted once each).
	CountStuckHandlers = "stuck_handlers"
	// CountExpiredDeliveries: deliveries given back without running
	// because they waited in the client until too close to the
	// ConsumerTimeout bound.
	CountExpiredDeliveries = "expired_deliveries"
)

// handlerTimeoutCause is the cause of a handler context cancelled at its
// deadline: ErrHandlerTimeout and the limit. It is made for every delivery,
// so it is formatted only when read.
type handlerTimeoutCause time.Duration

func (c handlerTimeoutCause) Error() string {
	return fmt.Sprintf("%s after %v", ErrHandlerTimeout.Error(), time.Duration(c))
}

func (c handlerTimeoutCause) Unwrap() error { return ErrHandlerTimeout }

// ErrHandlerTimeout is the cause of a handler context cancelled at its
// deadline (see ConsumerConfig.HandlerTimeout and ConsumerTimeout). A
// handler can test context.Cause(ctx) for it; a failed handler's error
// reaches the failure policy as a [*HandlerTimeoutError].
var ErrHandlerTimeout = errors.New("idemq: handler timed out")

// HandlerTimeoutError is what a handler's error becomes when the handler
// failed after its context reached its deadline. It is an ordinary failed
// attempt for the failure policy (retried with delay, then dead-lettered),
// not a shutdown: the delivery is not acked, the dedup guard releases its
// claim and the inbox rolls back, so the redelivery applies it once.
type HandlerTimeoutError struct {
	// Limit is how long the handler was given.
	Limit time.Duration
	// ConsumerTimeout says the limit came from the broker's consumer
	// timeout bound rather than from HandlerTimeout.
	ConsumerTimeout bool
	// Err is what the handler returned.
	Err error
}

func (e *HandlerTimeoutError) Error() string {
	return fmt.Sprintf("%s after %v (%s): %s", ErrHandlerTimeout.Error(), e.Limit, e.source(), errString(e.Err))
}

func (e *HandlerTimeoutError) source() string {
	if e.ConsumerTimeout {
		return "bounded below the broker's consumer_timeout"
	}
	return "HandlerTimeout"
}

// Unwrap returns [ErrHandlerTimeout] and the handler's error.
func (e *HandlerTimeoutError) Unwrap() []error { return []error{ErrHandlerTimeout, e.Err} }

// timeouts are the normalized handler limits of a consumer.
type timeouts struct {
	handler time.Duration // 0: none of its own
	broker  time.Duration // the broker's consumer_timeout; 0: none
	margin  time.Duration // handlers end this long before broker does
	stuck   time.Duration // warn after; 0: never
}

func (cfg *ConsumerConfig) timeouts() timeouts {
	t := timeouts{handler: cfg.HandlerTimeout}
	if cfg.ConsumerTimeout > 0 {
		t.broker, t.margin = cfg.ConsumerTimeout, cfg.ConsumerTimeoutMargin
	}
	if cfg.StuckHandlerAfter > 0 {
		t.stuck = cfg.StuckHandlerAfter
	}
	return t
}

// timeouts are the consumer's bounds: its configuration, with the
// broker's consumer timeout for the queue when the management API showed
// a shorter one (limit.go); the margin then stays below a quarter of it.
func (c *Consumer) timeouts() timeouts {
	t := c.cfg.timeouts()
	if q := time.Duration(c.queueTimeout.Load()); q > 0 && (t.broker <= 0 || q < t.broker) {
		t.broker = q
		if t.margin <= 0 || t.margin > q/4 {
			t.margin = q / 4
		}
	}
	return t
}

// bound is when handlers of a delivery received at receivedAt must be done
// by: ConsumerTimeout minus the margin after it arrived. ok is false when
// there is no broker timeout.
func (t timeouts) bound(receivedAt time.Time) (at time.Time, ok bool) {
	if t.broker <= 0 || receivedAt.IsZero() {
		return time.Time{}, false
	}
	return receivedAt.Add(t.broker - t.margin), true
}

// deadline wraps the user's handler (innermost, inside every middleware):
// its context ends at min(start+HandlerTimeout, the ConsumerTimeout bound).
// The middlewares around it (failure policy, dedup guard, inbox) keep a
// live context, so they can release the claim, roll back and republish
// after a timeout.
func (c *Consumer) deadline(h Handler) Handler {
	if t := c.timeouts(); t.handler <= 0 && t.broker <= 0 && c.mgmt == nil {
		return h
	}
	return HandlerFunc(func(ctx context.Context, d *Delivery) error {
		t := c.timeouts() // per delivery: the broker's may have been read since
		start := time.Now()
		var at time.Time
		fromBroker := false
		if t.handler > 0 {
			at = start.Add(t.handler)
		}
		if b, ok := t.bound(d.ReceivedAt); ok && (at.IsZero() || b.Before(at)) {
			at, fromBroker = b, true
		}
		if at.IsZero() {
			return h.Handle(ctx, d)
		}
		limit := at.Sub(start)
		if limit <= 0 {
			// The bound has passed (a quick retry after a timeout): do
			// not start work that would be cut at once.
			return &HandlerTimeoutError{Limit: 0, ConsumerTimeout: fromBroker, Err: context.DeadlineExceeded}
		}
		hctx := &handlerContext{parent: ctx, at: at, limit: limit}
		defer hctx.end()
		err := h.Handle(hctx, d)
		if err == nil || hctx.Err() == nil || ctx.Err() != nil {
			// Success (even a late one: the effect is applied, ack it),
			// a failure of its own, or the consumer's context ended
			// (shutdown, lost channel: not the handler's fault).
			return err
		}
		RecorderFrom(ctx).Add(CountHandlerTimeouts, 1)
		c.log.Warn("idemq: handler timed out; its context was cancelled and the delivery goes to the failure policy",
			"message_id", d.MessageID, "delivery_tag", d.DeliveryTag, "limit", limit,
			"consumer_timeout_bound", fromBroker, "err", err)
		return &HandlerTimeoutError{Limit: limit, ConsumerTimeout: fromBroker, Err: err}
	})
}

// expired decides to give back, without running it, a delivery that is
// no longer worth running: the consumer is stopping (its context ended),
// or it waited in the client until less than one margin is left before
// the ConsumerTimeout bound (a prefetch much larger than the workers can
// handle in time). ok is false when the delivery should run; the
// executor settles the decision.
func (c *Consumer) expired(ctx context.Context, j job) (dec Decision, ok bool) {
	giveBack := Decision{Action: ActionRequeue, Outcome: OutcomeDeferred, Reason: "expired"}
	if ctx.Err() != nil {
		// Shutdown past ShutdownTimeout, or the channel is gone: give it
		// back (a no-op on a dead channel: the broker redelivers).
		return giveBack, true
	}
	t := c.timeouts()
	b, ok := t.bound(j.del.ReceivedAt)
	if !ok || time.Until(b) > t.margin {
		return Decision{}, false
	}
	c.rec.Add(CountExpiredDeliveries, 1)
	c.log.Warn("idemq: delivery waited in the consumer too close to the broker's consumer_timeout; given back without running (lower Prefetch or raise Workers)",
		"message_id", j.del.MessageID, "delivery_tag", j.d.DeliveryTag,
		"waited", time.Since(j.del.ReceivedAt).Round(time.Millisecond), "consumer_timeout", t.broker)
	return giveBack, true
}

// watchdog logs handlers that run long: once when a delivery has been in a
// worker's hands for StuckHandlerAfter, again at every doubling of that,
// and once when it nears the ConsumerTimeout bound.
type watchdog struct {
	c *Consumer
	t timeouts

	mu       sync.Mutex
	inflight map[*Delivery]watched
}

type watched struct {
	start     time.Time
	nextWarn  time.Duration // age of the next stuck warning
	nearTold  bool
	stuckSeen bool
}

func newWatchdog(c *Consumer) *watchdog {
	return &watchdog{c: c, t: c.cfg.timeouts(), inflight: map[*Delivery]watched{}}
}

func (w *watchdog) enabled() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.t.stuck > 0 || w.t.broker > 0
}

// setTimeouts replaces the bounds (the broker's consumer timeout read
// for the queue). The check period set at start stays.
func (w *watchdog) setTimeouts(t timeouts) {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.t = t
	w.mu.Unlock()
}

// period is how often the watchdog looks: a quarter of the shortest
// threshold, between 5ms and 1s.
func (w *watchdog) period() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := time.Second
	if w.t.stuck > 0 {
		p = min(p, w.t.stuck/4)
	}
	if w.t.broker > 0 {
		p = min(p, w.t.margin/4)
	}
	return max(p, 5*time.Millisecond)
}

// track records d as being handled until the returned func is called.
func (w *watchdog) track(d *Delivery) (done func()) {
	if !w.enabled() {
		return func() {}
	}
	w.mu.Lock()
	w.inflight[d] = watched{start: time.Now(), nextWarn: w.t.stuck}
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		delete(w.inflight, d)
		w.mu.Unlock()
	}
}

// run checks the handlers in flight every period until ctx ends.
// It keeps running while it has nothing to watch: a consumer timeout read
// from the broker later (setTimeouts) may give it something.
func (w *watchdog) run(ctx context.Context) {
	tk := time.NewTicker(w.period())
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tk.C:
			if w.enabled() {
				w.check(now)
			}
		}
	}
}

type warning struct {
	d       *Delivery
	age     time.Duration
	near    bool
	first   bool
	cancels time.Duration
}

func (w *watchdog) check(now time.Time) {
	var warns []warning
	w.mu.Lock()
	broker := w.t.broker
	for d, s := range w.inflight {
		age := now.Sub(s.start)
		changed := false
		if w.t.stuck > 0 && age >= s.nextWarn {
			warns = append(warns, warning{d: d, age: age, first: !s.stuckSeen})
			s.stuckSeen = true
			for s.nextWarn <= age {
				s.nextWarn *= 2
			}
			changed = true
		}
		if b, ok := w.t.bound(d.ReceivedAt); ok && !s.nearTold {
			// Near: within a fifth of the bound (at least one margin).
			if left := b.Sub(now); left <= max((w.t.broker-w.t.margin)/5, w.t.margin) {
				warns = append(warns, warning{d: d, age: age, near: true, cancels: left})
				s.nearTold = true
				changed = true
			}
		}
		if changed {
			w.inflight[d] = s
		}
	}
	w.mu.Unlock()
	for _, wn := range warns {
		if wn.near {
			w.c.log.Warn("idemq: handler nears the broker's consumer_timeout; its context is cancelled before the broker would close the channel",
				"message_id", wn.d.MessageID, "delivery_tag", wn.d.DeliveryTag, "age", wn.age.Round(time.Millisecond),
				"cancelled_in", max(wn.cancels, 0).Round(time.Millisecond), "consumer_timeout", broker)
			continue
		}
		if wn.first {
			w.c.rec.Add(CountStuckHandlers, 1)
		}
		w.c.log.Warn("idemq: handler still running (stuck?)",
			"message_id", wn.d.MessageID, "delivery_tag", wn.d.DeliveryTag, "age", wn.age.Round(time.Millisecond),
			"redelivered", wn.d.Redelivered)
	}
}

// handlerContext is the handler's context under a deadline: done at its
// deadline (HandlerTimeout or the ConsumerTimeout bound), when its parent
// is, or once the handler has returned — context.WithDeadlineCause under
// the parent, cancelled when the handler returns.
//
// It is made for every delivery, so it is lazy: the timer context behind
// it (a timer, and a registration with the parent under the parent's
// lock) is made only when someone asks for Done, or asks anything once
// the deadline has passed or the handler has returned. Until then,
// Deadline and Err answer from the deadline itself, so a handler that
// never waits on Done (or that hands only the deadline to its I/O, as
// net.Conn deadlines do) costs one allocation.
//
// It asks its parent first whenever it is asked whether it is done. A
// parent that decides on demand (the dedup guard's lease context checks
// the lease's age when asked, so a process thawed after a freeze sees its
// lease lost before its late timers fire) still hears the question
// through the handler deadline, and its cancellation reaches the timer
// context synchronously (it is registered with the parent's cancelCtx).
//
// One difference from an eager context remains: when both the deadline
// and the parent's cancellation happened before the timer context was
// made (nobody asked for Done, and nothing was asked since the deadline),
// the parent's error and cause are reported: which of the two came first
// is not known then.
type handlerContext struct {
	parent context.Context
	at     time.Time
	limit  time.Duration

	live atomic.Pointer[liveDeadline]
	mu   sync.Mutex // makes live once; guards the end fields
	// ended: the handler has returned, at endedAt; parentDone: its
	// parent was already done then.
	ended      atomic.Bool
	endedAt    time.Time
	parentDone bool
}

type liveDeadline struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// timer returns the timer context, made on first use. Made after the
// handler returned, it is what the eager context would be by then:
// cancelled by the end (Canceled), timed out if the deadline came first,
// or cancelled with the parent if the parent was done first.
func (c *handlerContext) timer() context.Context {
	if l := c.live.Load(); l != nil {
		return l.ctx
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if l := c.live.Load(); l != nil {
		return l.ctx
	}
	ended := c.ended.Load() // set only under c.mu
	parent := c.parent
	if ended && !c.parentDone {
		// The parent's later cancellation did not reach the ended
		// context: only its values do.
		parent = context.WithoutCancel(parent)
	}
	var ctx context.Context
	var cancel context.CancelFunc
	if ended && c.endedAt.Before(c.at) {
		ctx, cancel = context.WithCancel(parent)
	} else {
		ctx, cancel = context.WithDeadlineCause(parent, c.at, handlerTimeoutCause(c.limit))
	}
	if ended {
		cancel()
	}
	c.live.Store(&liveDeadline{ctx: ctx, cancel: cancel})
	return ctx
}

// over says the context is done by its own deadline or end (not its
// parent's): past the deadline, or the handler has returned.
func (c *handlerContext) over() bool {
	return c.ended.Load() || !time.Now().Before(c.at)
}

// end is called when the handler has returned: the context is cancelled
// (context.Canceled) unless it was already done.
func (c *handlerContext) end() {
	c.mu.Lock()
	if c.ended.Load() {
		c.mu.Unlock()
		return
	}
	c.endedAt, c.parentDone = time.Now(), c.parent.Err() != nil
	c.ended.Store(true)
	l := c.live.Load()
	c.mu.Unlock()
	if l != nil {
		l.cancel()
	}
}

func (c *handlerContext) Deadline() (time.Time, bool) {
	if d, ok := c.parent.Deadline(); ok && d.Before(c.at) {
		return d, true
	}
	return c.at, true
}

func (c *handlerContext) Done() <-chan struct{} {
	if c.parent.Err() != nil {
		return c.parent.Done()
	}
	return c.timer().Done()
}

// Err asks the parent first (a parent that decides when asked cancels
// the timer context then, synchronously), then answers as the timer
// context does, so that once non-nil it does not change: a context done
// by its own deadline or end stays so when its parent ends later.
func (c *handlerContext) Err() error {
	perr := c.parent.Err()
	if l := c.live.Load(); l != nil {
		if err := l.ctx.Err(); err != nil {
			return err
		}
		return perr // a parent whose end reaches the timer context later
	}
	if c.over() {
		return c.timer().Err() // made now, so context.Cause agrees with Err
	}
	return perr
}

// Value answers from the parent while the context is live and its timer
// context has not been made: context.Cause (which asks Value for the
// nearest cancel context) then finds the parent's, whose cause is the
// parent's. Once over, the timer context answers, with this context's
// own cause.
func (c *handlerContext) Value(key any) any {
	if l := c.live.Load(); l != nil {
		return l.ctx.Value(key)
	}
	if c.over() {
		return c.timer().Value(key)
	}
	return c.parent.Value(key)
}

func (c *handlerContext) String() string {
	return fmt.Sprintf("idemq.handlerContext(deadline %v)", c.at)
}
