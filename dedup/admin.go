package dedup

import (
	"context"
	"time"
)

// KeyAdmin is a store an operator can inspect and forget records in (what
// `idemq keys` and the console use; the Redis store implements it).
type KeyAdmin interface {
	Inspector
	IdleForgetter
}

// ForgetKey deletes key's record so the next delivery of its message is
// processed again. A processing record with a live lease — a consumer is
// running the message now — is refused with an error wrapping
// [ErrLeaseHeld], in one atomic step in the store, unless force: deleting
// a live lease lets a concurrent duplicate run. It returns the record it
// found (found=false: there was none).
func ForgetKey(ctx context.Context, s KeyAdmin, key string, force bool) (rec Record, found bool, err error) {
	if err := ValidateKey(key); err != nil {
		return Record{}, false, err
	}
	if !force {
		return s.ForgetIdle(ctx, key)
	}
	if rec, found, err = s.Get(ctx, key); err != nil {
		return rec, found, err
	}
	return rec, found, s.Forget(ctx, key)
}

// TTL is the time left until the record expires at now (0 when it has no
// expiry or has expired).
func (r Record) TTL(now time.Time) time.Duration {
	if r.ExpiresAt.IsZero() || !r.ExpiresAt.After(now) {
		return 0
	}
	return r.ExpiresAt.Sub(now)
}
