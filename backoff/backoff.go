package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Policy is a capped exponential backoff. The zero value uses Min 100ms and
// Max 10s.
type Policy struct {
	Min time.Duration // first delay; default 100ms
	Max time.Duration // cap; default 10s
	// NoJitter disables the random spread (tests and documentation only).
	NoJitter bool
}

func (p Policy) bounds() (time.Duration, time.Duration) {
	lo, hi := p.Min, p.Max
	if lo <= 0 {
		lo = 100 * time.Millisecond
	}
	if hi <= 0 {
		hi = 10 * time.Second
	}
	if hi < lo {
		hi = lo
	}
	return lo, hi
}

// Delay returns the delay before retry number attempt (0-based).
func (p Policy) Delay(attempt int) time.Duration {
	lo, hi := p.bounds()
	d := lo
	for i := 0; i < attempt && d < hi; i++ {
		d *= 2
	}
	if d > hi {
		d = hi
	}
	if p.NoJitter {
		return d
	}
	// "Equal jitter": half fixed, half random, so the delay never collapses to 0.
	half := d / 2
	return half + time.Duration(rand.Int64N(int64(half)+1))
}

// Sleep waits for d or until ctx is done, returning ctx.Err() in that case.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
