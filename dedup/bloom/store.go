package bloom

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
)

// Counter names the tiered store and the router record (into
// StoreConfig.Recorder, else idemq.RecorderFrom(ctx)).
const (
	// CountFilterHits: claims the filter answered "maybe done".
	CountFilterHits = "bloom_hits"
	// CountVerifiedDone: hits the verifier confirmed (true duplicates).
	CountVerifiedDone = "bloom_verified_done"
	// CountFalsePositives: hits the verifier refuted (the filter was
	// wrong; the message was processed normally).
	CountFalsePositives = "bloom_false_positives"
	// CountSuspects: hits nobody could verify, returned as
	// [*SuspectedDuplicateError].
	CountSuspects = "bloom_suspects"
	// CountWindowExceeded: Complete asked for a longer window than the
	// filter's (see [Store.Complete]).
	CountWindowExceeded = "bloom_window_exceeded"
	// CountSuspectedRouted: suspects [Router] published to the
	// suspected-duplicate queue.
	CountSuspectedRouted = "suspected_duplicates"
)

// ErrSuspectedDuplicate is wrapped by [*SuspectedDuplicateError]. It wraps
// [dedup.ErrUncertain], so dedup.Guard neither runs nor acks the message.
var ErrSuspectedDuplicate = fmt.Errorf("bloom: suspected duplicate: %w", dedup.ErrUncertain)

// SuspectedDuplicateError is what [Store.Claim] returns when the filter
// says "maybe done" and no verifier can tell: the message may be a
// duplicate or a false positive. It is neither Done (that could drop a new
// message) nor Acquired (that could run a duplicate): route it with
// a [Router] to a queue an operator replays from.
type SuspectedDuplicateError struct {
	Key string
}

func (e *SuspectedDuplicateError) Error() string {
	return fmt.Sprintf("bloom: suspected duplicate %q: the filter may hold it and no verifier is configured", e.Key)
}
func (e *SuspectedDuplicateError) Unwrap() error { return ErrSuspectedDuplicate }

// Verifier is the authoritative answer to "is key done?" for the keys the
// filter flags: the inbox table, a SQL store, an exact Redis store.
type Verifier interface {
	Done(ctx context.Context, key string) (bool, error)
}

// VerifierFunc adapts a function to [Verifier] (e.g. a lookup of the inbox
// row of the key's group and ID).
type VerifierFunc func(ctx context.Context, key string) (bool, error)

// Done calls f.
func (f VerifierFunc) Done(ctx context.Context, key string) (bool, error) { return f(ctx, key) }

// Marker is implemented by a verifier that is also the record of truth:
// [Store.Complete] marks the key done in it (before adding it to the
// filter), for the window Complete is given.
type Marker interface {
	MarkDone(ctx context.Context, key string, window time.Duration) error
}

// InspectorVerifier verifies against a store someone else writes (read
// only): done means Get finds a done record.
func InspectorVerifier(i dedup.Inspector) Verifier { return inspectorVerifier{i} }

type inspectorVerifier struct{ i dedup.Inspector }

func (v inspectorVerifier) Done(ctx context.Context, key string) (bool, error) {
	rec, ok, err := v.i.Get(ctx, key)
	if err != nil {
		return false, err
	}
	return ok && rec.State == dedup.StateDone, nil
}

// RecordStore is an exact dedup store that can show its records.
type RecordStore interface {
	dedup.Store
	dedup.Inspector
}

// RecordOfTruth makes an exact store (SQL, Redis) the record of truth: it
// verifies filter hits (Get) and Complete marks every key done in it (a
// Claim with a fresh token, then Complete: two calls, per message). The
// filter then only saves the lookups of new IDs — the point when the
// record store is slow or far (SQL) and the filter is near.
func RecordOfTruth(s RecordStore) Verifier { return recordOfTruth{inspectorVerifier{s}, s} }

type recordOfTruth struct {
	inspectorVerifier
	s RecordStore
}

// ErrRecordBusy: the record of truth holds a live lease on the key (a
// concurrent MarkDone of the same key); Complete fails and is retried.
var ErrRecordBusy = errors.New("bloom: record of truth busy with the key")

func (r recordOfTruth) MarkDone(ctx context.Context, key string, window time.Duration) error {
	tok := "bloom-" + rand.Text()
	c, err := r.s.Claim(ctx, key, tok, time.Minute)
	if err != nil {
		return err
	}
	switch c.Result {
	case dedup.Done:
		return nil
	case dedup.InFlight:
		return ErrRecordBusy
	}
	if err := r.s.Complete(ctx, key, tok, window); err != nil && !errors.Is(err, dedup.ErrLeaseLost) {
		return err
	}
	return nil
}

// StoreConfig configures a tiered [Store].
type StoreConfig struct {
	// Leases is the exact store of short-lived records: processing leases,
	// and done markers for Recent (at least until the filter holds the
	// key). Memory or Redis. Required.
	Leases dedup.Store
	// Filter remembers done keys for its window. Required.
	Filter Filter
	// Verifier answers filter hits. Optional: without one a hit that the
	// lease store cannot answer is a [*SuspectedDuplicateError]. When it
	// also implements [Marker] (see [RecordOfTruth]), Complete marks done
	// in it.
	Verifier Verifier
	// Recent is how long the lease store keeps an exact done marker after
	// Complete (bounded by the window Complete is given): duplicates within
	// it are answered Done exactly, without a verifier. It costs one lease
	// record per message of the last Recent. Default (and minimum) Hold.
	Recent time.Duration
	// Hold bounds how long adding a completed key to the filter (and
	// marking it in the record of truth) may take, retries included; the
	// done marker covers that gap. Default 30s.
	Hold time.Duration
	// Recorder receives the counters. Default idemq.RecorderFrom(ctx).
	Recorder idemq.Recorder
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// Store is the tiered dedup store: exact leases in a lease store, done
// keys in a Bloom filter, filter hits verified (see the package
// documentation for the decision table). It implements [dedup.Store] and
// passes dedup/storetest when a verifier is configured.
type Store struct {
	cfg       StoreConfig
	marker    Marker
	warnOnce  sync.Once
	mu        sync.Mutex
	pending   map[string]pendingDone // token → a Complete whose lease part is done
	lastPrune time.Time
}

// DuplicateLayer names the Bloom tier as the layer of the duplicates the
// dedup guard recognises through it (idemq.DuplicateLayer).
func (s *Store) DuplicateLayer() string { return idemq.LayerBloom }

type pendingDone struct {
	key   string
	until time.Time
}

var _ dedup.Store = (*Store)(nil)

// NewStore returns a tiered store.
func NewStore(cfg StoreConfig) (*Store, error) {
	if cfg.Leases == nil || cfg.Filter == nil {
		return nil, fmt.Errorf("%w: StoreConfig.Leases and StoreConfig.Filter are required", ErrInvalidConfig)
	}
	if cfg.Hold <= 0 {
		cfg.Hold = 30 * time.Second
	}
	if cfg.Recent < cfg.Hold {
		cfg.Recent = cfg.Hold
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Store{cfg: cfg, pending: map[string]pendingDone{}}
	s.marker, _ = cfg.Verifier.(Marker)
	return s, nil
}

// Filter returns the store's filter (for Stats).
func (s *Store) Filter() Filter { return s.cfg.Filter }

func (s *Store) rec(ctx context.Context) idemq.Recorder {
	if s.cfg.Recorder != nil {
		return s.cfg.Recorder
	}
	return idemq.RecorderFrom(ctx)
}

// Claim implements [dedup.Store]:
//
//	filter: definitely not done → the lease store's Claim
//	filter: maybe, verifier says done → Done
//	filter: maybe, verifier says not done (a false positive) → the lease store's Claim
//	filter: maybe, no verifier → the lease store's Claim: Done (a Recent
//	  marker) or InFlight are exact answers; Acquired is given back and a
//	  *SuspectedDuplicateError returned
func (s *Store) Claim(ctx context.Context, key, token string, lease time.Duration) (dedup.Claim, error) {
	if err := dedup.CheckOp(ctx, "claim", key); err != nil {
		return dedup.Claim{}, err
	}
	maybe, err := s.cfg.Filter.Test(ctx, key)
	if err != nil {
		return dedup.Claim{}, dedup.WrapStoreError("claim", fmt.Errorf("bloom filter: %w", err))
	}
	if !maybe {
		return s.cfg.Leases.Claim(ctx, key, token, lease)
	}
	rec := s.rec(ctx)
	rec.Add(CountFilterHits, 1)
	if s.cfg.Verifier != nil {
		done, err := s.cfg.Verifier.Done(ctx, key)
		if err != nil {
			return dedup.Claim{}, dedup.WrapStoreError("claim", fmt.Errorf("bloom verifier: %w", err))
		}
		if done {
			rec.Add(CountVerifiedDone, 1)
			return dedup.Claim{Result: dedup.Done}, nil
		}
		rec.Add(CountFalsePositives, 1)
		return s.cfg.Leases.Claim(ctx, key, token, lease)
	}
	c, err := s.cfg.Leases.Claim(ctx, key, token, lease)
	if err != nil || c.Result != dedup.Acquired {
		return c, err
	}
	// Nobody can tell: give the lease back (best effort: it expires anyway).
	if err := s.cfg.Leases.Release(ctx, key, token); err != nil {
		s.cfg.Logger.Debug("idemq: bloom: giving back the lease of a suspect failed", "key", key, "err", err)
	}
	rec.Add(CountSuspects, 1)
	return dedup.Claim{}, &SuspectedDuplicateError{Key: key}
}

// Complete implements [dedup.Store]. It turns the lease into an exact done
// marker in the lease store (for min(window, Recent)) — atomically, with
// the lease store's own Complete, so the ownership rules are exactly the
// lease store's — then marks the key in the record of truth (a [Marker]
// verifier) and adds it to the filter. A concurrent Claim sees the lease,
// then the marker, then the filter: never nothing.
//
// Windows: the filter remembers a key for its own Window (up to one
// generation more), whatever window Complete is given. A shorter window
// is honoured exactly by the record of truth when there is one; without,
// a duplicate after the given window but within the filter's is a suspect
// (never silently dropped, never run). A longer window than the filter's
// cannot be honoured: the key is still added, CountWindowExceeded counted
// and a warning logged once — configure the filter's Window ≥ the guard's.
func (s *Store) Complete(ctx context.Context, key, token string, window time.Duration) error {
	if err := dedup.CheckOp(ctx, "complete", key); err != nil {
		return err
	}
	lost := false
	if !s.isPending(key, token) {
		var err error
		lost, err = s.completeLease(ctx, key, token, window)
		if err != nil {
			return err
		}
		s.setPending(key, token)
	}
	if s.marker != nil {
		if err := s.marker.MarkDone(ctx, key, window); err != nil {
			return dedup.WrapStoreError("complete", fmt.Errorf("bloom record of truth: %w", err))
		}
	}
	if err := s.cfg.Filter.Add(ctx, key); err != nil {
		return dedup.WrapStoreError("complete", fmt.Errorf("bloom filter: %w", err))
	}
	s.clearPending(token)
	if fw := s.cfg.Filter.Params().Window; window > fw {
		s.rec(ctx).Add(CountWindowExceeded, 1)
		s.warnOnce.Do(func() {
			s.cfg.Logger.Warn("idemq: bloom: Complete asked for a longer dedup window than the filter's; keys are remembered only for the filter's window",
				"asked", window, "filter_window", fw)
		})
	}
	if lost {
		return dedup.ErrLeaseLost
	}
	return nil
}

// completeLease turns processing(token) into a done marker. lost reports
// that the lease was not ours any more but the key is done (so it goes in
// the filter); another token's live lease is ErrLeaseLost.
func (s *Store) completeLease(ctx context.Context, key, token string, window time.Duration) (lost bool, err error) {
	marker := min(window, s.cfg.Recent)
	err = s.cfg.Leases.Complete(ctx, key, token, marker)
	if err == nil {
		return false, nil
	}
	if !errors.Is(err, dedup.ErrLeaseLost) {
		return false, dedup.WrapStoreError("complete", err)
	}
	// Not ours any more: absent (the store then records done), done
	// already, or another token's live lease. Look, with our token.
	c, err := s.cfg.Leases.Claim(ctx, key, token, s.cfg.Hold)
	if err != nil {
		return false, dedup.WrapStoreError("complete", err)
	}
	switch c.Result {
	case dedup.Done:
		return true, nil
	case dedup.Acquired: // absent and not recorded: it is ours now
		if err := s.cfg.Leases.Complete(ctx, key, token, marker); err != nil {
			return false, dedup.WrapStoreError("complete", err)
		}
		return true, nil
	}
	return false, dedup.ErrLeaseLost // another owner's live lease stands
}

func (s *Store) isPending(key, token string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.pending[token]
	return ok && p.key == key && time.Now().Before(p.until)
}

func (s *Store) setPending(key, token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	s.pending[token] = pendingDone{key: key, until: now.Add(s.cfg.Hold)}
	if now.Sub(s.lastPrune) > s.cfg.Hold {
		s.lastPrune = now
		for t, p := range s.pending {
			if !now.Before(p.until) {
				delete(s.pending, t)
			}
		}
	}
}

func (s *Store) clearPending(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.pending, token)
}

// Release implements [dedup.Store] (the lease store's Release).
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := dedup.CheckOp(ctx, "release", key); err != nil {
		return err
	}
	s.clearPending(token)
	return s.cfg.Leases.Release(ctx, key, token)
}

// Extend implements [dedup.Store] (the lease store's Extend).
func (s *Store) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	if err := dedup.CheckOp(ctx, "extend", key); err != nil {
		return err
	}
	return s.cfg.Leases.Extend(ctx, key, token, lease)
}

// Stats returns the filter's stats.
func (s *Store) Stats(ctx context.Context) (Stats, error) { return s.cfg.Filter.Stats(ctx) }
