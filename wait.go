package idemq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemq/idemq/backoff"
)

// Dependency is a service a process needs before it starts — a database,
// Redis — as [WaitFor] checks it.
type Dependency struct {
	// Name names it in logs and errors ("postgres", "redis").
	Name string
	// Check succeeds once the dependency is usable (a ping, a migration).
	// Required.
	Check func(ctx context.Context) error
	// Config says an error of Check is a definite configuration error —
	// wrong credentials, an unknown database or user, a malformed URL, a
	// certificate that fails verification — that no wait can fix
	// (sqldb.ConfigError for SQL databases). Optional: without it every
	// error is waited out.
	Config func(err error) bool
	// Fix names what to fix when Config holds: the flag or the field
	// ("--pg-url: user, password and database"). Shown in the error.
	Fix string
}

// WaitConfig configures [WaitFor]. The zero value is usable.
type WaitConfig struct {
	// Grace is how long a configuration error is still waited out: a
	// server that is booting refuses logins and databases for a moment,
	// exactly as a wrong password does. Default [DefaultLoginGrace];
	// negative: a configuration error ends the wait at once.
	Grace time.Duration
	// CheckTimeout bounds one Check. Default 5s.
	CheckTimeout time.Duration
	// Backoff between checks. Default 100ms doubling to 5s, with jitter.
	Backoff backoff.Policy
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// ErrDependencyConfig is matched (errors.Is) by the error [WaitFor]
// returns for a configuration error it did not wait out.
var ErrDependencyConfig = errors.New("idemq: dependency misconfigured")

// DependencyConfigError is the error of a dependency whose check kept
// failing with a configuration error for the whole grace period.
type DependencyConfigError struct {
	Dependency string
	Fix        string
	Err        error
}

func (e *DependencyConfigError) Error() string {
	s := fmt.Sprintf("idemq: %s: configuration error, not retried: %v", e.Dependency, e.Err)
	if e.Fix != "" {
		s += " (check " + e.Fix + ")"
	}
	return s
}

// Unwrap returns both the sentinel and the cause.
func (e *DependencyConfigError) Unwrap() []error { return []error{ErrDependencyConfig, e.Err} }

// WaitFor waits, in order, until every dependency's Check succeeds: the
// way a service starts, not a script. Whatever a check fails with — the
// server refusing connections, a database that is starting up or not
// accepting connections, too many clients, a stall that times out, an
// error nobody listed — is waited out with backoff, logged once when the
// wait begins, again every minute it goes on, and once when it ends. Only a configuration error (the
// dependency's Config) still failing after Grace ends the wait, with a
// [*DependencyConfigError] naming what to fix. When ctx ends first, the
// error wraps ctx's error and the last check's.
func WaitFor(ctx context.Context, cfg WaitConfig, deps ...Dependency) error {
	if cfg.Grace == 0 {
		cfg.Grace = DefaultLoginGrace
	}
	if cfg.CheckTimeout <= 0 {
		cfg.CheckTimeout = 5 * time.Second
	}
	if cfg.Backoff.Min <= 0 {
		cfg.Backoff.Min = 100 * time.Millisecond
	}
	if cfg.Backoff.Max <= 0 {
		cfg.Backoff.Max = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	for _, d := range deps {
		if d.Check == nil {
			return fmt.Errorf("idemq: WaitFor: dependency %q has no Check", d.Name)
		}
		if err := waitOne(ctx, cfg, d); err != nil {
			return err
		}
	}
	return nil
}

// stillWaitingEvery is how often a wait that goes on is logged again.
const stillWaitingEvery = time.Minute

func waitOne(ctx context.Context, cfg WaitConfig, d Dependency) error {
	start := time.Now()
	var lastWarn, configSince time.Time
	for attempt := 0; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, cfg.CheckTimeout)
		err := d.Check(cctx)
		cancel()
		if err == nil {
			if attempt > 0 {
				cfg.Logger.Warn("idemq: dependency ready; starting", "dependency", d.Name,
					"waited", time.Since(start).Round(time.Millisecond))
			}
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("idemq: %s: still not ready when stopped: %w", d.Name, errors.Join(ctx.Err(), err))
		}
		// The grace counts from the first configuration error of a run of
		// them: a server that took long to listen refuses logins while it
		// boots too.
		if d.Config != nil && d.Config(err) {
			if configSince.IsZero() {
				configSince = time.Now()
			}
			if time.Since(configSince) >= cfg.Grace {
				return &DependencyConfigError{Dependency: d.Name, Fix: d.Fix, Err: err}
			}
		} else {
			configSince = time.Time{}
		}
		switch {
		case attempt == 0:
			cfg.Logger.Warn("idemq: dependency not ready at start; waiting for it", "dependency", d.Name, "err", err)
			lastWarn = time.Now()
		case time.Since(lastWarn) >= stillWaitingEvery:
			// An error that never passes (a schema the migration cannot
			// change, say) must not make a silent hang.
			cfg.Logger.Warn("idemq: dependency still not ready; waiting for it", "dependency", d.Name, "err", err,
				"waited", time.Since(start).Round(time.Second))
			lastWarn = time.Now()
		default:
			cfg.Logger.Debug("idemq: dependency still not ready", "dependency", d.Name, "err", err, "attempt", attempt+1)
		}
		if serr := backoff.Sleep(ctx, cfg.Backoff.Delay(attempt)); serr != nil {
			return fmt.Errorf("idemq: %s: still not ready when stopped: %w", d.Name, errors.Join(serr, err))
		}
	}
}
