package idemq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemq/idemq/backoff"
	"github.com/idemq/idemq/internal/breaker"
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
	// shape nobody listed is an outage (see internal/breaker): with Probes,
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

// askable says whether a failed run's error leaves open whether a
// dependency is down (see [BreakerConfig.AskTimeout]): not a duplicate,
// an outage, permanent, rejected, a deferral or a panic.
func askable(err error) bool {
	var rq *RequeueError
	var rj *RejectError
	var pe *PanicError
	switch {
	case IsDuplicate(err), IsUnavailable(err), IsPermanent(err):
		return false
	case errors.As(err, &rq), errors.As(err, &rj), errors.As(err, &pe):
		return false
	}
	return true
}

// Paused reports whether the consumer is paused by its breaker because a
// dependency is unavailable (see [BreakerConfig]).
func (c *Consumer) Paused() bool { return c.brk.Paused() }

func dependencyOf(err error) string {
	var u *UnavailableError
	if errors.As(err, &u) {
		return u.Dependency
	}
	return "?"
}
