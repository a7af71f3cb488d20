package coalesce

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Func answers a batch: one response per request, in order.
type Func[Req, Resp any] func(ctx context.Context, reqs []Req) []Resp

// Config configures a [Batcher]. The zero value is usable.
type Config struct {
	// MaxBatch bounds the requests in one batch. Default 128.
	MaxBatch int
	// MaxInFlight bounds the batches being answered at once. Default 1.
	MaxInFlight int
	// Timeout bounds each batch's context. Default 5s.
	Timeout time.Duration
}

// Batcher coalesces concurrent [Batcher.Do] calls into calls of its Func.
// It is safe for concurrent use; its zero value is not usable (see [New]).
type Batcher[Req, Resp any] struct {
	fn   Func[Req, Resp]
	fail func(error) Resp
	cfg  Config
	pool sync.Pool // *call: a request's slot and its reusable done channel

	mu       sync.Mutex
	pending  []*call[Req, Resp]
	inFlight int
}

type call[Req, Resp any] struct {
	ctx  context.Context
	req  Req
	resp Resp
	// done receives one value when resp is set. It is buffered, so the
	// answering side never waits for the caller, and reused with the call.
	done chan struct{}
}

// New returns a batcher calling fn. fail makes the response of a request
// that fn did not answer (it panicked, returned too few responses, or
// overran Config.Timeout).
func New[Req, Resp any](fn Func[Req, Resp], fail func(error) Resp, cfg Config) *Batcher[Req, Resp] {
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 128
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 1
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	b := &Batcher[Req, Resp]{fn: fn, fail: fail, cfg: cfg}
	b.pool.New = func() any { return &call[Req, Resp]{done: make(chan struct{}, 1)} }
	return b
}

// Do sends req in the next batch and returns its response. A request still
// waiting for a batch when ctx ends is withdrawn and answered with the
// Func's fail(ctx.Err()); once taken into a batch it is waited for, so a
// request sent is never left behind half-done.
//
// Every batch is answered within Config.Timeout: its context ends then,
// and a Func that does not return by that time is not waited for (its
// requests are answered with fail(context.DeadlineExceeded) and the next
// batch starts). A request therefore waits at most for the batches ahead
// of it and its own, each bounded by Timeout, without a timer of its own.
// The batch's context carries the values of ctx of the call that starts
// it (all calls of one batcher are expected to share them: a recorder, a
// logger) but never its cancellation.
func (b *Batcher[Req, Resp]) Do(ctx context.Context, req Req) Resp {
	c := b.pool.Get().(*call[Req, Resp])
	c.ctx, c.req = ctx, req
	b.mu.Lock()
	b.pending = append(b.pending, c)
	var batch []*call[Req, Resp]
	if b.inFlight < b.cfg.MaxInFlight {
		batch = b.take()
	}
	b.mu.Unlock()
	if batch != nil {
		b.run(batch)
	}
	var resp Resp
	select {
	case <-c.done:
		resp = c.resp
	case <-ctx.Done():
		b.mu.Lock()
		if i := slices.Index(b.pending, c); i >= 0 {
			b.pending = slices.Delete(b.pending, i, i+1)
			b.mu.Unlock()
			resp = b.fail(ctx.Err())
			break
		}
		b.mu.Unlock()
		<-c.done // already in a batch: its answer is on its way
		resp = c.resp
	}
	var zero call[Req, Resp]
	c.ctx, c.req, c.resp = zero.ctx, zero.req, zero.resp
	b.pool.Put(c)
	return resp
}

// take removes up to MaxBatch pending calls and counts a batch in flight.
// Called with b.mu held.
func (b *Batcher[Req, Resp]) take() []*call[Req, Resp] {
	n := min(len(b.pending), b.cfg.MaxBatch)
	batch := make([]*call[Req, Resp], n)
	copy(batch, b.pending)
	rest := copy(b.pending, b.pending[n:])
	clear(b.pending[rest:])
	b.pending = b.pending[:rest]
	b.inFlight++
	return batch
}

// run answers batch, then starts the next one if calls are waiting. When
// fn overruns the batch's Timeout, a watchdog answers the batch instead
// and starts the next one; fn's late answer is dropped.
func (b *Batcher[Req, Resp]) run(batch []*call[Req, Resp]) {
	reqs := make([]Req, len(batch))
	for i, c := range batch {
		reqs[i] = c.req
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(batch[0].ctx), b.cfg.Timeout)
	stop := context.AfterFunc(ctx, func() {
		err := fmt.Errorf("coalesce: batch not answered within %v: %w", b.cfg.Timeout, context.DeadlineExceeded)
		for _, c := range batch {
			c.resp = b.fail(err)
			c.done <- struct{}{}
		}
		b.finish()
	})
	resps := b.call(ctx, reqs)
	if !stop() {
		// The watchdog answered (or is answering) this batch.
		cancel()
		return
	}
	cancel()
	for i, c := range batch {
		c.resp = resps[i]
		c.done <- struct{}{}
	}
	b.finish()
}

// finish ends a batch in flight and starts the next one if calls wait.
func (b *Batcher[Req, Resp]) finish() {
	b.mu.Lock()
	b.inFlight--
	var next []*call[Req, Resp]
	if len(b.pending) > 0 && b.inFlight < b.cfg.MaxInFlight {
		next = b.take()
	}
	b.mu.Unlock()
	if next != nil {
		go b.run(next)
	}
}

// call runs fn and makes sure there is one response per request: a panic
// in fn, a response missing or one too many answers with fail.
func (b *Batcher[Req, Resp]) call(ctx context.Context, reqs []Req) (resps []Resp) {
	defer func() {
		if v := recover(); v != nil {
			err := fmt.Errorf("coalesce: batch function panicked: %v", v)
			resps = make([]Resp, len(reqs))
			for i := range resps {
				resps[i] = b.fail(err)
			}
		}
	}()
	resps = b.fn(ctx, reqs)
	if len(resps) > len(reqs) {
		// Too many answers: which belongs to which can't be trusted.
		err := fmt.Errorf("coalesce: batch function answered %d requests with %d responses", len(reqs), len(resps))
		resps = make([]Resp, len(reqs))
		for i := range resps {
			resps[i] = b.fail(err)
		}
		return resps
	}
	if len(resps) < len(reqs) {
		err := fmt.Errorf("coalesce: batch function answered %d of %d requests", len(resps), len(reqs))
		r := make([]Resp, len(reqs))
		copy(r, resps)
		for i := len(resps); i < len(reqs); i++ {
			r[i] = b.fail(err)
		}
		resps = r
	}
	return resps
}
