package dedup

import (
	"context"
	"crypto/rand"
	"errors"

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

// Probe returns a check that store answers, for the consumer's breaker
// (idemq.ConsumerConfig.Breaker.Probes): it releases a key nobody holds
// with a fresh token — one round trip, nothing written. The store
// answering (nil or [ErrLeaseLost]) is up; a store error is an
// [idemq.UnavailableError].
func Probe(store Store) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		err := store.Release(ctx, probeKey, rand.Text())
		if err == nil || errors.Is(err, ErrLeaseLost) {
			return nil
		}
		return idemq.Unavailable(DependencyStore, err)
	}
}
