package deadline

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// ErrHandlerTimeout is the cause of a handler context cancelled at its
// deadline (idemq.ErrHandlerTimeout is this error).
var ErrHandlerTimeout = errors.New("idemq: handler timed out")

// cause is the cause of a handler context cancelled at its deadline:
// ErrHandlerTimeout and the limit. It is made for every delivery, so it
// is formatted only when read.
type cause time.Duration

func (c cause) Error() string {
	return fmt.Sprintf("%s after %v", ErrHandlerTimeout.Error(), time.Duration(c))
}

func (c cause) Unwrap() error { return ErrHandlerTimeout }

// New returns the context of a handler that must be done by at, limit
// after it started, under parent. The caller calls End when the handler
// has returned.
func New(parent context.Context, at time.Time, limit time.Duration) *Context {
	return &Context{parent: parent, at: at, limit: limit}
}

// Context is the handler's context under a deadline: done at its
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
type Context struct {
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
func (c *Context) timer() context.Context {
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
		ctx, cancel = context.WithDeadlineCause(parent, c.at, cause(c.limit))
	}
	if ended {
		cancel()
	}
	c.live.Store(&liveDeadline{ctx: ctx, cancel: cancel})
	return ctx
}

// over says the context is done by its own deadline or end (not its
// parent's): past the deadline, or the handler has returned.
func (c *Context) over() bool {
	return c.ended.Load() || !time.Now().Before(c.at)
}

// End is called when the handler has returned: the context is cancelled
// (context.Canceled) unless it was already done.
func (c *Context) End() {
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

func (c *Context) Deadline() (time.Time, bool) {
	if d, ok := c.parent.Deadline(); ok && d.Before(c.at) {
		return d, true
	}
	return c.at, true
}

func (c *Context) Done() <-chan struct{} {
	if c.parent.Err() != nil {
		return c.parent.Done()
	}
	return c.timer().Done()
}

// Err asks the parent first (a parent that decides when asked cancels
// the timer context then, synchronously), then answers as the timer
// context does, so that once non-nil it does not change: a context done
// by its own deadline or end stays so when its parent ends later.
func (c *Context) Err() error {
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
func (c *Context) Value(key any) any {
	if l := c.live.Load(); l != nil {
		return l.ctx.Value(key)
	}
	if c.over() {
		return c.timer().Value(key)
	}
	return c.parent.Value(key)
}

func (c *Context) String() string {
	return fmt.Sprintf("idemq.handlerContext(deadline %v)", c.at)
}
