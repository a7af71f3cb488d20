package outbox

import (
	"testing"
	"time"
)

// A relay working through a large backlog (a slow COUNT of the pending
// rows) refreshes its stats after batches less often; a small one keeps
// the short gap, and the gap never exceeds StatsInterval.
func TestStatsGap(t *testing.T) {
	for _, c := range []struct {
		name           string
		took, interval time.Duration
		want           time.Duration
	}{
		{"fast stats keeps the minimum gap", time.Millisecond, 5 * time.Second, minStatsGap},
		{"slow stats waits in proportion", 20 * time.Millisecond, 5 * time.Second, statsCostFactor * 20 * time.Millisecond},
		{"never beyond the interval", time.Second, 5 * time.Second, 5 * time.Second},
		{"short interval wins", time.Millisecond, 100 * time.Millisecond, 100 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := statsGap(c.took, c.interval); got != c.want {
				t.Errorf("statsGap(%v, %v) = %v, want %v", c.took, c.interval, got, c.want)
			}
		})
	}
}
