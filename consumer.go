package idemq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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

// Consumer consumes one queue with manual acks, coalesced into
// multiple-acks, and reconnects by itself. Create it with [NewConsumer] and
// call [Consumer.Run].
type Consumer struct {
	cfg      ConsumerConfig
	handler  Handler       // the pipeline's chain, inside the failure policy
	policy   FailurePolicy // decides; the executor carries out (settle.go)
	counters *Counters
	rec      Recorder
	log      *slog.Logger
	watch    *deadline.Watchdog[*Delivery] // long-running handler warnings
	brk      *breaker.Breaker              // dependency outages (BreakerConfig)
	brokers  *failover.Brokers             // URL failover
	limits   *deliverylimit.Reader         // the queue's delivery limit and consumer timeout; nil without ManagementURL

	mu      sync.Mutex
	running bool
	ready   chan struct{} // closed once the first consume is established
	readyOK bool

	consuming atomic.Bool // a session is subscribed now

	releaseWarned atomic.Bool // Release.Disabled logged once (startRelease)
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

// newBreaker returns the consumer's breaker for cfg: idemq's error
// classes decide what is an outage, the counters count outages
// ([CountDependencyOutages], [CountPausedMillis], [CountProbedOutages]).
func newBreaker(cfg BreakerConfig, rec Recorder, log *slog.Logger) *breaker.Breaker {
	cfg = cfg.withDefaults()
	return breaker.New(breaker.Config{
		Disabled:     cfg.Disabled,
		Threshold:    cfg.Threshold,
		Probes:       cfg.Probes,
		Backoff:      cfg.Backoff,
		ProbeTimeout: cfg.ProbeTimeout,
		AskTimeout:   cfg.AskTimeout,
		AskReuse:     cfg.AskReuse,
		IsOutage:     IsUnavailable,
		Askable:      askable,
		Outage: func(err, probeErr error) error {
			rec.Add(CountProbedOutages, 1)
			return &UnavailableError{Dependency: "probe", Err: fmt.Errorf("%w (asked, a probe failed too: %v)", err, probeErr)}
		},
		Dependency: dependencyOf,
		Opened:     func() { rec.Add(CountDependencyOutages, 1) },
		Closed:     func(outage time.Duration) { rec.Add(CountPausedMillis, outage.Milliseconds()) },
		Logger:     log,
	})
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

// Paused reports whether the consumer is paused by its breaker because a
// dependency is unavailable (see [BreakerConfig]).
func (c *Consumer) Paused() bool { return c.brk.Paused() }

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
	if c.cfg.AtStart != nil {
		sctx, stopStart := context.WithCancel(ctx)
		defer stopStart()
		go func() {
			defer func() {
				if r := recover(); r != nil {
					c.log.Error("idemq: ConsumerConfig.AtStart panicked", "panic", r)
				}
			}()
			c.cfg.AtStart(sctx)
		}()
	}

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

func (c *Consumer) markReady() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.readyOK {
		c.readyOK = true
		close(c.ready)
	}
}

// permanentAMQP are the AMQP reply codes that retrying the same connect,
// declare and consume cannot change.
var permanentAMQP = map[int]bool{
	amqp.AccessRefused:      true, // 403: wrong credentials, no permission on the vhost, queue or exchange
	amqp.NotFound:           true, // 404: the queue (or an exchange Setup binds) does not exist
	amqp.PreconditionFailed: true, // 406: a declaration that conflicts with the existing one
	amqp.NotAllowed:         true, // 530: the vhost does not exist or may not be used
}

// isLoginRefused reports whether err (or, over several brokers, any of
// them) is a login the broker refused at connection open. amqp091-go
// returns [amqp.ErrCredentials] or [amqp.ErrVhost] when the broker closes
// the socket during the handshake, which a booting node does too.
func isLoginRefused(err error) bool {
	return errors.Is(err, amqp.ErrCredentials) || errors.Is(err, amqp.ErrVhost)
}

// isPermanentStartup reports whether err, from a session that never
// subscribed, cannot be fixed by retrying. A failed pass over several
// brokers is permanent only when every broker's error is.
func isPermanentStartup(err error) bool {
	if err == nil {
		return false
	}
	var all *failover.AllFailed
	if errors.As(err, &all) {
		for _, e := range all.Errs {
			if !isPermanentStartup(e) {
				return false
			}
		}
		return len(all.Errs) > 0
	}
	if errors.Is(err, ErrInvalidURL) || mgmt.Permanent(err) {
		return true
	}
	var ae *amqp.Error
	return errors.As(err, &ae) && permanentAMQP[ae.Code]
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
