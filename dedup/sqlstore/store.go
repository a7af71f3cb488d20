package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemq/idemq/dedup"
)

// Config configures a [Store]. The zero value is usable.
type Config struct {
	// Table is the table name, a plain identifier of at most 51 bytes.
	// Default "idemq_dedup".
	Table string
	// NoMigrate: the dialect constructors do not run [Store.Migrate] (the
	// schema is managed elsewhere). Default false: they run it.
	NoMigrate bool
	// PurgeInterval runs [Store.Purge] in the background at this interval
	// until [Store.Close]. Default 0: no background purger (call Purge
	// yourself, e.g. from cron or `idemq keys purge`).
	PurgeInterval time.Duration
	// PurgeBatch is the most rows one purge statement deletes, for the
	// background purger. Default 1000.
	PurgeBatch int
	// Logger receives the background purger's failures. Default
	// slog.Default().
	Logger *slog.Logger
}

// MaxTokenLength bounds an owner token in bytes (the owner column's size).
const MaxTokenLength = 1024

// ErrInvalidToken is returned for a token longer than [MaxTokenLength].
var ErrInvalidToken = errors.New("sqlstore: invalid token")

// Store is a SQL dedup store. It implements [dedup.Store] and
// [dedup.Inspector] and is safe for concurrent use by many goroutines and
// processes sharing the table. Create one with a dialect package.
type Store struct {
	db   DB
	d    Dialect
	cfg  Config
	st   statements
	stop context.CancelFunc
	wg   sync.WaitGroup
	once sync.Once

	purged atomic.Int64
}

var (
	_ dedup.Store         = (*Store)(nil)
	_ dedup.Inspector     = (*Store)(nil)
	_ dedup.IdleForgetter = (*Store)(nil)
)

// New returns a store over db speaking dialect d. It does not touch the
// database (the dialect packages' constructors also run [Store.Migrate]);
// with cfg.PurgeInterval it starts the background purger.
func New(db DB, d Dialect, cfg Config) (*Store, error) {
	return newStore(db, d, cfg, true)
}

func newStore(db DB, d Dialect, cfg Config, start bool) (*Store, error) {
	if db == nil {
		return nil, errors.New("sqlstore: nil DB")
	}
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	if err := CheckTable(cfg.Table); err != nil {
		return nil, err
	}
	if cfg.PurgeBatch <= 0 {
		cfg.PurgeBatch = 1000
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	st, err := d.statements(cfg.Table)
	if err != nil {
		return nil, err
	}
	s := &Store{db: db, d: d, cfg: cfg, st: st, stop: func() {}}
	if start {
		s.startPurger()
	}
	return s, nil
}

func (s *Store) startPurger() {
	if s.cfg.PurgeInterval <= 0 {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.stop = cancel
	s.wg.Add(1)
	go s.purger(ctx)
}

// Open is New followed, unless cfg.NoMigrate, by [Store.Migrate], the
// background purger starting once the table exists; the dialect packages'
// constructors call it.
func Open(ctx context.Context, db DB, d Dialect, cfg Config) (*Store, error) {
	s, err := newStore(db, d, cfg, false)
	if err != nil {
		return nil, err
	}
	if !cfg.NoMigrate {
		if err := s.Migrate(ctx); err != nil {
			return nil, err
		}
	}
	s.startPurger() // after the table exists
	return s, nil
}

// Table returns the table name.
func (s *Store) Table() string { return s.cfg.Table }

// Dialect returns the dialect's name.
func (s *Store) Dialect() string { return s.d.Name }

// Close stops the background purger, if any. It does not close the DB,
// which the caller owns. Safe to call more than once.
func (s *Store) Close() error {
	s.once.Do(func() {
		s.stop()
		s.wg.Wait()
	})
	return nil
}

// Migrate creates the table and its expiry index when missing. It is
// idempotent and safe to run from several processes at once.
func (s *Store) Migrate(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return s.fail("migrate", err)
	}
	for _, m := range s.st.migrate {
		// Migrations race with other processes opening the same database,
		// so they are retried for longer than a claim (about 3 s in all).
		err := s.retryN(ctx, migrateRetries, func() error {
			_, err := s.db.Exec(ctx, m.query, m.bind([numArgs]any{})...)
			return err
		})
		if err != nil {
			return s.fail("migrate", err)
		}
	}
	return nil
}

// migrateRetries bounds the retries of one migration statement.
const migrateRetries = 20

func (s *Store) fail(op string, err error) error {
	return &dedup.StoreError{Op: op, Err: fmt.Errorf("%s: %w", s.d.Name, err)}
}

func (s *Store) check(ctx context.Context, op, key, token string) error {
	if err := dedup.ValidateKey(key); err != nil {
		return err
	}
	if len(token) > MaxTokenLength {
		return fmt.Errorf("%w: %d bytes (at most %d)", ErrInvalidToken, len(token), MaxTokenLength)
	}
	if err := ctx.Err(); err != nil {
		return s.fail(op, err)
	}
	return nil
}

// millis converts a lease or window to whole milliseconds, rounding up so a
// positive duration never becomes an already expired record.
func millis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

const maxRetries = 5

// retry runs fn again after a transient error the dialect recognises.
func (s *Store) retry(ctx context.Context, fn func() error) error {
	return s.retryN(ctx, maxRetries, fn)
}

// retryN is retry with at most n retries, waiting 1, 2, 4 … ms (at most
// 200 ms) between them.
func (s *Store) retryN(ctx context.Context, n int, fn func() error) error {
	for attempt := 0; ; attempt++ {
		err := fn()
		if err == nil || s.d.Retryable == nil || !s.d.Retryable(err) || attempt == n {
			return err
		}
		t := time.NewTimer(min(time.Duration(1<<min(attempt, 10))*time.Millisecond, 200*time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

func (s *Store) exec(ctx context.Context, st stmt, a [numArgs]any) (int64, error) {
	var n int64
	err := s.retry(ctx, func() error {
		var err error
		n, err = s.db.Exec(ctx, st.query, st.bind(a)...)
		return err
	})
	return n, err
}

func (s *Store) row(ctx context.Context, st stmt, a [numArgs]any, dest ...any) error {
	return s.retry(ctx, func() error {
		return s.db.QueryRow(ctx, st.query, st.bind(a)...).Scan(dest...)
	})
}

func args(key, token string, ms int64) [numArgs]any {
	return [numArgs]any{argKey: key, argToken: token, argLease: ms, argWindow: ms}
}

// maxClaimRounds bounds how often Claim starts over when the row changed
// between its upsert and its read (each round means another writer made
// progress on the key).
const maxClaimRounds = 20

// Claim implements [dedup.Store].
func (s *Store) Claim(ctx context.Context, key, token string, lease time.Duration) (dedup.Claim, error) {
	if err := s.check(ctx, "claim", key, token); err != nil {
		return dedup.Claim{}, err
	}
	a := args(key, token, millis(lease))
	for round := 0; round < maxClaimRounds; round++ {
		var (
			acquired     int64
			state        string
			owner        string
			left         int64
			haveRow      bool
			fromSnapshot bool
		)
		if s.d.ClaimReturnsRow {
			err := s.row(ctx, s.st.claim, a, &acquired, &state, &owner, &left)
			switch {
			case err == nil:
				haveRow, fromSnapshot = true, acquired == 0
			case errors.Is(err, ErrNoRows):
			default:
				return dedup.Claim{}, s.fail("claim", err)
			}
		} else if _, err := s.exec(ctx, s.st.claim, a); err != nil {
			return dedup.Claim{}, s.fail("claim", err)
		}
		if haveRow && !fromSnapshot {
			return dedup.Claim{Result: dedup.Acquired}, nil
		}
		if !haveRow {
			// Read the row as it is after our upsert.
			err := s.row(ctx, s.st.read, a, &state, &owner, &left)
			if errors.Is(err, ErrNoRows) {
				continue // released or purged in between: claim again
			}
			if err != nil {
				return dedup.Claim{}, s.fail("claim", err)
			}
		}
		if left <= 0 {
			continue // expired in between: claim again (the upsert takes it)
		}
		switch dedup.State(state) {
		case dedup.StateDone:
			return dedup.Claim{Result: dedup.Done}, nil
		case dedup.StateProcessing:
			if owner != token {
				return dedup.Claim{Result: dedup.InFlight, LeaseLeft: time.Duration(left) * time.Millisecond}, nil
			}
			if !fromSnapshot {
				// Read after our upsert: the lease is ours.
				return dedup.Claim{Result: dedup.Acquired}, nil
			}
			// A snapshot older than the upsert that did not take the row:
			// the row changed meanwhile; look again.
		default:
			return dedup.Claim{}, s.fail("claim", fmt.Errorf("unknown state %q in table %s", state, s.cfg.Table))
		}
	}
	return dedup.Claim{}, s.fail("claim", fmt.Errorf("key %q kept changing: no stable answer after %d rounds", key, maxClaimRounds))
}

// Complete implements [dedup.Store].
func (s *Store) Complete(ctx context.Context, key, token string, window time.Duration) error {
	if err := s.check(ctx, "complete", key, token); err != nil {
		return err
	}
	a := args(key, token, millis(window))
	n, err := s.exec(ctx, s.st.completeOwn, a)
	if err != nil {
		return s.fail("complete", err)
	}
	if n > 0 {
		return nil
	}
	// Not processing(token) with a live lease: remember the effect anyway,
	// unless a live record (another lease, or done) is there.
	if _, err := s.exec(ctx, s.st.completeLost, a); err != nil {
		return s.fail("complete", err)
	}
	return dedup.ErrLeaseLost
}

// Release implements [dedup.Store].
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := s.check(ctx, "release", key, token); err != nil {
		return err
	}
	n, err := s.exec(ctx, s.st.release, args(key, token, 0))
	if err != nil {
		return s.fail("release", err)
	}
	if n == 0 {
		return dedup.ErrLeaseLost
	}
	return nil
}

// Extend implements [dedup.Store].
func (s *Store) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	if err := s.check(ctx, "extend", key, token); err != nil {
		return err
	}
	a := args(key, token, millis(lease))
	n, err := s.exec(ctx, s.st.extend, a)
	if err != nil {
		return s.fail("extend", err)
	}
	if n > 0 {
		return nil
	}
	// MySQL counts changed rows, not matched ones: an extend within the
	// same millisecond changes nothing. Ask whether the lease is ours.
	var owned int64
	if err := s.row(ctx, s.st.owned, a, &owned); err != nil {
		return s.fail("extend", err)
	}
	if owned == 0 {
		return dedup.ErrLeaseLost
	}
	return nil
}

// Get implements [dedup.Inspector].
func (s *Store) Get(ctx context.Context, key string) (dedup.Record, bool, error) {
	if err := s.check(ctx, "get", key, ""); err != nil {
		return dedup.Record{}, false, err
	}
	var (
		state, owner string
		expires      int64
	)
	err := s.row(ctx, s.st.get, args(key, "", 0), &state, &owner, &expires)
	if errors.Is(err, ErrNoRows) {
		return dedup.Record{}, false, nil
	}
	if err != nil {
		return dedup.Record{}, false, s.fail("get", err)
	}
	return dedup.Record{Key: key, State: dedup.State(state), Owner: owner, ExpiresAt: time.UnixMilli(expires)}, true, nil
}

// Forget implements [dedup.Inspector].
func (s *Store) Forget(ctx context.Context, key string) error {
	if err := s.check(ctx, "forget", key, ""); err != nil {
		return err
	}
	if _, err := s.exec(ctx, s.st.forget, args(key, "", 0)); err != nil {
		return s.fail("forget", err)
	}
	return nil
}

// forgetIdleRounds bounds how often ForgetIdle reads again when the row
// changed between its read and its delete.
const forgetIdleRounds = 5

// ForgetIdle implements [dedup.IdleForgetter]. It reads the row, then
// deletes it with a statement that keeps a live lease, so a claim made
// between the two is never deleted.
func (s *Store) ForgetIdle(ctx context.Context, key string) (dedup.Record, bool, error) {
	if err := s.check(ctx, "forget", key, ""); err != nil {
		return dedup.Record{}, false, err
	}
	for range forgetIdleRounds {
		rec, ok, err := s.Get(ctx, key)
		if err != nil {
			return dedup.Record{}, false, err
		}
		if ok && rec.State == dedup.StateProcessing {
			return rec, true, fmt.Errorf("%w: %s is processing, owner %s", dedup.ErrLeaseHeld, key, rec.Owner)
		}
		if !ok {
			return dedup.Record{}, false, nil // absent or expired: nothing to forget
		}
		n, err := s.exec(ctx, s.st.forgetIdle, args(key, "", 0))
		if err != nil {
			return dedup.Record{}, false, s.fail("forget", err)
		}
		if n == 1 {
			return rec, true, nil
		}
		// The done row expired, was forgotten or claimed meanwhile: look again.
	}
	return dedup.Record{}, false, s.fail("forget", fmt.Errorf("key %q kept changing", key))
}

// Purge deletes every expired row, at most batch rows per statement (default
// 1000 when batch <= 0), and returns how many it deleted. A row that is
// claimed again while the purge runs is not deleted.
func (s *Store) Purge(ctx context.Context, batch int) (int64, error) {
	if batch <= 0 {
		batch = 1000
	}
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, s.fail("purge", err)
		}
		n, err := s.exec(ctx, s.st.purge, [numArgs]any{argBatch: batch})
		total += n
		if err != nil {
			return total, s.fail("purge", err)
		}
		if n < int64(batch) {
			return total, nil
		}
	}
}

// Purged returns how many rows the background purger has deleted.
func (s *Store) Purged() int64 { return s.purged.Load() }

func (s *Store) purger(ctx context.Context) {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.PurgeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := s.Purge(ctx, s.cfg.PurgeBatch)
		s.purged.Add(n)
		if err != nil && ctx.Err() == nil {
			s.cfg.Logger.Warn("dedup sql purge failed", "dialect", s.d.Name, "table", s.cfg.Table, "err", err)
		}
	}
}

// Stats counts the table's rows (a full scan: for operators, not hot paths).
type Stats struct {
	Processing int64 // live leases
	Done       int64 // live done records
	Expired    int64 // rows the purge would delete
}

// Stats counts the rows by state.
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	if err := ctx.Err(); err != nil {
		return Stats{}, s.fail("stats", err)
	}
	var st Stats
	if err := s.row(ctx, s.st.stats, [numArgs]any{}, &st.Processing, &st.Done, &st.Expired); err != nil {
		return Stats{}, s.fail("stats", err)
	}
	return st, nil
}
