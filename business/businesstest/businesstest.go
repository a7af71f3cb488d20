// Package businesstest is the suite every SQL backend of the business
// helpers runs against its real database (the database only): InsertOnce,
// the dialect's duplicate-key detection and Transition, each run inside a
// transaction handed over the backend's one way (Backend.Tx).
//
//	func TestBusiness(t *testing.T) {
//		businesstest.Run(t, myBackend(), businesstest.Features{Parallel: true})
//	}
package businesstest

import (
	"context"
	"errors"
	"testing"

	"github.com/idemq/idemq/business"
	"github.com/idemq/idemq/sqldb"
	"github.com/idemq/idemq/sqldb/sqldbtest"
)

// Features describes the backend under test.
type Features struct {
	// Parallel: the cases run in parallel (t.Parallel), each on its own
	// database.
	Parallel bool
}

// env is one case's database and its orders table.
type env[T any] struct {
	t  *testing.T
	b  sqldbtest.Backend[T]
	db sqldb.Native[T]
	d  *sqldb.Dialect
}

func setup[T any](t *testing.T, b sqldbtest.Backend[T]) *env[T] {
	db := b.Fresh(t)
	sqldbtest.Exec(t, db, "CREATE TABLE orders (id VARCHAR(64) PRIMARY KEY, state VARCHAR(32) NOT NULL, total BIGINT NOT NULL)")
	return &env[T]{t: t, b: b, db: db, d: db.Dialect()}
}

// inTx runs fn in a committed transaction, handed over as Backend.Tx does.
func (e *env[T]) inTx(fn func(ctx context.Context, q sqldb.Querier)) {
	e.t.Helper()
	ctx := sqldbtest.Context(e.t)
	native, tx, err := e.db.BeginNative(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	defer func() { _ = sqldb.Rollback(ctx, tx) }()
	fn(ctx, e.b.Tx(native))
	if err := tx.Commit(ctx); err != nil {
		e.t.Fatal(err)
	}
}

// Run runs every case on backend b.
func Run[T any](t *testing.T, b sqldbtest.Backend[T], f Features) {
	for _, c := range []struct {
		name string
		fn   func(*testing.T, *env[T])
	}{
		{"InsertOnce", insertOnce[T]},
		{"IsDuplicateKey", isDuplicateKey[T]},
		{"Transition", transition[T]},
		{"Identifiers", identifiers[T]},
	} {
		t.Run(c.name, func(t *testing.T) {
			if f.Parallel {
				t.Parallel()
			}
			c.fn(t, setup(t, b))
		})
	}
}

func insertOnce[T any](t *testing.T, e *env[T]) {
	ph := e.d.Placeholder
	q := "INSERT INTO orders (id, state, total) VALUES (" + ph(1) + ", 'new', " + ph(2) + ") ON CONFLICT DO NOTHING"
	if e.d.Upsert == sqldb.OnDuplicateKey {
		q = "INSERT IGNORE INTO orders (id, state, total) VALUES (?, 'new', ?)"
	}
	for i, want := range []bool{true, false, false} {
		e.inTx(func(ctx context.Context, tx sqldb.Querier) {
			got, err := business.InsertOnce(ctx, tx, q, "o-1", 100+i)
			if err != nil || got != want {
				t.Fatalf("attempt %d: inserted=%v err=%v, want %v", i, got, err, want)
			}
		})
	}
	if total := sqldbtest.Int(t, e.db, "SELECT total FROM orders WHERE id = "+ph(1), "o-1"); total != 100 {
		t.Fatalf("total=%d: the duplicate insert changed the row", total)
	}
}

func isDuplicateKey[T any](t *testing.T, e *env[T]) {
	ctx := sqldbtest.Context(t)
	q := "INSERT INTO orders (id, state, total) VALUES (" + e.d.Placeholder(1) + ", 'new', 1)"
	sqldbtest.Exec(t, e.db, q, "o-dup")
	_, err := e.db.Exec(ctx, q, "o-dup")
	if err == nil || !e.d.IsDuplicateKey(err) {
		t.Fatalf("duplicate insert: %v, IsDuplicateKey=false", err)
	}
	if !e.d.IsDuplicateKey(errors.Join(errors.New("wrapped"), err)) {
		t.Fatal("IsDuplicateKey does not see through wrapping")
	}
	_, other := e.db.Exec(ctx, "INSERT INTO no_such_table (x) VALUES (1)")
	if other == nil || e.d.IsDuplicateKey(other) || e.d.IsDuplicateKey(nil) || e.d.IsDuplicateKey(errors.New("23505 1062")) {
		t.Fatalf("IsDuplicateKey true for a non-duplicate error: %v", other)
	}
}

func transition[T any](t *testing.T, e *env[T]) {
	sqldbtest.Exec(t, e.db, "INSERT INTO orders (id, state, total) VALUES ("+e.d.Placeholder(1)+", 'new', 5)", "o-2")
	m, err := business.NewMachine(e.d, "orders", "id", "state")
	if err != nil {
		t.Fatal(err)
	}
	e.inTx(func(ctx context.Context, tx sqldb.Querier) {
		// new → paid, then the same transition again (a redelivery) is an
		// idempotent success.
		for i := 0; i < 2; i++ {
			if err := m.Transition(ctx, tx, "o-2", "new", "paid"); err != nil {
				t.Fatalf("new→paid #%d: %v", i, err)
			}
		}
		// paid → shipped ok; then new → paid again is refused, naming both.
		if err := m.Transition(ctx, tx, "o-2", "paid", "shipped"); err != nil {
			t.Fatal(err)
		}
		err = m.Transition(ctx, tx, "o-2", "new", "paid")
		var te *business.TransitionError
		if !errors.As(err, &te) || te.From != "new" || te.To != "paid" || te.Current != "shipped" || te.ID != "o-2" {
			t.Fatalf("got %v, want a TransitionError new→paid, current shipped", err)
		}
		if err := m.Transition(ctx, tx, "missing", "new", "paid"); !errors.Is(err, business.ErrNotFound) {
			t.Fatalf("missing row: %v, want ErrNotFound", err)
		}
		if err := business.Transition(ctx, tx, e.d, "orders", "id", "o-2", "state", "shipped", "shipped"); err != nil {
			t.Fatalf("shipped→shipped: %v", err)
		}
	})
}

func identifiers[T any](t *testing.T, e *env[T]) {
	for _, tc := range [][3]string{
		{"orders; DROP TABLE orders", "id", "state"},
		{"orders", "id\"", "state"},
		{"orders", "id", "a.b"},
		{"a.b.c", "id", "state"},
		{"", "id", "state"},
		{"orders", "", "state"},
	} {
		if _, err := business.NewMachine(e.d, tc[0], tc[1], tc[2]); !errors.Is(err, sqldb.ErrInvalidIdentifier) {
			t.Errorf("NewMachine%q: %v, want sqldb.ErrInvalidIdentifier", tc, err)
		}
	}
}
