package bloom

import (
	"context"
	"time"
)

// Filter is a rotating, time-windowed Bloom filter of done keys. Test never
// answers false for a key added within the window (no false negatives);
// it may answer true for a key never added (a false positive, at about
// Params().FPRate once the window holds ExpectedIDs).
//
// [Local] keeps it in process; dedup/bloom/redisbloom keeps it in Redis
// bitmaps shared by every consumer process.
type Filter interface {
	// Test reports whether key may have been added within the window
	// (false: definitely not).
	Test(ctx context.Context, key string) (bool, error)
	// Add remembers key for at least the window.
	Add(ctx context.Context, key string) error
	// Stats returns the fill of the live generations and the false-positive
	// rate estimated from it.
	Stats(ctx context.Context) (Stats, error)
	// Params returns the sizing.
	Params() Params
}

// Stats is a snapshot of a filter.
type Stats struct {
	Params Params
	// Generations are the checked generations that exist, newest first.
	Generations []GenStats
	// EstimatedFPRate is the false-positive rate of a lookup now, from the
	// fill ratios (see [EstimateFP]). Export it as a gauge and alert when
	// it goes past Params.FPRate: more IDs arrive than the filter was sized
	// for.
	EstimatedFPRate float64
	// Bytes is the memory the bitmaps hold (in process: allocated; Redis:
	// the bitmap sizes, without Redis' own per-key overhead).
	Bytes int64
}

// GenStats is one generation.
type GenStats struct {
	Index   int64
	Start   time.Time
	SetBits uint64
	Fill    float64 // SetBits / Bits
}

// Watch calls fn with the filter's stats every interval until ctx ends (a
// gauge feeder: export EstimatedFPRate and Bytes).
func Watch(ctx context.Context, f Filter, every time.Duration, fn func(Stats, error)) {
	if every <= 0 {
		every = 15 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		fn(f.Stats(ctx))
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
