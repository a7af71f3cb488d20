package main

import (
	"context"
	"time"
)

// every calls f every interval, from a goroutine, until ctx is done or
// the returned stop is called; with interval <= 0 it never calls f. stop
// returns once no call of f runs and none will. The gate and the relay log
// their counters with it.
func every(ctx context.Context, interval time.Duration, f func()) (stop func()) {
	if interval <= 0 {
		return func() {}
	}
	tick := time.NewTicker(interval)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if ctx.Err() != nil {
					return
				}
				f()
			}
		}
	}()
	return func() {
		cancel()
		tick.Stop()
		<-done
	}
}
