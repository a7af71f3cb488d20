package retry

import (
	"time"

	"github.com/idemq/idemq"
)

// Horizon is how long after its first delivery the last attempt of a
// message can start under c (defaults filled): every delayed retry's wait
// (attempt n waits Delays[n-1], the last delay repeating, for
// MaxAttempts-1 waits) plus the longest backoff of every quick retry. The
// handler's own run time is not in it: add MaxAttempts × QuickAttempts ×
// the handler deadline for a bound that includes it. Deferrals
// ([idemq.Defer]) and dependency outages do not count attempts and are
// not bounded by it.
//
// A dedup window or inbox retention shorter than the horizon lets a late
// retry find its record gone and apply its effect a second time;
// [idemq.Pipeline.Validate] refuses such a pipeline and `idemq doctor`
// reports it, with the dead-letter retention added.
func Horizon(c Config) time.Duration {
	c = c.withDefaults()
	var h time.Duration
	for n := 1; n < c.MaxAttempts && len(c.Delays) > 0; n++ {
		h += c.Delays[min(n-1, len(c.Delays)-1)]
	}
	h += time.Duration(c.MaxAttempts*(c.QuickAttempts-1)) * c.QuickBackoff.Max
	return h
}

var _ idemq.RetryHorizoner = (*Policy)(nil)

// RetryHorizon implements [idemq.RetryHorizoner]: [Horizon] of the
// policy's configuration.
func (p *Policy) RetryHorizon() time.Duration { return Horizon(p.cfg) }
