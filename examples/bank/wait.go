package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/backoff"
	"github.com/idemq/idemq/inbox"
)

// waitFor runs f until it succeeds, retrying with backoff (100ms doubling
// to 5s) while its error says the dependency cannot be reached
// (idemq.IsUnavailable or inbox.ConnectionError); any other error, or ctx
// ending, is returned. The wait is logged once when it starts and once
// when it ends.
func waitFor(ctx context.Context, log *slog.Logger, what string, f func(context.Context) error) error {
	pol := backoff.Policy{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	var start time.Time
	for attempt := 0; ; attempt++ {
		err := f(ctx)
		if err == nil {
			if attempt > 0 {
				log.Warn("bank: dependency reachable; starting", "dependency", what, "waited", time.Since(start).Round(time.Millisecond))
			}
			return nil
		}
		if !idemq.IsUnavailable(err) && !inbox.ConnectionError(err) {
			return fmt.Errorf("%s: %w", what, err)
		}
		if attempt == 0 {
			start = time.Now()
			log.Warn("bank: dependency unreachable at start; waiting for it", "dependency", what, "err", err)
		}
		if serr := backoff.Sleep(ctx, pol.Delay(attempt)); serr != nil {
			return fmt.Errorf("%s: still unreachable when stopped: %w", what, errors.Join(serr, err))
		}
	}
}
