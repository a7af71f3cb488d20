package idemq

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/backoff"
)

// BreakerConfig configures the consumer's dependency circuit breaker.
//
// A dependency that is down (the database, the dedup store) is not the
// message's fault. When handlers report it — an error for which
// [IsUnavailable] holds, as the inbox, the dedup guard and the retry
// policy return for a lost connection or a store that does not answer —
// the breaker opens: the consumer stops taking deliveries from the broker
// (what the client already holds stays unacked in its buffer, not
// processed), the deliveries in flight are given back with requeue (not
// counted as attempts), and it waits for the dependency:
//
//   - with Probes: it runs them (after a backoff that grows per failed
//     round) and resumes when every one succeeds;
//   - without: after each backoff it lets one delivery through
//     (half-open); the breaker closes when that delivery's handler chain
//     succeeds and opens again when it reports the dependency unavailable.
//
// Each outage is logged twice (when the consumer pauses, and when it
// resumes, with the outage's duration) and counted: [CountDependencyOutages]
// once per outage, [CountPausedMillis] its length, [CountUnavailable] each
// delivery given back.
type BreakerConfig struct {
	// Disabled turns the breaker off: deliveries keep being taken while a
	// dependency is down (each is still given back uncounted).
	Disabled bool
	// Threshold is the number of consecutive deliveries reporting a
	// dependency unavailable that open the breaker. Default 1: the first
	// one (a probe closes it again at once if it was a blip).
	Threshold int
	// Probes check the dependencies (the inbox's Probe, dedup.Probe(store),
	// a db.PingContext). Optional; see above.
	Probes []func(ctx context.Context) error
	// Backoff between probe rounds (or half-open trials). Default 100ms
	// doubling to 2s, with jitter: the consumer resumes within about 2s of
	// the dependency's return.
	Backoff backoff.Policy
	// ProbeTimeout bounds one probe round. Default 5s.
	ProbeTimeout time.Duration
	// RetryAfter is how long a delivery that reported a dependency
	// unavailable waits before the consumer gives it back, when its error
	// does not say (a [RequeueError]'s After). Default 1s.
	RetryAfter time.Duration
	// AskTimeout bounds the probe run that decides whether a failure in a
	// shape nobody listed is an outage (see breaker_ask.go): with Probes,
	// a failed run whose error is not a duplicate, permanent, rejected,
	// a deferral or already an outage is an attempt only if every probe
	// passes within AskTimeout; otherwise it is an outage, not counted.
	// Default 2s; negative: never ask (only errors for which
	// [IsUnavailable] holds are outages).
	AskTimeout time.Duration
	// AskReuse is how long a probe answer decides later failures without
	// asking again. Default 250ms.
	AskReuse time.Duration
}

func (c BreakerConfig) withDefaults() BreakerConfig {
	if c.Threshold <= 0 {
		c.Threshold = 1
	}
	if c.Backoff.Min <= 0 {
		c.Backoff.Min = 100 * time.Millisecond
	}
	if c.Backoff.Max <= 0 {
		c.Backoff.Max = 2 * time.Second
	}
	if c.ProbeTimeout <= 0 {
		c.ProbeTimeout = 5 * time.Second
	}
	if c.RetryAfter <= 0 {
		c.RetryAfter = time.Second
	}
	if c.AskTimeout == 0 {
		c.AskTimeout = 2 * time.Second
	}
	if c.AskReuse <= 0 {
		c.AskReuse = 250 * time.Millisecond
	}
	return c
}

const (
	breakerClosed int32 = iota
	breakerOpen
	breakerHalfOpen
)

// breaker is the consumer's circuit breaker (see [BreakerConfig]). The
// consumer's dispatch loop asks gate before each receive; workers report
// every outcome.
type breaker struct {
	cfg BreakerConfig
	rec Recorder
	log *slog.Logger

	state atomic.Int32 // fast path for report
	fails atomic.Int32 // consecutive unavailable outcomes while closed

	mu      sync.Mutex
	since   time.Time // outage start
	round   int       // failed probe rounds / trials in this outage
	retryAt time.Time
	probing bool
	trial   bool // half-open: the trial delivery is out
	wake    chan struct{}
	timer   *time.Timer
	cause   error

	asked askState // breaker_ask.go
}

func newBreaker(cfg BreakerConfig, rec Recorder, log *slog.Logger) *breaker {
	return &breaker{cfg: cfg.withDefaults(), rec: rec, log: log, wake: make(chan struct{})}
}

// notify wakes the dispatch loop. Called with mu held.
func (b *breaker) notify() {
	close(b.wake)
	b.wake = make(chan struct{})
}

// gate returns the channel the dispatch loop may receive deliveries from
// (nil while paused) and a channel closed when that may have changed.
func (b *breaker) gate(ctx context.Context, in <-chan amqp.Delivery) (<-chan amqp.Delivery, <-chan struct{}) {
	if b.cfg.Disabled {
		return in, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state.Load() {
	case breakerClosed:
		return in, b.wake // woken when it opens
	case breakerOpen:
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
		b.state.Store(breakerHalfOpen)
		b.trial = false
		fallthrough
	default: // half-open
		if b.trial {
			return nil, b.wake
		}
		return in, b.wake
	}
}

// dispatched tells the breaker a delivery was handed to a worker (the
// half-open trial, when half-open).
func (b *breaker) dispatched() {
	if b.cfg.Disabled || b.state.Load() != breakerHalfOpen {
		return
	}
	b.mu.Lock()
	if b.state.Load() == breakerHalfOpen {
		b.trial = true
	}
	b.mu.Unlock()
}

// report records the outcome of one delivery's handler chain: nil is a
// success (the dependencies answered), an unavailable error a failure;
// other errors say nothing about the dependencies.
func (b *breaker) report(err error) {
	if b.cfg.Disabled {
		return
	}
	unavailable := err != nil && IsUnavailable(err)
	if b.state.Load() == breakerClosed {
		switch {
		case err == nil:
			if b.fails.Load() != 0 {
				b.fails.Store(0)
			}
			return
		case !unavailable:
			return
		}
		if b.fails.Add(1) < int32(b.cfg.Threshold) {
			return
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch st := b.state.Load(); {
	case unavailable && st == breakerClosed:
		b.since, b.round, b.cause = time.Now(), 0, err
		b.rec.Add(CountDependencyOutages, 1)
		b.log.Warn("idemq: dependency unavailable; consumer paused (deliveries are given back, not counted as attempts)",
			"dependency", dependencyOf(err), "err", err)
		b.reopen()
	case unavailable && st == breakerHalfOpen:
		b.round++
		b.reopen()
	case err == nil && st != breakerClosed:
		b.close()
	case err != nil && st == breakerHalfOpen:
		b.trial = false // the trial said nothing: let another through
		b.notify()
	}
}

// reopen sets the breaker open until the next probe or trial. mu held.
func (b *breaker) reopen() {
	b.state.Store(breakerOpen)
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
func (b *breaker) close() {
	if b.state.Load() == breakerClosed {
		return
	}
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	outage := time.Since(b.since)
	b.state.Store(breakerClosed)
	b.fails.Store(0)
	b.trial = false
	b.rec.Add(CountPausedMillis, outage.Milliseconds())
	b.log.Warn("idemq: dependency back; consumer resumed",
		"dependency", dependencyOf(b.cause), "outage", outage.Round(time.Millisecond), "probes", b.round+1)
	b.notify()
}

// probe runs one round of probes and closes or reopens the breaker.
func (b *breaker) probe(ctx context.Context) {
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
	if b.state.Load() != breakerOpen {
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

// paused reports whether the breaker holds the consumer.
func (b *breaker) paused() bool { return !b.cfg.Disabled && b.state.Load() != breakerClosed }

// Paused reports whether the consumer is paused by its breaker because a
// dependency is unavailable (see [BreakerConfig]).
func (c *Consumer) Paused() bool { return c.brk.paused() }

func dependencyOf(err error) string {
	var u *UnavailableError
	if errors.As(err, &u) {
		return u.Dependency
	}
	return "?"
}
