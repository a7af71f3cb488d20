// Package deliverylimit reads, from the RabbitMQ management API, what the
// broker applies to a queue that AMQP cannot show: its delivery limit (the
// smallest of the x-delivery-limit argument and the delivery-limit of the
// policy and operator policy that apply) and its consumer timeout (an
// x-consumer-timeout argument, a consumer-timeout policy). The consumer
// reads them at every (re)connect and again every
// ConsumerConfig.ManagementRefresh; the failure policy gets the limit with
// each delivery, the handler deadline follows the timeout.
package deliverylimit

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemq/idemq/internal/mgmt"
)

// Config configures a [Reader].
type Config struct {
	// Client is the management API. Required.
	Client *mgmt.Client
	// Queue is the queue whose limit is read. Required.
	Queue string
	// Timeout bounds one read, including the wait for the statistics of a
	// queue declared a moment ago. Required.
	Timeout time.Duration
	// Ready reports whether the consumer has subscribed once: before, a
	// failed read is an error; after (once a limit was read), the last
	// limit stays in use, with a warning. Default: never ready.
	Ready func() bool
	// ConsumerTimeout is called, under the reader's lock, when the consumer
	// timeout the broker shows for the queue changed (0: none shown), with
	// where it comes from. Optional.
	ConsumerTimeout func(d time.Duration, source string)
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// Reader holds the latest delivery limit and consumer timeout read for a
// queue. Its getters are safe for concurrent use; a nil Reader (no
// management API) answers 0.
type Reader struct {
	cfg Config
	log *slog.Logger

	limit   atomic.Int64 // the broker's delivery limit for Queue, 0: unknown
	timeout atomic.Int64 // the broker's consumer timeout for Queue in ns, 0: none shown

	mu   sync.Mutex // serialises reads
	read bool       // a limit was read once (under mu)
}

// New returns a reader that has read nothing yet.
func New(cfg Config) *Reader {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.Ready == nil {
		cfg.Ready = func() bool { return false }
	}
	return &Reader{cfg: cfg, log: log}
}

// Limit is the delivery limit last read, 0: unknown or none.
func (r *Reader) Limit() int {
	if r == nil {
		return 0
	}
	return int(r.limit.Load())
}

// ConsumerTimeout is the consumer timeout the broker showed for the queue
// at the last read, 0: none.
func (r *Reader) ConsumerTimeout() time.Duration {
	if r == nil {
		return 0
	}
	return time.Duration(r.timeout.Load())
}

// Read reads the limit of the queue in vhost. Before the consumer's first
// subscription (Config.Ready) or the first successful read, a failure is
// the error; after them, the last limit stays in use, with a warning.
func (r *Reader) Read(ctx context.Context, vhost string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	q, err := r.cfg.Client.Queue(rctx, vhost, r.cfg.Queue)
	var l mgmt.Limit
	if err == nil {
		if l, err = mgmt.Resolve(q); err != nil {
			err = fmt.Errorf("queue %q in vhost %q at %s: %w", r.cfg.Queue, vhost, r.cfg.Client, err)
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !r.cfg.Ready() || !r.read {
			return fmt.Errorf("read the delivery limit of queue %q (ConsumerConfig.ManagementURL): %w", r.cfg.Queue, err)
		}
		r.log.Warn("idemq: could not read the queue's delivery limit; keeping the last one read",
			"limit", r.limit.Load(), "management", r.cfg.Client.String(), "err", err)
		return nil
	}
	n := int64(0)
	if l.Source != mgmt.SourceNone {
		n = int64(max(l.N, 1)) // a limit of 0: no requeue is safe; 1 says the same to the policy
	}
	old := r.limit.Swap(n)
	if !r.read || old != n {
		r.log.Info("idemq: queue delivery limit", "limit", l.String(), "source", l.Source, "policy", l.Name,
			"type", l.Type, "vhost", vhost, "management", r.cfg.Client.String())
	}
	r.read = true
	r.readConsumerTimeout(q)
	return nil
}

// Refresh reads the limit again every period until ctx ends (the
// session's end), so a policy changed while the consumer runs counts
// without a reconnect. A failed read keeps the last limit (see Read).
func (r *Reader) Refresh(ctx context.Context, vhost string, every time.Duration) {
	if every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = r.Read(ctx, vhost) // after the first read: never an error, a warning
		}
	}
}

// readConsumerTimeout takes the consumer timeout the broker shows for
// the queue and tells Config.ConsumerTimeout when it changed. mu held.
func (r *Reader) readConsumerTimeout(q mgmt.Queue) {
	d, source, ok, err := mgmt.ConsumerTimeout(q)
	if err != nil {
		r.log.Warn("idemq: could not read the queue's consumer timeout", "queue", r.cfg.Queue, "err", err)
		return
	}
	n := int64(0)
	if ok && d > 0 {
		n = int64(d)
	}
	if r.timeout.Swap(n) == n {
		return
	}
	if r.cfg.ConsumerTimeout != nil {
		r.cfg.ConsumerTimeout(time.Duration(n), source)
	}
}
