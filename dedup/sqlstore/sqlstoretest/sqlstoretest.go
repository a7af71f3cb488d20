package sqlstoretest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/sqlstore"
	"github.com/idemq/idemq/dedup/storetest"
	"github.com/idemq/idemq/sqldb"
	"github.com/idemq/idemq/sqldb/sqldbtest"
)

// Features describes the backend under test.
type Features struct {
	// Parallel: the cases run in parallel (t.Parallel), each on its own
	// database; the timing cases of the dedup conformance suite stay
	// sequential.
	Parallel bool
	// Lease overrides storetest.Suite.Lease (default 300ms).
	Lease time.Duration
}

// harness opens stores on the backend.
type harness struct {
	// Database returns the address of a fresh, empty database.
	Database func(t *testing.T) string
	// Open opens a new pool on database db — as another process would —
	// and a store on it with cfg, migrating unless cfg.NoMigrate.
	Open func(t *testing.T, db string, cfg sqlstore.Config) (*sqlstore.Store, error)
	// Broken returns a migrated store whose pool is then closed.
	Broken func(t *testing.T) *sqlstore.Store
}

// Run runs the dedup conformance suite and the SQL cases on backend b.
func Run[T any](t *testing.T, b sqldbtest.Backend[T], f Features) {
	open := func(t *testing.T, addr string, cfg sqlstore.Config) (*sqlstore.Store, func(), error) {
		t.Helper()
		db, closeDB := b.Open(t, addr)
		s, err := sqlstore.New(sqldbtest.Context(t), db, cfg)
		if err != nil {
			closeDB()
			return nil, nil, err
		}
		t.Cleanup(func() { s.Close() })
		return s, closeDB, nil
	}
	h := harness{
		Database: func(t *testing.T) string { return b.NewDatabase(t) },
		Open: func(t *testing.T, addr string, cfg sqlstore.Config) (*sqlstore.Store, error) {
			s, _, err := open(t, addr, cfg)
			return s, err
		},
		Broken: func(t *testing.T) *sqlstore.Store {
			s, closeDB, err := open(t, b.NewDatabase(t), sqlstore.Config{})
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			closeDB()
			return s
		},
	}
	t.Run("Conformance", func(t *testing.T) {
		if f.Parallel {
			t.Parallel()
		}
		storetest.Run(t, storetest.Suite{
			New:      func(t *testing.T) dedup.Store { return h.fresh(t, sqlstore.Config{}) },
			Broken:   func(t *testing.T) dedup.Store { return h.Broken(t) },
			Lease:    f.Lease,
			Features: storetest.Features{Parallel: f.Parallel},
		})
	})
	cases := []struct {
		name string
		fn   func(*testing.T, harness)
	}{
		{"MigrateConcurrently", migrateConcurrently},
		{"ClaimAcrossPools", claimAcrossPools},
		{"ExtendAtOnce", extendAtOnce},
		{"PurgeInBatches", purgeInBatches},
		{"BackgroundPurger", backgroundPurger},
		{"Inspector", inspector},
		{"ForgetIdle", forgetIdle},
		{"TablesAreIndependent", tablesIndependent},
		{"InvalidTableRejected", invalidTable},
		{"KeysAreByteExact", byteExactKeys},
		{"TokenTooLongRejected", longToken},
		{"BrokenStoreFails", brokenStore},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if f.Parallel {
				t.Parallel()
			}
			c.fn(t, h)
		})
	}
}

func (h harness) fresh(t *testing.T, cfg sqlstore.Config) *sqlstore.Store {
	t.Helper()
	s, err := h.Open(t, h.Database(t), cfg)
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	return s
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// eventually polls cond until it holds or 20s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func claim(t *testing.T, s dedup.Store, key, token string, lease time.Duration, want dedup.ClaimResult) {
	t.Helper()
	c, err := s.Claim(ctx(t), key, token, lease)
	if err != nil {
		t.Fatalf("Claim(%.40q, %q): %v", key, token, err)
	}
	if c.Result != want {
		t.Fatalf("Claim(%.40q, %q) = %v, want %v", key, token, c.Result, want)
	}
}

func stats(t *testing.T, s *sqlstore.Store) sqlstore.Stats {
	t.Helper()
	st, err := s.Stats(ctx(t))
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	return st
}

// migrateConcurrently: eight "processes" (pools) open and migrate the same
// database at once, then share one table.
func migrateConcurrently(t *testing.T, h harness) {
	db := h.Database(t)
	const n = 8
	stores := make([]*sqlstore.Store, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			stores[i], errs[i] = h.Open(t, db, sqlstore.Config{})
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("concurrent open+migrate %d: %v", i, err)
		}
	}
	// Migrating an existing table again is a no-op.
	if err := stores[0].Migrate(ctx(t)); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	claim(t, stores[1], "mig:k", "t1", time.Minute, dedup.Acquired)
	for _, s := range stores[2:] {
		claim(t, s, "mig:k", "t2", time.Minute, dedup.InFlight)
	}
}

// claimAcrossPools: claimers in several "processes" (pools) race for the
// same keys; each key is acquired exactly once.
func claimAcrossPools(t *testing.T, h harness) {
	db := h.Database(t)
	const pools, perPool, keys = 4, 5, 20
	stores := make([]*sqlstore.Store, pools)
	for i := range stores {
		s, err := h.Open(t, db, sqlstore.Config{})
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
		stores[i] = s
	}
	var mu sync.Mutex
	won := map[string]int{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for p, s := range stores {
		for g := 0; g < perPool; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for k := 0; k < keys; k++ {
					key := fmt.Sprintf("pools:%d", (k+g)%keys)
					c, err := s.Claim(ctx(t), key, fmt.Sprintf("p%d-g%d", p, g), time.Minute)
					if err != nil {
						t.Errorf("Claim: %v", err)
						return
					}
					if c.Result == dedup.Acquired {
						mu.Lock()
						won[key]++
						mu.Unlock()
					} else if c.Result != dedup.InFlight {
						t.Errorf("Claim = %v, want acquired or in-flight", c.Result)
					}
				}
			}()
		}
	}
	close(start)
	wg.Wait()
	if len(won) != keys {
		t.Fatalf("%d keys acquired, want %d", len(won), keys)
	}
	for k, n := range won {
		if n != 1 {
			t.Fatalf("%s acquired %d times, want once", k, n)
		}
	}
}

// extendAtOnce: extends in quick succession (within one millisecond of the
// claim, so the expiry does not change) still succeed.
func extendAtOnce(t *testing.T, h harness) {
	s := h.fresh(t, sqlstore.Config{})
	for i := 0; i < 20; i++ {
		k := fmt.Sprint("ext:", i)
		claim(t, s, k, "tok", time.Minute, dedup.Acquired)
		for j := 0; j < 3; j++ {
			if err := s.Extend(ctx(t), k, "tok", time.Minute); err != nil {
				t.Fatalf("Extend %d of %s: %v", j, k, err)
			}
		}
		if err := s.Extend(ctx(t), k, "other", time.Minute); !errors.Is(err, dedup.ErrLeaseLost) {
			t.Fatalf("Extend by another token: %v, want ErrLeaseLost", err)
		}
	}
}

func purgeInBatches(t *testing.T, h harness) {
	s := h.fresh(t, sqlstore.Config{})
	const short = 50 * time.Millisecond
	const expiring = 13
	for i := 0; i < expiring; i++ {
		k := fmt.Sprintf("purge:exp:%d", i)
		if i%2 == 1 {
			claim(t, s, k, "t", short, dedup.Acquired) // a lease nobody renews
			continue
		}
		// and done records whose window passes
		claim(t, s, k, "t", time.Minute, dedup.Acquired)
		if err := s.Complete(ctx(t), k, "t", short); err != nil {
			t.Fatalf("Complete: %v", err)
		}
	}
	for i := 0; i < 3; i++ {
		k := fmt.Sprintf("purge:live:%d", i)
		claim(t, s, k, "t", time.Minute, dedup.Acquired)
		claim(t, s, k+":done", "t", time.Minute, dedup.Acquired)
		if err := s.Complete(ctx(t), k+":done", "t", time.Minute); err != nil {
			t.Fatalf("Complete: %v", err)
		}
	}
	eventually(t, "the short records to expire", func() bool { return stats(t, s).Expired == expiring })
	n, err := s.Purge(ctx(t), 0, 4) // 4 statements: 4+4+4+1
	if err != nil {
		t.Fatalf("Purge: %v", err)
	}
	if n != expiring {
		t.Fatalf("Purge deleted %d rows, want %d", n, expiring)
	}
	if got, want := stats(t, s), (sqlstore.Stats{Processing: 3, Done: 3}); got != want {
		t.Fatalf("after purge: %+v, want %+v", got, want)
	}
	if n, err := s.Purge(ctx(t), 0, 0); err != nil || n != 0 {
		t.Fatalf("second Purge = %d, %v; want 0, nil", n, err)
	}
	// The live records are untouched.
	claim(t, s, "purge:live:0", "other", time.Minute, dedup.InFlight)
	claim(t, s, "purge:live:0:done", "other", time.Minute, dedup.Done)
	// A purged key is new again.
	claim(t, s, "purge:exp:0", "again", time.Minute, dedup.Acquired)
}

func backgroundPurger(t *testing.T, h harness) {
	s := h.fresh(t, sqlstore.Config{PurgeInterval: 50 * time.Millisecond, PurgeBatch: 2})
	for i := 0; i < 5; i++ {
		claim(t, s, fmt.Sprintf("bg:%d", i), "t", 50*time.Millisecond, dedup.Acquired)
	}
	claim(t, s, "bg:live", "t", time.Minute, dedup.Acquired)
	eventually(t, "the background purger to delete the expired rows", func() bool {
		st := stats(t, s)
		return st.Expired == 0 && st.Processing == 1 && s.Purged() >= 5
	})
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	claim(t, s, "bg:live", "other", time.Minute, dedup.InFlight)
}

// forgetIdle: ForgetIdle deletes a done record, never a live lease, and
// reports what it found.
func forgetIdle(t *testing.T, h harness) {
	s := h.fresh(t, sqlstore.Config{})
	if _, found, err := s.ForgetIdle(ctx(t), "fi:absent"); err != nil || found {
		t.Fatalf("ForgetIdle absent = found %v, %v", found, err)
	}
	const k = "fi:k"
	claim(t, s, k, "tok", time.Minute, dedup.Acquired)
	rec, found, err := s.ForgetIdle(ctx(t), k)
	if !errors.Is(err, dedup.ErrLeaseHeld) || !found || rec.State != dedup.StateProcessing || rec.Owner != "tok" ||
		time.Until(rec.ExpiresAt) < 30*time.Second {
		t.Fatalf("ForgetIdle live lease = %+v, found %v, %v; want the lease and ErrLeaseHeld", rec, found, err)
	}
	claim(t, s, k, "other", time.Minute, dedup.InFlight) // the lease is still there
	if err := s.Complete(ctx(t), k, "tok", time.Hour); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	rec, found, err = s.ForgetIdle(ctx(t), k)
	if err != nil || !found || rec.State != dedup.StateDone {
		t.Fatalf("ForgetIdle done = %+v, found %v, %v", rec, found, err)
	}
	claim(t, s, k, "rerun", time.Minute, dedup.Acquired)
	// An expired lease is no lease: nothing to refuse, nothing reported.
	claim(t, s, "fi:short", "tok", 50*time.Millisecond, dedup.Acquired)
	eventually(t, "the short lease to expire", func() bool {
		_, ok, err := s.Get(ctx(t), "fi:short")
		return err == nil && !ok
	})
	if _, found, err := s.ForgetIdle(ctx(t), "fi:short"); err != nil || found {
		t.Fatalf("ForgetIdle expired lease = found %v, %v", found, err)
	}
}

func inspector(t *testing.T, h harness) {
	s := h.fresh(t, sqlstore.Config{})
	const k = "insp:k"
	if _, ok, err := s.Get(ctx(t), k); err != nil || ok {
		t.Fatalf("Get absent = ok %v, %v; want false, nil", ok, err)
	}
	before := time.Now()
	claim(t, s, k, "tok", time.Minute, dedup.Acquired)
	rec, ok, err := s.Get(ctx(t), k)
	if err != nil || !ok {
		t.Fatalf("Get processing = ok %v, %v", ok, err)
	}
	if rec.Key != k || rec.State != dedup.StateProcessing || rec.Owner != "tok" {
		t.Fatalf("Get processing = %+v", rec)
	}
	// The database's clock may differ a little from ours.
	if lo, hi := before.Add(time.Minute-10*time.Second), time.Now().Add(time.Minute+10*time.Second); rec.ExpiresAt.Before(lo) || rec.ExpiresAt.After(hi) {
		t.Fatalf("ExpiresAt = %v, want about a minute from now", rec.ExpiresAt)
	}
	if err := s.Complete(ctx(t), k, "tok", time.Hour); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	rec, ok, err = s.Get(ctx(t), k)
	if err != nil || !ok || rec.State != dedup.StateDone || rec.Owner != "" || time.Until(rec.ExpiresAt) < 50*time.Minute {
		t.Fatalf("Get done = %+v, ok %v, %v", rec, ok, err)
	}
	if err := s.Forget(ctx(t), k); err != nil {
		t.Fatalf("Forget: %v", err)
	}
	if _, ok, err := s.Get(ctx(t), k); err != nil || ok {
		t.Fatalf("Get after Forget = ok %v, %v", ok, err)
	}
	claim(t, s, k, "rerun", time.Minute, dedup.Acquired)
	if err := s.Forget(ctx(t), "insp:absent"); err != nil {
		t.Fatalf("Forget absent: %v", err)
	}
	// An expired record is absent to Get, purged or not.
	claim(t, s, "insp:short", "tok", 50*time.Millisecond, dedup.Acquired)
	eventually(t, "the short lease to expire", func() bool {
		_, ok, err := s.Get(ctx(t), "insp:short")
		return err == nil && !ok
	})
	if _, _, err := s.Get(ctx(t), ""); !errors.Is(err, dedup.ErrInvalidKey) {
		t.Fatalf("Get empty key: %v, want ErrInvalidKey", err)
	}
}

func tablesIndependent(t *testing.T, h harness) {
	db := h.Database(t)
	a, err := h.Open(t, db, sqlstore.Config{Table: "dedup_a"})
	if err != nil {
		t.Fatalf("open a: %v", err)
	}
	b, err := h.Open(t, db, sqlstore.Config{Table: "dedup_b"})
	if err != nil {
		t.Fatalf("open b: %v", err)
	}
	if a.Table() != "dedup_a" || b.Table() != "dedup_b" {
		t.Fatalf("tables %q, %q", a.Table(), b.Table())
	}
	claim(t, a, "k", "t1", time.Minute, dedup.Acquired)
	claim(t, b, "k", "t2", time.Minute, dedup.Acquired)
	claim(t, a, "k", "t3", time.Minute, dedup.InFlight)
}

func invalidTable(t *testing.T, h harness) {
	db := h.Database(t)
	for _, name := range []string{"x; DROP TABLE y", "1abc", "a-b", "a.b.c", `a"b`, strings.Repeat("a", sqldb.MaxTableLength+1)} {
		if _, err := h.Open(t, db, sqlstore.Config{Table: name}); !errors.Is(err, sqldb.ErrInvalidIdentifier) {
			t.Errorf("table %q: %v, want ErrInvalidIdentifier", name, err)
		}
	}
}

// byteExactKeys: keys are compared byte for byte — no case folding, no
// trailing-space padding, no Unicode normalisation — up to MaxKeyLength.
func byteExactKeys(t *testing.T, h harness) {
	s := h.fresh(t, sqlstore.Config{})
	keys := []string{
		"g:Order-1", "g:order-1", "g:order-1 ", "g:ORDER-1",
		"g:caf\u00e9", "g:cafe\u0301", "g:\u00fcber", "g:ueber",
		strings.Repeat("k", dedup.MaxKeyLength),
		strings.Repeat("\u00e9", dedup.MaxKeyLength/2), // 1024 bytes of 2-byte runes
		strings.Repeat("k", dedup.MaxKeyLength-1) + "x",
	}
	for i, k := range keys {
		claim(t, s, k, fmt.Sprint("t", i), time.Minute, dedup.Acquired)
	}
	for i, k := range keys {
		claim(t, s, k, "other", time.Minute, dedup.InFlight)
		if err := s.Complete(ctx(t), k, fmt.Sprint("t", i), time.Minute); err != nil {
			t.Fatalf("Complete key %d: %v", i, err)
		}
		rec, ok, err := s.Get(ctx(t), k)
		if err != nil || !ok || rec.Key != k || rec.State != dedup.StateDone {
			t.Fatalf("Get key %d = %+v, ok %v, %v", i, rec, ok, err)
		}
	}
	if _, err := s.Claim(ctx(t), strings.Repeat("k", dedup.MaxKeyLength+1), "t", time.Minute); !errors.Is(err, dedup.ErrInvalidKey) {
		t.Fatalf("Claim of a too long key: %v, want ErrInvalidKey", err)
	}
}

func longToken(t *testing.T, h harness) {
	s := h.fresh(t, sqlstore.Config{})
	tok := strings.Repeat("t", sqlstore.MaxTokenLength)
	claim(t, s, "tok:max", tok, time.Minute, dedup.Acquired)
	if err := s.Extend(ctx(t), "tok:max", tok, time.Minute); err != nil {
		t.Fatalf("Extend with the longest token: %v", err)
	}
	if _, err := s.Claim(ctx(t), "tok:long", tok+"x", time.Minute); !errors.Is(err, sqlstore.ErrInvalidToken) {
		t.Fatalf("Claim with a too long token: %v, want ErrInvalidToken", err)
	}
}

func brokenStore(t *testing.T, h harness) {
	s := h.Broken(t)
	var se *dedup.StoreError
	if err := s.Migrate(ctx(t)); !errors.As(err, &se) {
		t.Fatalf("Migrate on a broken store: %v, want a *dedup.StoreError", err)
	}
	if _, ok, err := s.Get(ctx(t), "k"); !errors.As(err, &se) || ok {
		t.Fatalf("Get on a broken store: ok %v, %v; want a *dedup.StoreError", ok, err)
	}
	if err := s.Forget(ctx(t), "k"); !errors.As(err, &se) {
		t.Fatalf("Forget on a broken store: %v, want a *dedup.StoreError", err)
	}
	if _, err := s.Purge(ctx(t), 0, 10); !errors.As(err, &se) {
		t.Fatalf("Purge on a broken store: %v, want a *dedup.StoreError", err)
	}
	if _, err := s.Stats(ctx(t)); !errors.As(err, &se) {
		t.Fatalf("Stats on a broken store: %v, want a *dedup.StoreError", err)
	}
}

// BenchmarkClaimComplete measures the guard's happy path on store s: Claim
// (new key) then Complete, from GOMAXPROCS*4 goroutines.
func BenchmarkClaimComplete(b *testing.B, s dedup.Store) {
	var seq atomic.Int64
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c := context.Background()
		for pb.Next() {
			k := fmt.Sprintf("bench:%d:%d", time.Now().UnixNano(), seq.Add(1))
			r, err := s.Claim(c, k, "tok", time.Minute)
			if err != nil || r.Result != dedup.Acquired {
				b.Errorf("Claim = %v, %v", r.Result, err)
				return
			}
			if err := s.Complete(c, k, "tok", time.Hour); err != nil {
				b.Errorf("Complete: %v", err)
				return
			}
		}
	})
}
