package idemq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/internal/acker"
	"github.com/idemq/idemq/internal/release"
)

// One session is one connection's lifetime:
//
//	connect    dial (URL failover), open a channel, set QoS, declare the topology
//	limits     read the queue's delivery limit and consumer timeout (ManagementURL), again every ManagementRefresh
//	subscribe  watch the connection, the channel and broker-side cancels, start consuming
//	workers    the executor (acker + requeuer) and the worker goroutines
//	release    take the policy's delayed retries from their delay queues when due (startRelease)
//	receive    hand deliveries to the workers until the session ends (the breaker may pause it)
//	drain      on shutdown: stop consuming, finish what the client already holds
//	finish     wait for the workers, give back deferred deliveries, flush the acks

// session runs one connection's lifetime. It reports whether the consume
// was established (to reset the backoff) and why it ended.
func (c *Consumer) session(ctx context.Context) (bool, error) {
	conn, ch, err := c.connect(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	if c.limits != nil {
		// At every (re)connect: a policy may have changed, and after a
		// failover another node answers.
		if err := c.limits.Read(ctx, vhostOf(conn)); err != nil {
			return false, err
		}
	}
	sub, err := c.subscribe(ctx, conn, ch)
	if err != nil {
		return false, err
	}
	c.markReady()
	c.consuming.Store(true)
	defer c.consuming.Store(false)
	rctx, stopRefresh := context.WithCancel(ctx)
	defer stopRefresh()
	if c.limits != nil {
		go c.limits.Refresh(rctx, vhostOf(conn), c.cfg.ManagementRefresh)
	}
	if rel := c.startRelease(ctx, conn); rel != nil {
		// Stopped before the connection closes: its republishes in
		// flight finish and ack first.
		defer rel.Stop(c.cfg.ShutdownTimeout)
	}

	// Handlers run under hctx: not cancelled by the Run context (so they can
	// finish on shutdown), cancelled when the channel dies (their ack is
	// impossible, the broker redelivers) or after ShutdownTimeout.
	hctx, hcancel := context.WithCancel(WithRecorder(context.WithoutCancel(ctx), c.rec))
	defer hcancel()
	w := c.startWorkers(hctx, ch)

	endErr := c.receive(ctx, sub, w)
	graceful := endErr == nil
	if graceful {
		c.drain(ch, sub, w)
	} else {
		// The channel is gone: its tags are dead, the broker redelivers.
		hcancel()
		w.x.ack.Abandon()
	}
	w.stop(c.cfg.ShutdownTimeout, hcancel)
	if graceful {
		w.x.ack.Close()
		_ = ch.Close()
	}
	return true, endErr
}

// connect dials the broker and prepares a channel: QoS and topology.
func (c *Consumer) connect(ctx context.Context) (*amqp.Connection, *amqp.Channel, error) {
	conn, broker, err := c.brokers.Dial(c.cfg.Dial, amqp.Config{
		Heartbeat:  c.cfg.Heartbeat,
		Locale:     "en_US",
		Properties: amqp.Table{"connection_name": "idemq consumer " + c.cfg.ConsumerTag},
	})
	if err != nil {
		return nil, nil, fmt.Errorf("dial: %w", err)
	}
	c.log.Debug("idemq: consumer connected", "broker", broker)
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("qos: %w", err)
	}
	if c.cfg.Setup != nil {
		if err := c.cfg.Setup(ctx, ch); err != nil {
			conn.Close()
			return nil, nil, fmt.Errorf("setup topology: %w", err)
		}
	}
	return conn, ch, nil
}

// vhostOf is the vhost conn is open on.
func vhostOf(conn *amqp.Connection) string {
	if conn.Config.Vhost == "" {
		return "/"
	}
	return conn.Config.Vhost
}

// subscription is what a session listens to.
type subscription struct {
	deliveries <-chan amqp.Delivery
	connClosed <-chan *amqp.Error
	chClosed   <-chan *amqp.Error
	cancelled  <-chan string
}

// subscribe registers for the session's end notifications and starts
// consuming.
func (c *Consumer) subscribe(ctx context.Context, conn *amqp.Connection, ch *amqp.Channel) (subscription, error) {
	s := subscription{
		connClosed: conn.NotifyClose(make(chan *amqp.Error, 1)),
		chClosed:   ch.NotifyClose(make(chan *amqp.Error, 1)),
		cancelled:  ch.NotifyCancel(make(chan string, 1)),
	}
	var err error
	s.deliveries, err = ch.ConsumeWithContext(context.WithoutCancel(ctx), c.cfg.Queue, c.cfg.ConsumerTag, false, false, false, false, nil)
	if err != nil {
		return s, fmt.Errorf("consume %q: %w", c.cfg.Queue, err)
	}
	c.log.Debug("idemq: consuming", "tag", c.cfg.ConsumerTag)
	return s, nil
}

// workers are a session's worker goroutines and the executor they share.
type workers struct {
	x    *executor
	work chan job
	wg   sync.WaitGroup
}

type job struct {
	d   amqp.Delivery
	del *Delivery
}

// startWorkers starts cfg.Workers goroutines that process deliveries under
// hctx and carry out their decisions on ch.
func (c *Consumer) startWorkers(hctx context.Context, ch *amqp.Channel) *workers {
	ack := acker.New(ch, acker.Config{
		MaxBatch:      c.cfg.AckBatch,
		FlushInterval: c.cfg.AckFlushInterval,
		OnError: func(err error) {
			c.log.Warn("idemq: ack frame failed; the broker will redeliver", "err", err)
		},
	})
	w := &workers{
		x: &executor{ack: ack, rq: acker.NewRequeuer(ack, func() { c.rec.Add(CountRequeued, 1) }),
			policy: c.policy, rec: c.rec, log: c.log},
		// Buffered to the prefetch window (the broker never has more
		// unacked deliveries on the channel), so dispatch never blocks and
		// a delivery's ReceivedAt is when it arrived, not when a worker
		// was free: the ConsumerTimeout bound counts from there.
		work: make(chan job, c.cfg.Prefetch),
	}
	w.x.obs, _ = c.rec.(Observer)
	for i := 0; i < c.cfg.Workers; i++ {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for j := range w.work {
				c.process(hctx, w.x, j)
			}
		}()
	}
	return w
}

// stop closes the work queue, waits for the workers (cancelling their
// context after timeout) and gives back the deliveries waiting for a
// delayed requeue.
func (w *workers) stop(timeout time.Duration, cancel func()) {
	close(w.work)
	waitTimeout(&w.wg, timeout, cancel)
	w.x.rq.Flush()
}

// receive hands deliveries to the workers until ctx ends (nil: a graceful
// stop) or the session breaks (the reason). The breaker holds deliveries
// back while a dependency is down.
func (c *Consumer) receive(ctx context.Context, s subscription, w *workers) error {
	for {
		in, wake := c.brk.Gate(ctx, s.deliveries) // nil while a dependency is down
		select {
		case <-wake:
		case <-ctx.Done():
			return nil
		case e := <-s.connClosed:
			return fmt.Errorf("connection closed: %w", amqpErr(e))
		case e := <-s.chClosed:
			return fmt.Errorf("channel closed: %w", amqpErr(e))
		case tag := <-s.cancelled:
			return fmt.Errorf("consumer %s cancelled by the broker (queue deleted or failed over)", tag)
		case d, ok := <-in:
			if !ok {
				return errors.New("delivery stream closed")
			}
			c.brk.Dispatched()
			if !c.dispatch(w, d) {
				return errors.New("acker closed")
			}
		}
	}
}

// drain stops taking deliveries on a graceful stop; the ones the client
// already holds are finished like the others, for up to ShutdownTimeout.
func (c *Consumer) drain(ch *amqp.Channel, s subscription, w *workers) {
	if err := ch.Cancel(c.cfg.ConsumerTag, false); err != nil {
		return
	}
	timeout := time.NewTimer(c.cfg.ShutdownTimeout)
	defer timeout.Stop()
	for {
		select {
		case d, ok := <-s.deliveries:
			if !ok {
				return
			}
			c.dispatch(w, d)
		case <-s.chClosed:
			return
		case <-timeout.C:
			return
		}
	}
}

// dispatch registers d with the acker, decides its ID (once, before any
// layer) and hands it to a worker.
func (c *Consumer) dispatch(w *workers, d amqp.Delivery) bool {
	if err := w.x.ack.Register(d.DeliveryTag); err != nil {
		return false
	}
	c.rec.Add(CountDelivered, 1)
	if d.Redelivered {
		c.rec.Add(CountRedelivered, 1)
	}
	del := newDelivery(&d, c.cfg.Queue, c.cfg.Group, time.Now())
	del.QueueDeliveryLimit = c.limits.Limit()
	c.cfg.ID.Apply(del)
	w.work <- job{d: d, del: del}
	return true
}

// lateRelease is how late a release must be to count as late.
const lateRelease = time.Second

// startRelease starts releasing the policy's delay queues on conn; nil
// when there is nothing to release. The caller stops it.
func (c *Consumer) startRelease(ctx context.Context, conn *amqp.Connection) *release.Releaser {
	send, dqs := DelayQueuesOf(c.policy, c.cfg.Queue)
	if c.cfg.Release.Disabled {
		if send != nil && len(dqs) > 0 && c.releaseWarned.CompareAndSwap(false, true) {
			c.log.Warn("idemq: Release.Disabled: this consumer does not release its delay queues; with the default retry queues (no TTL) delayed retries wait until a consumer that does runs",
				"delay_queues", len(dqs))
		}
		return nil
	}
	if send == nil || len(dqs) == 0 {
		return nil
	}
	qs := make([]release.Queue, len(dqs))
	for i, q := range dqs {
		qs[i] = release.Queue{Name: q.Name, Delay: q.Delay}
	}
	var hold time.Duration
	if c.cfg.ConsumerTimeout > 0 {
		hold = c.cfg.ConsumerTimeout - c.cfg.ConsumerTimeoutMargin
	}
	work := c.cfg.Queue
	// Not cancelled with Run's context: Stop (at the session's end, after
	// the work queue drained) stops it, letting republishes in flight
	// finish and ack for up to ShutdownTimeout.
	r, err := release.Start(context.WithoutCancel(ctx), conn, release.Config{
		Queues:     qs,
		DueHeader:  HeaderDue,
		Prefetch:   c.cfg.Release.Prefetch,
		Publishers: c.cfg.Release.Publishers,
		HoldLimit:  hold,
		Tag:        c.cfg.ConsumerTag,
		Logger:     c.log,
		Publish: func(ctx context.Context, d *amqp.Delivery) error {
			return send.Publish(ctx, released(d, work))
		},
		Released: func(late time.Duration) {
			c.rec.Add(CountReleased, 1)
			if late > lateRelease {
				c.rec.Add(CountReleasedLate, 1)
			}
		},
		Failed: func(error) { c.rec.Add(CountReleaseFailed, 1) },
	})
	if err != nil { // only a programming error: Publish and DueHeader are set
		c.log.Error("idemq: cannot release delay queues", "err", err)
		return nil
	}
	return r
}

// released is the message that hands d, taken from a delay queue, back to
// the work queue: the same ID, body and properties, without the due time
// and the broker's delivery count.
func released(d *amqp.Delivery, queue string) Message {
	h := make(amqp.Table, len(d.Headers))
	for k, v := range d.Headers {
		h[k] = v
	}
	delete(h, HeaderDue)
	delete(h, HeaderDeliveryCount)
	delete(h, HeaderPublishSeq)
	id := d.MessageId
	if err := ValidateID(id); err != nil {
		// Not parked by idemq (its retries keep a valid ID): handed back
		// under a fresh ID, marked so the failure policy dead-letters it
		// before any handler runs, with the original ID recorded.
		reason := ReasonInvalidID
		if id == "" {
			reason = ReasonMissingID
		} else {
			h[HeaderOriginalMessageID] = truncateID(id)
		}
		id = NewMessageID()
		h[HeaderDeadLetterHeld] = reason
		h[HeaderQueue] = queue
		if _, ok := h[HeaderRequeues]; !ok {
			h[HeaderRequeues] = int64(1) // with HeaderQueue: idemq's own path
		}
	}
	m := MessageOf(d, "", queue, h)
	m.ID = id
	return m
}

// truncateID bounds an invalid ID kept in a header.
func truncateID(id string) string {
	const limit = 512
	if len(id) <= limit {
		return id
	}
	return id[:limit]
}
