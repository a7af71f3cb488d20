package breaker

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/backoff"
)

// Config configures a [Breaker]. The numbers are used as given: the
// caller fills their defaults (idemq.BreakerConfig documents them).
type Config struct {
	// Disabled turns the breaker off: Gate never holds deliveries back and
	// Ask never asks.
	Disabled bool
	// Threshold is the number of consecutive outages reported that open
	// the breaker.
	Threshold int
	// Probes check the dependencies; without them the breaker lets one
	// delivery through at a time (half-open) to find out.
	Probes []func(ctx context.Context) error
	// Backoff between probe rounds (or half-open trials).
	Backoff backoff.Policy
	// ProbeTimeout bounds one probe round.
	ProbeTimeout time.Duration
	// AskTimeout bounds the probe run of Ask; negative: never ask.
	AskTimeout time.Duration
	// AskReuse is how long an answer of the probes decides later Asks.
	AskReuse time.Duration

	// IsOutage reports whether a run's error says a dependency is down.
	// Required.
	IsOutage func(err error) bool
	// Askable reports whether a run's error leaves open whether a
	// dependency is down: Ask asks the probes about it only then.
	// Default: never.
	Askable func(err error) bool
	// Outage is the error Ask returns for err when the probes say a
	// dependency is down (probeErr: the probe's failure). Required with
	// Askable.
	Outage func(err, probeErr error) error
	// Dependency names the dependency an outage's error reports (logs).
	// Default "?".
	Dependency func(err error) string
	// Opened is called once when an outage begins, Closed once when it
	// ends, with its length. Both optional; called with the breaker's
	// lock held, so they must not call the breaker.
	Opened func()
	Closed func(outage time.Duration)
	// Logger; default slog.Default().
	Logger *slog.Logger
}

const (
	closed int32 = iota
	open
	halfOpen
)

// Breaker is the consumer's circuit breaker. The consumer's dispatch loop
// asks Gate before each receive and tells Dispatched what it handed out;
// workers Report every run's outcome.
type Breaker struct {
	cfg Config
	log *slog.Logger

	state atomic.Int32 // fast path for Report
	fails atomic.Int32 // consecutive outages reported while closed

	mu      sync.Mutex
	since   time.Time // outage start
	round   int       // failed probe rounds / trials in this outage
	retryAt time.Time
	probing bool
	trial   bool // half-open: the trial delivery is out
	wake    chan struct{}
	timer   *time.Timer
	cause   error

	asked askState // ask.go
}

// New returns a closed breaker.
func New(cfg Config) *Breaker {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Breaker{cfg: cfg, log: log, wake: make(chan struct{})}
}

// Config returns the breaker's configuration.
func (b *Breaker) Config() Config { return b.cfg }

// notify wakes the dispatch loop. Called with mu held.
func (b *Breaker) notify() {
	close(b.wake)
	b.wake = make(chan struct{})
}

// Gate returns the channel the dispatch loop may receive deliveries from
// (nil while paused) and a channel closed when that may have changed.
func (b *Breaker) Gate(ctx context.Context, in <-chan amqp.Delivery) (<-chan amqp.Delivery, <-chan struct{}) {
	if b.cfg.Disabled {
		return in, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state.Load() {
	case closed:
		return in, b.wake // woken when it opens
	case open:
		if time.Now().Before(b.retryAt) {
			return nil, b.wake
		}
		if len(b.cfg.Probes) > 0 {
			if !b.probing {
				b.probing = true
				go b.probe(ctx)
			}
			return nil, b.wake
		}
		b.state.Store(halfOpen)
		b.trial = false
		fallthrough
	default: // half-open
		if b.trial {
			return nil, b.wake
		}
		return in, b.wake
	}
}

// Dispatched tells the breaker a delivery was handed to a worker (the
// half-open trial, when half-open).
func (b *Breaker) Dispatched() {
	if b.cfg.Disabled || b.state.Load() != halfOpen {
		return
	}
	b.mu.Lock()
	if b.state.Load() == halfOpen {
		b.trial = true
	}
	b.mu.Unlock()
}

// Report records the outcome of one delivery's handler chain: nil is a
// success (the dependencies answered), an outage (Config.IsOutage) a
// failure; other errors say nothing about the dependencies.
func (b *Breaker) Report(err error) {
	if b.cfg.Disabled {
		return
	}
	outage := err != nil && b.cfg.IsOutage(err)
	if b.state.Load() == closed {
		switch {
		case err == nil:
			if b.fails.Load() != 0 {
				b.fails.Store(0)
			}
			return
		case !outage:
			return
		}
		if b.fails.Add(1) < int32(b.cfg.Threshold) {
			return
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch st := b.state.Load(); {
	case outage && st == closed:
		b.since, b.round, b.cause = time.Now(), 0, err
		if b.cfg.Opened != nil {
			b.cfg.Opened()
		}
		b.log.Warn("idemq: dependency unavailable; consumer paused (deliveries are given back, not counted as attempts)",
			"dependency", b.dependency(err), "err", err)
		b.reopen()
	case outage && st == halfOpen:
		b.round++
		b.reopen()
	case err == nil && st != closed:
		b.close()
	case err != nil && st == halfOpen:
		b.trial = false // the trial said nothing: let another through
		b.notify()
	}
}

// reopen sets the breaker open until the next probe or trial. mu held.
func (b *Breaker) reopen() {
	b.state.Store(open)
	b.trial = false
	d := b.cfg.Backoff.Delay(b.round)
	b.retryAt = time.Now().Add(d)
	if b.timer != nil {
		b.timer.Stop()
	}
	b.timer = time.AfterFunc(d, func() {
		b.mu.Lock()
		b.notify()
		b.mu.Unlock()
	})
	b.notify()
}

// close resumes the consumer. mu held.
func (b *Breaker) close() {
	if b.state.Load() == closed {
		return
	}
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	outage := time.Since(b.since)
	b.state.Store(closed)
	b.fails.Store(0)
	b.trial = false
	if b.cfg.Closed != nil {
		b.cfg.Closed(outage)
	}
	b.log.Warn("idemq: dependency back; consumer resumed",
		"dependency", b.dependency(b.cause), "outage", outage.Round(time.Millisecond), "probes", b.round+1)
	b.notify()
}

// probe runs one round of probes and closes or reopens the breaker.
func (b *Breaker) probe(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, b.cfg.ProbeTimeout)
	var err error
	for _, p := range b.cfg.Probes {
		if err = p(pctx); err != nil {
			break
		}
	}
	cancel()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = false
	if b.state.Load() != open {
		return
	}
	if err == nil {
		b.close()
		return
	}
	if ctx.Err() != nil {
		return
	}
	b.round++
	b.log.Debug("idemq: dependency probe failed", "err", err, "round", b.round)
	b.reopen()
}

// Paused reports whether the breaker holds the consumer.
func (b *Breaker) Paused() bool { return !b.cfg.Disabled && b.state.Load() != closed }

func (b *Breaker) dependency(err error) string {
	if b.cfg.Dependency == nil {
		return "?"
	}
	return b.cfg.Dependency(err)
}
