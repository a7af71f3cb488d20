package idemq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/backoff"
	"github.com/idemq/idemq/internal/breaker"
	"github.com/idemq/idemq/internal/deadline"
	"github.com/idemq/idemq/internal/deliverylimit"
	"github.com/idemq/idemq/internal/failover"
	"github.com/idemq/idemq/internal/mgmt"
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

// ConsumerConfig configures a [Consumer]. Queue and Pipeline.Handler are
// required; every other field has a documented default, filled by
// [NewConsumer] (the zero value of a field means its default).
type ConsumerConfig struct {
	// URL of the broker. Default: IDEMQ_AMQP_URL, else [DefaultURL]
	// (when URLs is empty too).
	URL string
	// URLs lists the nodes of a cluster, one URL each (URL, when set too,
	// joins the list). Every (re)connect tries them in a fresh random
	// order, the node of the connection that just ended last, and takes
	// the first that answers; the Reconnect backoff runs between passes
	// over the whole list.
	URLs []string
	// Queue to consume from. Required.
	Queue string
	// Group names the consumer group: dedup keys and inbox rows are
	// namespaced by it, so two services consuming the same message each
	// process it once. Default: Queue.
	Group string
	// ID says where a delivery's message ID comes from; it is decided once
	// per delivery, before any layer runs, and every layer reads it with
	// [Delivery.ID]. The zero value uses the AMQP message_id only.
	ID IDConfig
	// Pipeline is what runs for each delivery, in a fixed order: the
	// failure policy, your middleware, the dedup guard, the handler (see
	// [Pipeline]). Pipeline.Handler is required.
	Pipeline Pipeline
	// Prefetch is the channel QoS (unacked deliveries in flight). Default 200.
	Prefetch int
	// Workers is the number of handler goroutines. Default 4, or the most
	// that Pipeline.Guard or Pipeline.Handler suggests when it implements
	// [WorkerHint] (the dedup guard on a store that groups calls, the
	// Redis store: enough workers for its round trips to be shared: 64
	// with the guard's defaults; the batch inbox, inbox.Batcher: two
	// batches' worth, 100 with its defaults).
	Workers int
	// AckBatch is the number of acks coalesced into one multiple-ack.
	// Default 50; 1 acks each delivery on its own.
	AckBatch int
	// AckFlushInterval bounds how long a coalesced ack waits. Default 20ms.
	AckFlushInterval time.Duration
	// Setup declares topology after each (re)connect. Optional.
	Setup SetupFunc
	// StartupAttempts bounds the connection attempts before the first
	// subscription: Run returns a [*StartupError] after that many failed
	// attempts. Default 0: retry until the context ends (the broker may
	// still be starting). Permanent errors (access refused, queue not
	// found, conflicting declaration, invalid URL) end Run at startup
	// whatever this is; after the first subscription every error is
	// retried.
	StartupAttempts int
	// LoginGrace is how long a refused login (AMQP 403 at connection open:
	// "username or password not allowed", "no access to this vhost") is
	// retried before the first subscription instead of ending Run as
	// permanent. A RabbitMQ node that is still booting refuses logins for
	// a moment, exactly as it refuses a wrong password, so a consumer
	// started during a broker restart (a supervisor, Kubernetes) would
	// otherwise exit. Default 10s; negative: a refused login is permanent
	// at once. Each refused attempt is logged at warn.
	LoginGrace time.Duration
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
	// (see [BreakerConfig]). On by default. The probes of the pipeline's
	// layers ([Prober]: the dedup guard, an inbox handler) are added to
	// Breaker.Probes.
	Breaker BreakerConfig
	// Release hands the failure policy's delayed retries back to Queue
	// when they are due (see [DelayedRetries], [ReleaseConfig]). On by
	// default when the policy parks deliveries in delay queues.
	Release ReleaseConfig
	// Dial overrides how the connection is made (tests use it to go through a
	// fault-injecting proxy). Default amqp.DialConfig.
	Dial func(url string, cfg amqp.Config) (*amqp.Connection, error)
	// ManagementURL is the broker's management HTTP API (the
	// rabbitmq_management plugin), with credentials:
	// http(s)://user:password@host:15672 (a monitoring user is enough).
	// When set, the consumer reads the delivery limit the broker applies
	// to Queue — the smallest of its x-delivery-limit argument and the
	// delivery-limit of the policy and operator policy that apply, which
	// AMQP cannot show — at startup and after every reconnect, logs it at
	// info with its source, and hands it to the failure policy with each
	// delivery ([Delivery.QueueDeliveryLimit]): retry.Policy then keeps
	// in-place requeues below it (see retry.Config.RequeueLimit). The
	// vhost is the connection's. If it cannot be read before the first
	// subscription, Run does not consume: a wrong password, a missing
	// permission or queue, a response idemq does not understand end Run
	// with a permanent [*StartupError]; anything else (the API not
	// answering) is retried like a connection failure, within
	// StartupAttempts. After the first subscription a failed read keeps
	// the last limit and logs a warning. A running consumer reads it
	// again every ManagementRefresh. Default "": not read (the
	// policy relies on its own RequeueLimit). Never logged or shown with
	// its password.
	ManagementURL string
	// ManagementTimeout bounds one read of the delivery limit, including
	// the wait for the statistics of a queue declared a moment ago (the
	// management API reports a queue's policy at its next statistics
	// collection, every 5 s by default). Default 30s.
	ManagementTimeout time.Duration
	// ManagementRefresh is how often a running consumer reads the limit
	// again, so a policy changed while it runs counts without a
	// reconnect (a failed refresh keeps the last limit and logs a
	// warning). Default 1 min; negative: only at each (re)connect.
	ManagementRefresh time.Duration
	// ManagementClient makes the management API requests (custom TLS
	// roots, a proxy). Default: net/http's client with a 10 s timeout per
	// request.
	ManagementClient *http.Client
}

// withDefaults returns c with every unset field at its default.
func (c ConsumerConfig) withDefaults() ConsumerConfig {
	if c.URL == "" && len(c.URLs) == 0 {
		c.URL = URLFromEnv()
	}
	if c.Group == "" {
		c.Group = c.Queue
	}
	if c.Prefetch <= 0 {
		c.Prefetch = 200
	}
	if c.Workers <= 0 {
		c.Workers = 4
		for _, l := range []any{c.Pipeline.Guard, c.Pipeline.Handler} {
			if h, ok := l.(WorkerHint); ok {
				c.Workers = max(c.Workers, min(h.SuggestWorkers(c.Prefetch), c.Prefetch))
			}
		}
	}
	if c.AckBatch <= 0 {
		c.AckBatch = 50
	}
	if c.LoginGrace == 0 {
		c.LoginGrace = DefaultLoginGrace
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = 30 * time.Second
	}
	if c.ConsumerTimeout == 0 {
		c.ConsumerTimeout = DefaultConsumerTimeout
	}
	if c.ConsumerTimeout > 0 && c.ConsumerTimeoutMargin == 0 {
		c.ConsumerTimeoutMargin = min(c.ConsumerTimeout/10, time.Minute)
	}
	if c.StuckHandlerAfter == 0 {
		c.StuckHandlerAfter = time.Minute
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = 10 * time.Second
	}
	if c.ConsumerTag == "" {
		c.ConsumerTag = "idemq-" + c.Group + "-" + NewMessageID()[24:]
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Dial == nil {
		c.Dial = amqp.DialConfig
	}
	if c.ManagementTimeout <= 0 {
		c.ManagementTimeout = 30 * time.Second
	}
	if c.ManagementRefresh == 0 {
		c.ManagementRefresh = time.Minute
	}
	c.Breaker = c.Breaker.withDefaults()
	c.Release = c.Release.withDefaults()
	if c.Pipeline.Policy == nil {
		c.Pipeline.Policy = BasePolicy{RetryAfter: c.Breaker.RetryAfter}
	}
	return c
}

// Validate reports a configuration the consumer cannot run with: no Queue,
// no handler, a negative HandlerTimeout, a ConsumerTimeoutMargin that is
// not below half of ConsumerTimeout.
func (c ConsumerConfig) Validate() error {
	if c.Queue == "" {
		return errors.New("idemq: ConsumerConfig.Queue is required")
	}
	if err := c.Pipeline.Validate(); err != nil {
		return err
	}
	c = c.withDefaults()
	if c.ManagementURL != "" {
		if _, err := mgmt.New(c.ManagementURL, c.ManagementClient); err != nil {
			return fmt.Errorf("idemq: ConsumerConfig.ManagementURL: %w", err)
		}
	}
	if c.HandlerTimeout < 0 {
		return fmt.Errorf("idemq: ConsumerConfig.HandlerTimeout %v is negative", c.HandlerTimeout)
	}
	if c.ConsumerTimeout > 0 && (c.ConsumerTimeoutMargin < 0 || c.ConsumerTimeoutMargin*2 >= c.ConsumerTimeout) {
		return fmt.Errorf("idemq: ConsumerConfig.ConsumerTimeoutMargin %v must be positive and less than half of ConsumerTimeout %v",
			c.ConsumerTimeoutMargin, c.ConsumerTimeout)
	}
	return nil
}

// Consumer consumes one queue with manual acks, coalesced into
// multiple-acks, and reconnects by itself. Create it with [NewConsumer] and
// call [Consumer.Run].
type Consumer struct {
	cfg      ConsumerConfig
	handler  Handler       // the pipeline's chain, inside the failure policy
	policy   FailurePolicy // decides; the executor carries out (process.go)
	counters *Counters
	rec      Recorder
	log      *slog.Logger
	watch    *deadline.Watchdog[*Delivery] // long-running handler warnings
	brk      *breaker.Breaker              // dependency outages (breaker.go)
	brokers  *failover.Brokers
	limits   *deliverylimit.Reader // the queue's delivery limit and consumer timeout; nil without ManagementURL

	mu      sync.Mutex
	running bool
	ready   chan struct{} // closed once the first consume is established
	readyOK bool

	consuming atomic.Bool // a session is subscribed now

	releaseWarned atomic.Bool // Release.Disabled logged once (release.go)
}

// NewConsumer validates cfg ([ConsumerConfig.Validate]), fills its
// defaults and returns a consumer that runs cfg.Pipeline.
func NewConsumer(cfg ConsumerConfig) (*Consumer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	c := &Consumer{cfg: cfg, log: cfg.Logger.With("queue", cfg.Queue, "group", cfg.Group), ready: make(chan struct{}),
		brokers: failover.New(cfg.URL, cfg.URLs)}
	if cfg.Recorder == nil {
		c.counters = &Counters{}
		c.rec = c.counters
	} else {
		c.rec = cfg.Recorder
		if cc, ok := cfg.Recorder.(*Counters); ok {
			c.counters = cc
		}
	}
	if cfg.ManagementURL != "" {
		m, err := mgmt.New(cfg.ManagementURL, cfg.ManagementClient)
		if err != nil {
			return nil, fmt.Errorf("idemq: ConsumerConfig.ManagementURL: %w", err)
		}
		c.limits = deliverylimit.New(deliverylimit.Config{Client: m, Queue: cfg.Queue, Timeout: cfg.ManagementTimeout,
			Ready: c.readyOnce, ConsumerTimeout: c.queueTimeoutRead, Logger: c.log})
	}
	c.watch = deadline.NewWatchdog[*Delivery](cfg.timeouts(), c.log, func() { c.rec.Add(CountStuckHandlers, 1) })
	c.policy = cfg.Pipeline.Policy
	c.handler = cfg.Pipeline.chain(c.deadline) // after c.limits: the deadline follows the queue's consumer timeout
	brk := cfg.Breaker
	brk.Probes = append(cfg.Pipeline.layerProbes(), brk.Probes...)
	c.brk = newBreaker(brk, c.rec, c.log)
	return c, nil
}

// Config returns the effective configuration (defaults filled, Workers
// as the pipeline's guard suggested it when unset).
func (c *Consumer) Config() ConsumerConfig { return c.cfg }

// Counters returns the consumer's in-memory counters (nil when a custom
// Recorder that is not a *Counters was configured).
func (c *Consumer) Counters() *Counters { return c.counters }

// Ready is closed once the consumer has subscribed for the first time
// (a startup probe). For a liveness or readiness check that follows
// reconnects, use [Consumer.Consuming].
func (c *Consumer) Ready() <-chan struct{} { return c.ready }

// Consuming reports whether the consumer is subscribed right now: false
// before the first subscription, while it reconnects and after Run
// returned. A health endpoint can answer 503 while it is false.
func (c *Consumer) Consuming() bool { return c.consuming.Load() }

// Run consumes until ctx is cancelled, then stops taking deliveries,
// finishes and acks the ones in flight, and returns nil. Connection losses,
// channel errors and broker-side cancels are retried with backoff. Before
// the first subscription, a permanent error (wrong credentials, queue not
// found, invalid URL; see [StartupError]) or StartupAttempts failed
// attempts end Run with an error matching [ErrStartup], so a program can
// tell "never connected" from a clean stop. Run also returns an error for
// a misuse (Run called twice at once).
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
	go c.watch.Run(wctx)
	defer stopWatch()

	failures := 0
	start := time.Now()
	for {
		established, err := c.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if established {
			failures = 0
		} else if !c.readyOnce() {
			if isPermanentStartup(err) && !(isLoginRefused(err) && time.Since(start) < c.cfg.LoginGrace) {
				return &StartupError{Attempts: failures + 1, Permanent: true, Err: err}
			}
			if c.cfg.StartupAttempts > 0 && failures+1 >= c.cfg.StartupAttempts {
				return &StartupError{Attempts: failures + 1, Err: err}
			}
		}
		c.log.Warn("idemq: consumer session ended; reconnecting", "err", err, "attempt", failures+1)
		if err := backoff.Sleep(ctx, c.cfg.Reconnect.Delay(failures)); err != nil {
			return nil
		}
		failures++
		c.rec.Add(CountReconnects, 1)
	}
}

// readyOnce reports whether the consumer has subscribed at least once.
func (c *Consumer) readyOnce() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.readyOK
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
