package main

import (
	"context"
	"time"
)

// every calls f every interval, from a goroutine, until ctx is done or
// the returned stop is called; with interval <= 0 it never calls f. The
// gate and the relay log their counters with it.
func every(ctx context.Context, interval time.Duration, f func()) (stop func()) {
	if interval <= 0 {
		return func() {}
	}
	tick := time.NewTicker(interval)
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				f()
			}
		}
	}()
	return func() {
		cancel()
		tick.Stop()
	}
}
