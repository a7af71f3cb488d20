package dedup

import (
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"time"

	"github.com/idemq/idemq"
)

// DependencyStore is the Dependency of the [idemq.UnavailableError] the
// guard wraps a store failure in (fail-closed): the failure policy then
// gives the delivery back without counting an attempt, and the consumer's
// breaker pauses until the store answers again.
const DependencyStore = "dedup-store"

// ProbeKeyPrefix begins every key [Probe] writes: never a guard's (a
// guard's keys are "<prefix>:<group>:<id>" and a prefix holds no
// "idemq-probe:"). Instrumentation tells probes from deliveries by it
// ([IsProbeKey]).
const ProbeKeyPrefix = "idemq-probe:"

// IsProbeKey reports whether key is one [Probe] writes.
func IsProbeKey(key string) bool { return strings.HasPrefix(key, ProbeKeyPrefix) }

// Probe returns a check that store answers and writes, for the consumer's
// breaker (idemq.ConsumerConfig.Breaker.Probes): it claims a fresh key
// ([ProbeKeyPrefix] and a random token) with a one-second lease, then
// releases it — two round trips. A store that answers reads but refuses
// writes (a Redis replica answering READONLY after a failover, maxmemory
// reached under noeviction, a read-only database) is down, so its
// failures are an outage, not the message's. On a Redis Cluster the key
// lands on one shard, chosen at random per probe. The store answering,
// [ErrUncertain] included (a Bloom tier's false positive), is up; a store
// error is an [idemq.UnavailableError].
func Probe(store Store) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		token := rand.Text()
		key := ProbeKeyPrefix + token
		c, err := store.Claim(ctx, key, token, time.Second)
		switch {
		case errors.Is(err, ErrUncertain):
			return nil // the store answered
		case err != nil:
			return idemq.Unavailable(DependencyStore, err)
		case c.Result != Acquired:
			return nil // answered (a fresh key is not expected to be held)
		}
		if err := store.Release(ctx, key, token); err != nil && !errors.Is(err, ErrLeaseLost) {
			return idemq.Unavailable(DependencyStore, err)
		}
		return nil
	}
}
