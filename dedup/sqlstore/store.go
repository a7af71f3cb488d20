package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/sqldb"
)

// Config configures a [Store]. The zero value is usable.
type Config struct {
	// Table is the table name ([sqldb.Dialect.CheckTable]). Default
	// "idemq_dedup".
	Table string
	// NoMigrate: [New] does not apply the table's migrations (the schema
	// is managed elsewhere, e.g. by `idemq migrate up`). Default false: it
	// applies the pending ones.
	NoMigrate bool
	// PurgeInterval runs [Store.Purge] in the background at this interval
	// until [Store.Close]. Default 0: no background purger (call Purge
	// yourself).
	PurgeInterval time.Duration
	// PurgeBatch is the most rows one purge statement deletes. Default
	// 1000.
	PurgeBatch int
	// Logger receives the background purger's failures. Default
	// slog.Default().
	Logger *slog.Logger
}

// DefaultTable is the table name when [Config.Table] is empty.
const DefaultTable = "idemq_dedup"

// MaxTokenLength bounds an owner token in bytes (the owner column's size).
const MaxTokenLength = 1024

// ErrInvalidToken is returned for a token longer than [MaxTokenLength].
var ErrInvalidToken = errors.New("sqlstore: invalid token")

// Store is a SQL dedup store. It implements [dedup.Store] and
// [dedup.Inspector] and is safe for concurrent use by many goroutines and
// processes sharing the table. Create one with [New].
type Store struct {
	db   sqldb.DB
	d    *sqldb.Dialect
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

// ErrInvalidConfig is wrapped by every error [Config.Validate] returns.
var ErrInvalidConfig = idemq.ConfigErrorClass("sqlstore: invalid config")

// Validate checks what of cfg needs no database. [New] calls it, then
// checks the table name against the dialect ([sqldb.Dialect.CheckTable]).
func (cfg Config) Validate() error {
	if cfg.PurgeInterval < 0 || cfg.PurgeBatch < 0 {
		return fmt.Errorf("%w: negative PurgeInterval or PurgeBatch", ErrInvalidConfig)
	}
	return nil
}

// New returns a store on db (postgres.Pgx(pool), postgres.Std(db),
// mysql.Std(db), sqlite.Std(db)), applies the table's pending migrations
// unless cfg.NoMigrate, and then starts the background purger if
// cfg.PurgeInterval is set. The caller keeps owning db (close it after the
// store).
func New(ctx context.Context, db sqldb.DB, cfg Config) (*Store, error) {
	if db == nil {
		return nil, errors.New("sqlstore: nil DB")
	}
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	if cfg.PurgeBatch == 0 {
		cfg.PurgeBatch = 1000
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := db.Dialect()
	if err := d.CheckTable(cfg.Table); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	st, err := compile(d, cfg.Table)
	if err != nil {
		return nil, err
	}
	s := &Store{db: db, d: d, cfg: cfg, st: st, stop: func() {}}
	if !cfg.NoMigrate {
		if err := s.Migrate(ctx); err != nil {
			return nil, err
		}
	}
	if cfg.PurgeInterval > 0 { // after the table exists
		ctx, cancel := context.WithCancel(context.Background())
		s.stop = cancel
		s.wg.Add(1)
		go s.purger(ctx)
	}
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

// Migrate applies the table's pending migrations ([Schema]); safe to run
// from several processes at once.
func (s *Store) Migrate(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return s.fail("migrate", err)
	}
	if _, err := sqldb.Up(ctx, s.db, 0, Schema(s.cfg.Table)); err != nil {
		return s.fail("migrate", err)
	}
	return nil
}

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

func (s *Store) exec(ctx context.Context, st sqldb.Stmt, a [numArgs]any) (int64, error) {
	var n int64
	err := s.d.Retry(ctx, maxRetries, func() error {
		var err error
		n, err = s.db.Exec(ctx, st.SQL, st.Args(a[:]...)...)
		return err
	})
	return n, err
}

func (s *Store) row(ctx context.Context, st sqldb.Stmt, a [numArgs]any, dest ...any) error {
	return s.d.Retry(ctx, maxRetries, func() error {
		return s.db.QueryRow(ctx, st.SQL, st.Args(a[:]...)...).Scan(dest...)
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
		if s.st.claimReturnsRow {
			err := s.row(ctx, s.st.claim, a, &acquired, &state, &owner, &left)
			switch {
			case err == nil:
				haveRow, fromSnapshot = true, acquired == 0
			case errors.Is(err, sqldb.ErrNoRows):
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
			if errors.Is(err, sqldb.ErrNoRows) {
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
	if errors.Is(err, sqldb.ErrNoRows) {
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

// Purge deletes the rows that expired more than olderThan ago (0: every
// expired row), at most batch rows per statement (batch <= 0:
// Config.PurgeBatch), and returns how many it deleted. A row that is
// claimed again while the purge runs is not deleted.
func (s *Store) Purge(ctx context.Context, olderThan time.Duration, batch int) (int64, error) {
	if batch <= 0 {
		batch = s.cfg.PurgeBatch
	}
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, s.fail("purge", err)
		}
		n, err := s.exec(ctx, s.st.purge, [numArgs]any{argBatch: batch, argGrace: millis(olderThan)})
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
		n, err := s.Purge(ctx, 0, s.cfg.PurgeBatch)
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
