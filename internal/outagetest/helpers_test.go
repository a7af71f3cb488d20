package outagetest

import (
	"context"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/testenv"
)

// configureBreaker registers probe with the consumer's breaker.
func configureBreaker(cfg *idemq.ConsumerConfig, probe func(context.Context) error) {
	cfg.Breaker.Probes = append(cfg.Breaker.Probes, probe)
}

// waitOutage waits until the consumer noticed the outage and paused.
func waitOutage(t *testing.T, c *idemq.Counters) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, "the consumer to pause for the outage", func() bool {
		return c.Get(idemq.CountDependencyOutages) > 0
	})
}

// checkOutageCounted checks the outage was counted and logged as one.
func checkOutageCounted(t *testing.T, c *idemq.Counters) {
	t.Helper()
	if n := c.Get(idemq.CountDependencyOutages); n < 1 {
		t.Errorf("dependency_outages = %d, want >= 1", n)
	}
	if ms := c.Get(idemq.CountPausedMillis); ms <= 0 {
		t.Errorf("paused_ms = %d, want > 0", ms)
	}
}
