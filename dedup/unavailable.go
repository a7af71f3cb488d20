package dedup

import (
	"context"
	"crypto/rand"
	"errors"
	"time"

	"github.com/idemq/idemq"
)

// DependencyStore is the Dependency of the [idemq.UnavailableError] the
// guard wraps a store failure in (fail-closed): the failure policy then
// gives the delivery back without counting an attempt, and the consumer's
// breaker pauses until the store answers again.
const DependencyStore = "dedup-store"

// probeKey is the key [Probe] releases: never claimed by a guard (a guard's
// keys are "<prefix>:<group>:<id>", and no token matches a fresh one).
const probeKey = "idemq-probe:breaker"

// Probe returns a check that store answers and writes, for the consumer's
// breaker (idemq.ConsumerConfig.Breaker.Probes): it claims a key no guard
// uses with a fresh token and a one-second lease, then releases it — two
// round trips. A store that answers reads but refuses writes (a Redis
// replica answering READONLY after a failover, maxmemory reached under
// noeviction, a read-only database) is down: its failures are an outage,
// not the message's. The store answering (the claim acquired or held by
// another probe) is up; a store error is an [idemq.UnavailableError].
func Probe(store Store) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		token := rand.Text()
		c, err := store.Claim(ctx, probeKey, token, time.Second)
		if err != nil {
			return idemq.Unavailable(DependencyStore, err)
		}
		if c.Result != Acquired {
			return nil // another probe holds it: the store answered
		}
		if err := store.Release(ctx, probeKey, token); err != nil && !errors.Is(err, ErrLeaseLost) {
			return idemq.Unavailable(DependencyStore, err)
		}
		return nil
	}
}
