// Transient handler failures (bank demo --fail-rate, bank consume
// --fail-rate): a fraction of the transfers fail with an ordinary error —
// a dependency hiccup, not an outage — on their first one or two attempts.
// Which transfers, and how many attempts each, is a function of the
// message ID alone, so the demo knows the plan without asking the
// consumers, and a redelivery, a resend or a consumer restarted after a
// kill fails exactly as the first one did.
//
// The failure is returned after the transfer was written and before its
// transaction commits (the inbox row included), so a failed attempt must
// leave no effect: bank_applied records the attempt (x-idemq-attempt) that
// applied each transfer, and the demo checks that none was applied at an
// attempt meant to fail. It goes through the consumer's retry policy like
// any handler error: the quick retries in process fail too (the attempt
// does not change), then the delivery is republished to the retry queue of
// its attempt and comes back to the work queue with the next one.

package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/retry"
)

// countTransient is the consumers' counter of handler runs failed on
// purpose (in their --stats file with idemq's counters).
const countTransient = "bank_transient_failures"

// errTransient is the injected failure: an ordinary error (neither
// permanent nor a dependency outage), retried by the policy.
var errTransient = errors.New("bank: injected transient failure")

// transientFailures is how many attempts of the transfer id fail at rate:
// 0 for a fraction 1-rate of the IDs, else 1 or 2 (half each). The bank's
// topology has two retry delays, so a transfer failing twice succeeds at
// its third attempt, the last one the policy allows.
func transientFailures(id string, rate float64) int {
	if rate <= 0 {
		return 0
	}
	h := sha256.Sum256([]byte(id)) // FNV's high bits barely move with the last byte
	if float64(binary.BigEndian.Uint64(h[:8])>>11)/(1<<53) >= rate {
		return 0
	}
	return 1 + int(h[8]&1)
}

// failTransiently returns errTransient when d's attempt is one its ID is
// meant to fail at rate, and counts it.
func failTransiently(ctx context.Context, d *idemq.Delivery, rate float64) error {
	k := transientFailures(d.MessageID, rate)
	if k == 0 {
		return nil
	}
	a := retry.Attempt(d.Headers)
	if a > k {
		return nil
	}
	idemq.RecorderFrom(ctx).Add(countTransient, 1)
	return fmt.Errorf("%w: attempt %d of the %d %s fails", errTransient, a, k, d.MessageID)
}
