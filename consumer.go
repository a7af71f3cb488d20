package idemq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/internal/acker"
	"github.com/idemq/idemq/internal/backoff"
)

// DefaultURL is the broker used when a config leaves URL empty and
// IDEMQ_AMQP_URL is unset.
const DefaultURL = "amqp://guest:guest@127.0.0.1:5672/"

// URLFromEnv returns IDEMQ_AMQP_URL, or [DefaultURL].
func URLFromEnv() string {
	if u := os.Getenv("IDEMQ_AMQP_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// SetupFunc declares topology on a fresh channel. The consumer and the
// publisher call it after every (re)connect, so it must be idempotent.
type SetupFunc func(ctx context.Context, ch *amqp.Channel) error

// ConsumerConfig configures a [Consumer]. Only Queue is required; every other
// field has a documented default.
type ConsumerConfig struct {
	// URL of the broker. Default: IDEMQ_AMQP_URL, else [DefaultURL]
	// (when URLs is empty too).
	URL string
	// URLs lists the nodes of a cluster, one URL each (URL, when set too,
	// joins the list). Every (re)connect tries them in a fresh random
	// order, the node of the connection that just ended last, and takes
	// the first that answers; the Reconnect backoff runs between passes
	// over the whole list (see failover.go).
	URLs []string
	// Queue to consume from. Required.
	Queue string
	// Group names the consumer group: dedup keys and inbox rows are
	// namespaced by it, so two services consuming the same message each
	// process it once. Default: Queue.
	Group string
	// ID says where a delivery's message ID comes from; it is decided once
	// per delivery, before any middleware, and every layer reads it with
	// [Delivery.ID]. The zero value uses the AMQP message_id only.
	ID IDConfig
	// Prefetch is the channel QoS (unacked deliveries in flight). Default 200.
	Prefetch int
	// Workers is the number of handler goroutines. Default 4.
	Workers int
	// AckBatch is the number of acks coalesced into one multiple-ack.
	// Default 50; 1 acks each delivery on its own.
	AckBatch int
	// AckFlushInterval bounds how long a coalesced ack waits. Default 20ms.
	AckFlushInterval time.Duration
	// Setup declares topology after each (re)connect. Optional.
	Setup SetupFunc
	// Middleware wraps the handler; the first is the outermost. A panic
	// recoverer is always installed outside them.
	Middleware []Middleware
	// Reconnect is the backoff between connection attempts.
	// Default 100ms doubling to 10s, with jitter.
	Reconnect backoff.Policy
	// ShutdownTimeout is how long in-flight handlers may run after the Run
	// context is cancelled before their own context is cancelled. Default 30s.
	ShutdownTimeout time.Duration
	// HandlerTimeout bounds one run of the handler: its context gets a
	// deadline (cause [ErrHandlerTimeout]), and a handler that fails after
	// it is a failed attempt ([*HandlerTimeoutError]) for the failure
	// policy — the dedup guard releases its claim, the inbox rolls back.
	// Default 0: no limit of its own; the handler is still bounded below
	// ConsumerTimeout (29 min with the defaults). See consumer_timeout.go.
	HandlerTimeout time.Duration
	// ConsumerTimeout is the broker's consumer_timeout for this queue (the
	// broker closes the channel and redelivers when a delivery stays
	// unacked that long). Handlers are bounded below it: the effective
	// handler deadline is min(start+HandlerTimeout, receipt +
	// ConsumerTimeout - ConsumerTimeoutMargin). Default
	// [DefaultConsumerTimeout] (30 min, RabbitMQ's default); set it to the
	// broker's value when lower; negative: the broker has none.
	ConsumerTimeout time.Duration
	// ConsumerTimeoutMargin is how long before ConsumerTimeout handlers are
	// cancelled, leaving time to settle the delivery; a delivery that
	// waited in the consumer until less than this is left is given back
	// without running. Default ConsumerTimeout/10, at most 1 min.
	ConsumerTimeoutMargin time.Duration
	// StuckHandlerAfter logs a delivery still being handled after this
	// long (message ID, age), again at every doubling, and counts it
	// ([CountStuckHandlers]). Default 1 min; negative: never.
	StuckHandlerAfter time.Duration
	// Heartbeat for the AMQP connection. Default 10s.
	Heartbeat time.Duration
	// ConsumerTag; default "idemq-<group>-<random>".
	ConsumerTag string
	// Recorder receives counters; default an in-memory [Counters]
	// (see [Consumer.Counters]).
	Recorder Recorder
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Breaker pauses taking deliveries while a dependency is unavailable
	// (see [BreakerConfig]). On by default.
	Breaker BreakerConfig
	// Dial overrides how the connection is made (tests use it to go through a
	// fault-injecting proxy). Default amqp.DialConfig.
	Dial func(url string, cfg amqp.Config) (*amqp.Connection, error)
}

// Consumer consumes one queue with manual acks, coalesced into
// multiple-acks, and reconnects by itself. Create it with [NewConsumer] and
// call [Consumer.Run].
type Consumer struct {
	cfg      ConsumerConfig
	handler  Handler
	counters *Counters
	rec      Recorder
	log      *slog.Logger
	watch    *watchdog // long-running handler warnings (consumer_timeout.go)
	brk      *breaker  // dependency outages (breaker.go)
	brokers  *brokers  // URL failover (failover.go)

	mu      sync.Mutex
	running bool
	ready   chan struct{} // closed once the first consume is established
	readyOK bool
}

// NewConsumer validates cfg, fills defaults and returns a consumer that runs h.
func NewConsumer(cfg ConsumerConfig, h Handler) (*Consumer, error) {
	if cfg.Queue == "" {
		return nil, errors.New("idemq: ConsumerConfig.Queue is required")
	}
	if h == nil {
		return nil, errors.New("idemq: nil handler")
	}
	if cfg.URL == "" && len(cfg.URLs) == 0 {
		cfg.URL = URLFromEnv()
	}
	if cfg.Group == "" {
		cfg.Group = cfg.Queue
	}
	if cfg.Prefetch <= 0 {
		cfg.Prefetch = 200
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.AckBatch <= 0 {
		cfg.AckBatch = 50
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 30 * time.Second
	}
	if err := timeoutDefaults(&cfg); err != nil {
		return nil, err
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 10 * time.Second
	}
	if cfg.ConsumerTag == "" {
		cfg.ConsumerTag = "idemq-" + cfg.Group + "-" + NewMessageID()[24:]
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Dial == nil {
		cfg.Dial = amqp.DialConfig
	}
	c := &Consumer{cfg: cfg, log: cfg.Logger.With("queue", cfg.Queue, "group", cfg.Group), ready: make(chan struct{}),
		brokers: newBrokers(cfg.URL, cfg.URLs)}
	if cfg.Recorder == nil {
		c.counters = &Counters{}
		c.rec = c.counters
	} else {
		c.rec = cfg.Recorder
		if cc, ok := cfg.Recorder.(*Counters); ok {
			c.counters = cc
		}
	}
	c.watch = newWatchdog(c)
	// The handler's deadline is innermost: the middlewares keep a live
	// context to release, roll back and republish after a timeout.
	c.handler = Chain(c.deadline(h), append([]Middleware{Recover()}, cfg.Middleware...)...)
	c.brk = newBreaker(cfg.Breaker, c.rec, c.log)
	return c, nil
}

// Counters returns the consumer's in-memory counters (nil when a custom
// Recorder that is not a *Counters was configured).
func (c *Consumer) Counters() *Counters { return c.counters }

// Ready is closed once the consumer has subscribed for the first time.
func (c *Consumer) Ready() <-chan struct{} { return c.ready }

// Run consumes until ctx is cancelled, then stops taking deliveries,
// finishes and acks the ones in flight, and returns nil. Connection losses,
// channel errors and broker-side cancels are retried with backoff. Run
// returns an error only for a misuse (Run called twice at once).
func (c *Consumer) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.running {
		c.mu.Unlock()
		return errors.New("idemq: Consumer.Run called twice")
	}
	c.running = true
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.running = false
		c.mu.Unlock()
	}()
	wctx, stopWatch := context.WithCancel(context.WithoutCancel(ctx))
	go c.watch.run(wctx)
	defer stopWatch()

	failures := 0
	for {
		established, err := c.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if established {
			failures = 0
		}
		c.log.Warn("idemq: consumer session ended; reconnecting", "err", err, "attempt", failures+1)
		if err := backoff.Sleep(ctx, c.cfg.Reconnect.Delay(failures)); err != nil {
			return nil
		}
		failures++
		c.rec.Add(CountReconnects, 1)
	}
}

type job struct {
	d   amqp.Delivery
	del *Delivery
}

// session runs one connection's lifetime. It reports whether the consume was
// established (to reset the backoff) and why it ended.
func (c *Consumer) session(ctx context.Context) (bool, error) {
	conn, broker, err := c.brokers.dial(c.cfg.Dial, amqp.Config{
		Heartbeat:  c.cfg.Heartbeat,
		Locale:     "en_US",
		Properties: amqp.Table{"connection_name": "idemq consumer " + c.cfg.ConsumerTag},
	})
	if err != nil {
		return false, fmt.Errorf("dial: %w", err)
	}
	c.log.Debug("idemq: consumer connected", "broker", broker)
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return false, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return false, fmt.Errorf("qos: %w", err)
	}
	if c.cfg.Setup != nil {
		if err := c.cfg.Setup(ctx, ch); err != nil {
			return false, fmt.Errorf("setup topology: %w", err)
		}
	}
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
	cancelled := ch.NotifyCancel(make(chan string, 1))
	deliveries, err := ch.ConsumeWithContext(context.WithoutCancel(ctx), c.cfg.Queue, c.cfg.ConsumerTag, false, false, false, false, nil)
	if err != nil {
		return false, fmt.Errorf("consume %q: %w", c.cfg.Queue, err)
	}
	c.mu.Lock()
	if !c.readyOK {
		c.readyOK = true
		close(c.ready)
	}
	c.mu.Unlock()
	c.log.Debug("idemq: consuming", "tag", c.cfg.ConsumerTag)

	ack := acker.New(ch, acker.Config{
		MaxBatch:      c.cfg.AckBatch,
		FlushInterval: c.cfg.AckFlushInterval,
		OnError: func(err error) {
			c.log.Warn("idemq: ack frame failed; the broker will redeliver", "err", err)
		},
	})

	// Handlers run under hctx: not cancelled by the Run context (so they can
	// finish on shutdown), cancelled when the channel dies (their ack is
	// impossible, the broker redelivers) or after ShutdownTimeout.
	hctx, hcancel := context.WithCancel(WithRecorder(context.WithoutCancel(ctx), c.rec))
	defer hcancel()

	rq := newRequeuer(ack, c.rec, c.log)
	// Buffered to the prefetch window (the broker never has more unacked
	// deliveries on the channel), so dispatch never blocks and a delivery's
	// ReceivedAt is when it arrived, not when a worker was free: the
	// ConsumerTimeout bound counts from there.
	work := make(chan job, c.cfg.Prefetch)
	var wg sync.WaitGroup
	for i := 0; i < c.cfg.Workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range work {
				c.process(hctx, ack, rq, j)
			}
		}()
	}

	var endErr error
	graceful := false
loop:
	for {
		in, wake := c.brk.gate(ctx, deliveries) // nil while a dependency is down
		select {
		case <-wake:
		case <-ctx.Done():
			graceful = true
			break loop
		case e := <-connClosed:
			endErr = fmt.Errorf("connection closed: %w", amqpErr(e))
			break loop
		case e := <-chClosed:
			endErr = fmt.Errorf("channel closed: %w", amqpErr(e))
			break loop
		case tag := <-cancelled:
			endErr = fmt.Errorf("consumer %s cancelled by the broker (queue deleted or failed over)", tag)
			break loop
		case d, ok := <-in:
			if !ok {
				endErr = errors.New("delivery stream closed")
				break loop
			}
			c.brk.dispatched()
			if !c.dispatch(ack, work, d) {
				endErr = errors.New("acker closed")
				break loop
			}
		}
	}

	if graceful {
		// Stop taking deliveries; the ones the client already holds are
		// finished like the others.
		if err := ch.Cancel(c.cfg.ConsumerTag, false); err == nil {
			timeout := time.NewTimer(c.cfg.ShutdownTimeout)
		drain:
			for {
				select {
				case d, ok := <-deliveries:
					if !ok {
						break drain
					}
					c.dispatch(ack, work, d)
				case <-chClosed:
					break drain
				case <-timeout.C:
					break drain
				}
			}
			timeout.Stop()
		}
	} else {
		// The channel is gone: its tags are dead, the broker redelivers.
		hcancel()
		ack.Abandon()
	}
	close(work)
	waitTimeout(&wg, c.cfg.ShutdownTimeout, hcancel)
	rq.flush()
	if graceful {
		ack.Close()
		_ = ch.Close()
	}
	return true, endErr
}

func (c *Consumer) dispatch(ack *acker.Acker, work chan<- job, d amqp.Delivery) bool {
	if err := ack.Register(d.DeliveryTag); err != nil {
		return false
	}
	c.rec.Add(CountDelivered, 1)
	if d.Redelivered {
		c.rec.Add(CountRedelivered, 1)
	}
	del := newDelivery(&d, c.cfg.Queue, c.cfg.Group, time.Now())
	c.cfg.ID.Apply(del)
	work <- job{d: d, del: del}
	return true
}

func (c *Consumer) process(ctx context.Context, ack *acker.Acker, rq *requeuer, j job) {
	if c.expired(ctx, ack, j) {
		return
	}
	defer c.watch.track(j.del)()
	err := c.handler.Handle(ctx, j.del)
	tag := j.d.DeliveryTag
	c.brk.report(err)
	if err == nil {
		c.rec.Add(CountAcked, 1)
		_ = ack.Ack(tag)
		return
	}
	c.rec.Add(CountFailed, 1)
	var pe *PanicError
	if errors.As(err, &pe) {
		c.rec.Add(CountPanics, 1)
		c.log.Error("idemq: handler panicked", "message_id", j.del.LogID(), "panic", fmt.Sprint(pe.Value), "stack", string(pe.Stack))
	}
	if IsUnavailable(err) {
		c.rec.Add(CountUnavailable, 1)
	}
	if c.brk.giveBack(rq, tag, err, ctx.Err() != nil) {
		return
	}
	var re *RequeueError
	if errors.As(err, &re) {
		after := re.After
		if ctx.Err() != nil {
			after = 0 // shutting down: give it back at once
		}
		rq.later(tag, after)
		c.log.Debug("idemq: delivery requeued for later", "message_id", j.del.LogID(), "after", after, "reason", re.Reason)
		return
	}
	if ctx.Err() != nil {
		// The handler was cut short by shutdown or a lost channel: it did
		// not fail on its own, so give the delivery back rather than
		// dead-letter it.
		c.rec.Add(CountRequeued, 1)
		_ = ack.Nack(tag, true)
		return
	}
	if c.timedOutBelowBroker(ack, j, err) {
		return
	}
	// No failure policy took the error: reject without requeue (it is
	// dead-lettered if the queue has a dead-letter exchange). Never a
	// requeue loop.
	c.rec.Add(CountRejected, 1)
	c.log.Warn("idemq: handler failed; delivery rejected without requeue",
		"message_id", j.del.LogID(), "reason", ReasonOf(err), "err", err)
	_ = ack.Nack(tag, false)
}

// requeuer nacks deliveries with requeue after a delay, without holding a
// worker. On shutdown the pending ones are requeued at once.
type requeuer struct {
	ack *acker.Acker
	rec Recorder
	log *slog.Logger

	mu     sync.Mutex
	timers map[uint64]*time.Timer
}

func newRequeuer(ack *acker.Acker, rec Recorder, log *slog.Logger) *requeuer {
	return &requeuer{ack: ack, rec: rec, log: log, timers: map[uint64]*time.Timer{}}
}

func (r *requeuer) later(tag uint64, after time.Duration) {
	if after < 0 {
		after = 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.timers[tag] = time.AfterFunc(after, func() {
		r.mu.Lock()
		_, mine := r.timers[tag]
		delete(r.timers, tag)
		r.mu.Unlock()
		if mine {
			r.rec.Add(CountRequeued, 1)
			_ = r.ack.Nack(tag, true)
		}
	})
}

func (r *requeuer) flush() {
	r.mu.Lock()
	tags := make([]uint64, 0, len(r.timers))
	for tag, t := range r.timers {
		t.Stop()
		tags = append(tags, tag)
	}
	r.timers = map[uint64]*time.Timer{}
	r.mu.Unlock()
	for _, tag := range tags {
		r.rec.Add(CountRequeued, 1)
		_ = r.ack.Nack(tag, true)
	}
}

func waitTimeout(wg *sync.WaitGroup, d time.Duration, onTimeout func()) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		onTimeout()
		<-done
	}
}

func amqpErr(e *amqp.Error) error {
	if e == nil {
		return errors.New("closed")
	}
	return e
}
