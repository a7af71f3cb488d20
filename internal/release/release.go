// Package release hands delayed deliveries back to their work queue on
// time, without the broker's dead-letter path.
//
// A failure policy parks a delivery that should run again later in a
// delay queue ("<queue>.retry.<ms>"), stamped with the time it is due
// (x-idemq-due, Unix milliseconds). A [Releaser] consumes every delay
// queue of a work queue with a bounded prefetch, holds each delivery
// until it is due, republishes it to the work queue (the Publish func:
// confirmed by the broker) and only then acks it. A crash or a broker
// restart between the confirm and the ack gives the delivery back to the
// delay queue, and it is released again: a duplicate in the work queue
// under the same message ID, which the dedup guard or the inbox absorbs;
// never a loss. Nothing here depends on message TTLs or dead-lettering,
// so the path is the same on classic and quorum queues and on RabbitMQ
// 3.x and 4.x.
//
// A delay queue holds the messages of one delay, so it is ordered by due
// time: the releaser waits for the head, and what it prefetched behind
// the head is due no sooner (up to the clock skew between the processes
// that parked them). A due time is trusted only as far as the queue's
// delay: a delivery is held at most Delay from the moment the releaser
// received it, so a forged or skewed header cannot park it for longer.
package release

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/backoff"
	"github.com/idemq/idemq/internal/headerval"
)

// Queue is one delay queue.
type Queue struct {
	Name  string
	Delay time.Duration
}

// Config configures a [Releaser]. Queues and Publish are required.
type Config struct {
	// Queues to release.
	Queues []Queue
	// Publish republishes a due delivery to its work queue and returns
	// once the broker confirmed it. A nil error acks the delivery; any
	// error gives it back to its delay queue (nack with requeue) after
	// Retry's backoff, so it is released again.
	Publish func(ctx context.Context, d *amqp.Delivery) error
	// DueHeader names the header holding the due time (Unix
	// milliseconds). Required.
	DueHeader string
	// Prefetch bounds the deliveries held per delay queue. Default 200.
	Prefetch int
	// Publishers bounds the concurrent republishes per delay queue.
	// Default 16.
	Publishers int
	// HoldLimit is the longest a delivery may be held unacked (below the
	// broker's consumer_timeout). A delivery due later than that is given
	// back (nack with requeue) after HoldLimit and taken again.
	// 0: no limit.
	HoldLimit time.Duration
	// Tag prefixes the consumer tags ("<Tag>.<queue>").
	Tag string
	// Retry is the backoff before a failed republish is given back, and
	// between attempts to consume a delay queue (missing, or its channel
	// closed). Default 500ms doubling to 30s.
	Retry backoff.Policy
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Released is called after each delivery was republished and acked,
	// with how late it was (0 when on time). Optional.
	Released func(late time.Duration)
	// Failed is called after each failed republish. Optional.
	Failed func(err error)
	// Now is the clock (tests). Default time.Now.
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	if c.Prefetch <= 0 {
		c.Prefetch = 200
	}
	if c.Publishers <= 0 {
		c.Publishers = 16
	}
	if c.Retry.Min <= 0 {
		c.Retry.Min = 500 * time.Millisecond
	}
	if c.Retry.Max <= 0 {
		c.Retry.Max = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Released == nil {
		c.Released = func(time.Duration) {}
	}
	if c.Failed == nil {
		c.Failed = func(error) {}
	}
	return c
}

// Releaser releases the delay queues of one work queue on one connection.
type Releaser struct {
	cfg    Config
	conn   *amqp.Connection
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// drain bounds the wait for republishes in flight once stopping.
	drain atomic.Int64
}

// Start starts releasing cfg.Queues on conn until [Releaser.Stop] is
// called or conn closes. Each queue gets its own channel, so a missing
// queue or a closed channel leaves the others running.
func Start(ctx context.Context, conn *amqp.Connection, cfg Config) (*Releaser, error) {
	if cfg.Publish == nil || cfg.DueHeader == "" {
		return nil, errors.New("release: Config.Publish and Config.DueHeader are required")
	}
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithCancel(ctx)
	r := &Releaser{cfg: cfg, conn: conn, cancel: cancel}
	for _, q := range cfg.Queues {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.run(ctx, q)
		}()
	}
	return r, nil
}

// Stop stops taking deliveries, waits up to timeout for the republishes
// in flight (each then acks its delivery), and closes the channels: what
// is held and not yet republished goes back to its delay queue.
func (r *Releaser) Stop(timeout time.Duration) {
	r.drain.Store(int64(timeout))
	r.cancel()
	r.wg.Wait()
}

// run consumes q again after every failure until ctx ends or the
// connection closes.
func (r *Releaser) run(ctx context.Context, q Queue) {
	for failures := 0; ; failures++ {
		took, err := r.consume(ctx, q)
		if ctx.Err() != nil || r.conn.IsClosed() {
			return
		}
		if took {
			failures = 0 // it worked for a while: a new streak
		}
		lvl := slog.LevelWarn
		if failures > 0 {
			lvl = slog.LevelDebug // logged once per streak
		}
		r.cfg.Logger.Log(ctx, lvl, "idemq: releasing a delay queue failed; trying again", "delay_queue", q.Name, "err", err)
		if backoff.Sleep(ctx, r.cfg.Retry.Delay(failures)) != nil {
			return
		}
	}
}

// stamped is a delivery with the time the releaser received it: the
// broker's consumer_timeout counts from there, whatever waits before it.
type stamped struct {
	d  amqp.Delivery
	at time.Time
}

// consume releases q on a channel of its own until ctx ends or the channel
// closes. took says whether it took a delivery.
func (r *Releaser) consume(ctx context.Context, q Queue) (took bool, err error) {
	ch, err := r.conn.Channel()
	if err != nil {
		return false, fmt.Errorf("open channel: %w", err)
	}
	var inflight sync.WaitGroup
	defer func() {
		// Let the republishes in flight finish and ack (bounded when
		// stopping), then close: the broker takes back what is still held.
		// A closed channel cannot ack: nothing to wait for (the broker has
		// taken everything back already).
		if !ch.IsClosed() && !r.conn.IsClosed() {
			done := make(chan struct{})
			go func() { inflight.Wait(); close(done) }()
			t := time.NewTimer(time.Duration(max(r.drain.Load(), int64(time.Second))))
			select {
			case <-done:
			case <-t.C:
			}
			t.Stop()
		}
		_ = ch.Close()
	}()
	if err := ch.Qos(r.cfg.Prefetch, 0, false); err != nil {
		return false, fmt.Errorf("qos: %w", err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	dels, err := ch.ConsumeWithContext(context.WithoutCancel(ctx), q.Name, r.cfg.Tag+"."+q.Name, false, false, false, false, nil)
	if err != nil {
		return false, fmt.Errorf("consume %q: %w", q.Name, err)
	}
	// Stamped on arrival (at most Prefetch wait unacked behind the head):
	// holds count from when the broker handed each delivery over.
	in := make(chan stamped, r.cfg.Prefetch)
	quit := make(chan struct{})
	defer close(quit)
	go func() {
		defer close(in)
		for d := range dels {
			select {
			case in <- stamped{d, r.cfg.Now()}:
			case <-quit:
				return
			}
		}
	}()
	sem := make(chan struct{}, r.cfg.Publishers)
	var failures atomic.Int64
	for {
		var s stamped
		var ok bool
		select {
		case <-ctx.Done():
			return took, nil
		case e := <-closed:
			return took, fmt.Errorf("channel closed: %w", closedErr(e))
		case s, ok = <-in:
			if !ok {
				return took, errors.New("delivery stream closed")
			}
		}
		took = true
		d := s.d
		due := Due(d.Headers, r.cfg.DueHeader, q.Delay, s.at)
		if limit := s.at.Add(r.cfg.HoldLimit); r.cfg.HoldLimit > 0 && due.After(limit) {
			// Held longer, the broker's consumer_timeout would close the
			// channel: give it back at HoldLimit, and take it again.
			if err := sleep(ctx, closed, limit.Sub(r.cfg.Now())); err != nil {
				return took, err
			}
			_ = ch.Nack(d.DeliveryTag, false, true)
			continue
		}
		if err := sleep(ctx, closed, due.Sub(r.cfg.Now())); err != nil {
			return took, err
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return took, nil
		}
		inflight.Add(1)
		go func(d amqp.Delivery, due time.Time) {
			defer inflight.Done()
			defer func() { <-sem }()
			// Not cancelled by Stop: a republish in flight finishes and
			// acks (the Publish func bounds it).
			err := r.cfg.Publish(context.WithoutCancel(ctx), &d)
			if err == nil {
				failures.Store(0)
				if ch.Ack(d.DeliveryTag, false) == nil {
					r.cfg.Released(max(r.cfg.Now().Sub(due), 0))
				}
				return
			}
			r.cfg.Failed(err)
			n := failures.Add(1)
			lvl := slog.LevelWarn
			if n > 1 {
				lvl = slog.LevelDebug
			}
			r.cfg.Logger.Log(ctx, lvl, "idemq: a due delivery could not be handed back to its work queue; it stays in its delay queue and is tried again",
				"delay_queue", q.Name, "message_id", d.MessageId, "err", err)
			_ = backoff.Sleep(ctx, r.cfg.Retry.Delay(int(min(n-1, 16))))
			_ = ch.Nack(d.DeliveryTag, false, true)
		}(d, due)
	}
}

// sleep waits d, or until ctx ends (nil: stopping) or the channel closes.
func sleep(ctx context.Context, closed <-chan *amqp.Error, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return errStopping
	case e := <-closed:
		return fmt.Errorf("channel closed: %w", closedErr(e))
	}
}

var errStopping = errors.New("release: stopping")

func closedErr(e *amqp.Error) error {
	if e == nil {
		return errors.New("closed")
	}
	return e
}

// Due is when a delivery received at received from a delay queue of delay
// is due: the time in its header, but no later than received+delay (a
// forged, skewed or missing header never parks it longer than its queue's
// delay).
func Due(h amqp.Table, header string, delay time.Duration, received time.Time) time.Time {
	latest := received.Add(delay)
	ms, ok := millis(h[header])
	if !ok {
		return latest
	}
	if due := time.UnixMilli(ms); due.Before(latest) {
		return due
	}
	return latest
}

// millis reads a header value as Unix milliseconds: any integer type, or
// a decimal string; ok is false for anything else or out of range.
func millis(v any) (int64, bool) {
	const limit = math.MaxInt64 / int64(time.Millisecond) // time.UnixMilli stays exact
	n, ok := headerval.Int64(v)
	if !ok || n < 0 || n > limit {
		return 0, false
	}
	return n, true
}
