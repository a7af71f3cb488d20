package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ClaimResult is the answer to a [Store.Claim].
type ClaimResult int

const (
	// Acquired: the caller now holds the lease and must run the handler,
	// then Complete (success) or Release (failure).
	Acquired ClaimResult = iota + 1
	// InFlight: another owner holds a live lease. Do not run, do not drop:
	// bring the delivery back after the lease.
	InFlight
	// Done: the effect was applied within the dedup window. Ack without
	// running the handler.
	Done
)

func (r ClaimResult) String() string {
	switch r {
	case Acquired:
		return "acquired"
	case InFlight:
		return "in-flight"
	case Done:
		return "done"
	}
	return fmt.Sprintf("ClaimResult(%d)", int(r))
}

// Claim is a claim answer with details.
type Claim struct {
	Result ClaimResult
	// LeaseLeft is, for InFlight, how long the other owner's lease still
	// runs (0 when the store cannot tell).
	LeaseLeft time.Duration
}

// Errors a Store returns. Stores wrap their backend's errors in
// [*StoreError] so a failing store is never mistaken for an answer.
var (
	// ErrLeaseLost: Complete, Release or Extend by a token that no longer
	// holds the lease (it expired, and maybe someone else claimed it).
	ErrLeaseLost = errors.New("dedup: lease lost")
	// ErrInvalidKey: an empty key or one longer than MaxKeyLength.
	ErrInvalidKey = errors.New("dedup: invalid key")
	// ErrUncertain: the store answered, but cannot tell whether the key is
	// done — a probabilistic tier (dedup/bloom) said "maybe" and nothing
	// could verify it. The message may be a duplicate (running it could
	// apply it twice) or new (acking it would lose it): the guard does
	// neither. It dead-letters the delivery with reason
	// idemq.ReasonSuspectedDuplicate, unless the failure policy is a
	// bloom.Router, which routes it to its own queue. Never a store error, never
	// fail-open.
	ErrUncertain = errors.New("dedup: store cannot tell whether the message was processed")
)

// MaxKeyLength bounds a store key (prefix:group:id) in bytes.
const MaxKeyLength = 1024

// StoreError is a failure of the backend (network, timeout, SQL error): the
// store could not answer. The guard treats it as "store unavailable".
type StoreError struct {
	Op  string // claim, complete, release, extend
	Err error
}

func (e *StoreError) Error() string { return "dedup: store " + e.Op + ": " + e.Err.Error() }
func (e *StoreError) Unwrap() error { return e.Err }

// Store keeps dedup records. Every method is atomic in its backend and safe
// for concurrent use by many processes sharing the backend.
//
// Keys are opaque strings built by the guard ("<prefix>:<group>:<id>");
// tokens identify one claim attempt (one per delivery).
type Store interface {
	// Claim tries to take a lease on key for token.
	//   absent, or processing with an expired lease → processing(token, lease): Acquired
	//   processing with a live lease of another token → InFlight
	//   processing with a live lease of the same token → Acquired (idempotent)
	//   done (within its window)                      → Done
	Claim(ctx context.Context, key, token string, lease time.Duration) (Claim, error)
	// Complete turns processing(token) into done, kept for window. If the
	// record is not processing(token) any more it returns ErrLeaseLost and
	// still records done (the effect was applied: remembering it is the
	// lesser harm), unless another token holds a live lease on it.
	Complete(ctx context.Context, key, token string, window time.Duration) error
	// Release deletes processing(token) so a redelivery can try again. A
	// record that is not processing(token) is left alone and ErrLeaseLost
	// returned.
	Release(ctx context.Context, key, token string) error
	// Extend renews the lease of processing(token) (heartbeat), or returns
	// ErrLeaseLost.
	Extend(ctx context.Context, key, token string, lease time.Duration) error
}

// Inspector is implemented by stores that can show and forget a record (the
// `idemq keys` CLI uses it).
type Inspector interface {
	// Get returns the record for key, or ok=false when absent or expired.
	Get(ctx context.Context, key string) (rec Record, ok bool, err error)
	// Forget deletes the record whatever its state (an operator re-running a
	// message on purpose).
	Forget(ctx context.Context, key string) error
}

// IdleForgetter is implemented by stores that can forget a record unless a
// consumer holds a live lease on it, in one atomic step (`idemq keys forget`
// uses it: a check then a delete would let a claim slip in between, and
// deleting a live lease lets a concurrent duplicate run).
type IdleForgetter interface {
	// ForgetIdle deletes key's record unless it is processing with a live
	// lease. It returns the record it found (found=false: there was none).
	// For a live lease it deletes nothing and returns the record and an
	// error wrapping [ErrLeaseHeld].
	ForgetIdle(ctx context.Context, key string) (rec Record, found bool, err error)
}

// ErrLeaseHeld: [IdleForgetter.ForgetIdle] found a live processing lease and
// deleted nothing.
var ErrLeaseHeld = errors.New("dedup: a live lease holds the record")

// State of a record.
type State string

const (
	StateProcessing State = "processing"
	StateDone       State = "done"
)

// Record is a dedup record as an [Inspector] shows it.
type Record struct {
	Key       string
	State     State
	Owner     string    // token of the lease holder (processing only)
	ExpiresAt time.Time // lease expiry (processing) or end of window (done)
}

// ValidateKey checks a store key.
func ValidateKey(key string) error {
	if key == "" || len(key) > MaxKeyLength {
		return fmt.Errorf("%w: %d bytes", ErrInvalidKey, len(key))
	}
	return nil
}

// CheckOp is the check a Store makes before operation op (claim,
// complete, ...) on key touches its backend: ValidateKey's error for an
// invalid key, a [*StoreError] for op wrapping ctx's error once ctx is
// done, else nil.
func CheckOp(ctx context.Context, op, key string) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return &StoreError{Op: op, Err: err}
	}
	return nil
}

// WrapStoreError returns err as a [*StoreError] for op, or err itself when
// it already holds one.
func WrapStoreError(op string, err error) error {
	var se *StoreError
	if errors.As(err, &se) {
		return err
	}
	return &StoreError{Op: op, Err: err}
}

// BatchStore is implemented by stores that can answer many claims, or many
// completes, in one round trip (Redis: one pipeline). When the store has it,
// the guard groups the Claim and Complete calls its concurrent deliveries
// make (see Config.MaxBatch): the semantics of each request are exactly
// those of the single call, only the round trips are shared.
type BatchStore interface {
	Store
	// ClaimBatch answers each request as Claim would, in order.
	ClaimBatch(ctx context.Context, reqs []ClaimRequest) []ClaimReply
	// CompleteBatch answers each request as Complete would, in order.
	CompleteBatch(ctx context.Context, reqs []CompleteRequest) []error
}

// MixedBatchStore is a [BatchStore] that also answers claims and
// completes of different deliveries together, in one round trip (Redis:
// one pipeline holding the SET NX of new deliveries and the complete
// scripts of finished ones). When the store has it, the guard groups both
// kinds of calls into the same batches: a busy consumer makes one round
// trip where it made two. Each request is answered exactly as Claim or
// Complete would answer it; requests on the same key are run in the
// order of the slices, claims first.
type MixedBatchStore interface {
	BatchStore
	// Batch answers each claim as ClaimBatch and each complete as
	// CompleteBatch would, in order.
	Batch(ctx context.Context, claims []ClaimRequest, completes []CompleteRequest) ([]ClaimReply, []error)
}

// ClaimRequest is one Claim in a [BatchStore.ClaimBatch].
type ClaimRequest struct {
	Key, Token string
	Lease      time.Duration
}

// ClaimReply is the answer to one [ClaimRequest]: what Claim would return.
type ClaimReply struct {
	Claim Claim
	Err   error
}

// CompleteRequest is one Complete in a [BatchStore.CompleteBatch].
type CompleteRequest struct {
	Key, Token string
	Window     time.Duration
}
