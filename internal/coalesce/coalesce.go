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

	mu       sync.Mutex
	pending  []*call[Req, Resp]
	inFlight int
}

type call[Req, Resp any] struct {
	ctx  context.Context
	req  Req
	resp Resp
	done chan struct{}
}

// New returns a batcher calling fn. fail makes the response of a request
// that fn did not answer (it panicked, or returned too few responses).
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
	return &Batcher[Req, Resp]{fn: fn, fail: fail, cfg: cfg}
}

// Do sends req in the next batch and returns its response. A request still
// waiting for a batch when ctx ends is withdrawn and answered with the
// Func's fail(ctx.Err()); once taken into a batch it is waited for (each
// batch is bounded by Config.Timeout), so a request sent is never left
// behind half-done. The batch's context carries the values of ctx of the
// call that starts it (all calls of one batcher are expected to share
// them: a recorder, a logger) but never its cancellation.
func (b *Batcher[Req, Resp]) Do(ctx context.Context, req Req) Resp {
	c := &call[Req, Resp]{ctx: ctx, req: req, done: make(chan struct{})}
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
	select {
	case <-c.done:
		return c.resp
	case <-ctx.Done():
	}
	b.mu.Lock()
	if i := slices.Index(b.pending, c); i >= 0 {
		b.pending = slices.Delete(b.pending, i, i+1)
		b.mu.Unlock()
		return b.fail(ctx.Err())
	}
	b.mu.Unlock()
	<-c.done // already in a batch: its answer is on its way
	return c.resp
}

// take removes the next batch from pending and counts it in flight; b.mu
// is held.
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

// run answers batch, then hands whatever queued meanwhile to a new
// goroutine (the caller that ran this batch goes back to its own work).
func (b *Batcher[Req, Resp]) run(batch []*call[Req, Resp]) {
	reqs := make([]Req, len(batch))
	for i, c := range batch {
		reqs[i] = c.req
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(batch[0].ctx), b.cfg.Timeout)
	resps := b.call(ctx, reqs)
	cancel()
	for i, c := range batch {
		c.resp = resps[i]
		close(c.done)
	}
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
