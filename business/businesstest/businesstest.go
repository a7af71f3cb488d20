// Package businesstest is the suite every dialect of the business helpers
// runs against its real database.
package businesstest

import (
	"context"
	"errors"
	"testing"

	"github.com/idemq/idemq/business"
)

// Run tests InsertOnce, duplicate-key detection and Transition on e, an
// empty database of dialect d. isDup is the dialect's IsDuplicateKey.
func Run(t *testing.T, d business.Dialect, e business.Execer, isDup func(error) bool) {
	ctx := context.Background()
	ph := d.Placeholder
	mustExec := func(q string, args ...any) {
		t.Helper()
		if _, err := e.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	mustExec("CREATE TABLE orders (id VARCHAR(64) PRIMARY KEY, state VARCHAR(32) NOT NULL, total BIGINT NOT NULL)")

	t.Run("InsertOnce", func(t *testing.T) {
		q := "INSERT INTO orders (id, state, total) VALUES (" + ph(1) + ", 'new', " + ph(2) + ") ON CONFLICT DO NOTHING"
		if d == business.MySQL {
			q = "INSERT IGNORE INTO orders (id, state, total) VALUES (?, 'new', ?)"
		}
		for i, want := range []bool{true, false, false} {
			got, err := business.InsertOnce(ctx, e, q, "o-1", 100+i)
			if err != nil || got != want {
				t.Fatalf("attempt %d: inserted=%v err=%v, want %v", i, got, err, want)
			}
		}
		var total int64
		if err := e.QueryRow(ctx, "SELECT total FROM orders WHERE id = "+ph(1), "o-1").Scan(&total); err != nil || total != 100 {
			t.Fatalf("total=%d err=%v: the duplicate insert changed the row", total, err)
		}
	})

	t.Run("IsDuplicateKey", func(t *testing.T) {
		q := "INSERT INTO orders (id, state, total) VALUES (" + ph(1) + ", 'new', 1)"
		if _, err := e.Exec(ctx, q, "o-dup"); err != nil {
			t.Fatal(err)
		}
		_, err := e.Exec(ctx, q, "o-dup")
		if err == nil || !isDup(err) {
			t.Fatalf("duplicate insert: %v, IsDuplicateKey=false", err)
		}
		if !isDup(errors.Join(errors.New("wrapped"), err)) {
			t.Fatal("IsDuplicateKey does not see through wrapping")
		}
		_, other := e.Exec(ctx, "INSERT INTO no_such_table (x) VALUES (1)")
		if other == nil || isDup(other) || isDup(nil) || isDup(errors.New("23505 1062")) {
			t.Fatalf("IsDuplicateKey true for a non-duplicate error: %v", other)
		}
	})

	t.Run("Transition", func(t *testing.T) {
		mustExec("INSERT INTO orders (id, state, total) VALUES ("+ph(1)+", 'new', 5)", "o-2")
		m, err := business.NewMachine(d, "orders", "id", "state")
		if err != nil {
			t.Fatal(err)
		}
		// new → paid, then the same transition again (a redelivery) is an
		// idempotent success.
		for i := 0; i < 2; i++ {
			if err := m.Transition(ctx, e, "o-2", "new", "paid"); err != nil {
				t.Fatalf("new→paid #%d: %v", i, err)
			}
		}
		// paid → shipped ok; then new → paid again is refused, naming both.
		if err := m.Transition(ctx, e, "o-2", "paid", "shipped"); err != nil {
			t.Fatal(err)
		}
		err = m.Transition(ctx, e, "o-2", "new", "paid")
		var te *business.TransitionError
		if !errors.As(err, &te) || te.From != "new" || te.To != "paid" || te.Current != "shipped" || te.ID != "o-2" {
			t.Fatalf("got %v, want a TransitionError new→paid, current shipped", err)
		}
		if err := m.Transition(ctx, e, "missing", "new", "paid"); !errors.Is(err, business.ErrNotFound) {
			t.Fatalf("missing row: %v, want ErrNotFound", err)
		}
		if err := business.Transition(ctx, e, d, "orders", "id", "o-2", "state", "shipped", "shipped"); err != nil {
			t.Fatalf("shipped→shipped: %v", err)
		}
	})

	t.Run("Identifiers", func(t *testing.T) {
		for _, tc := range [][3]string{
			{"orders; DROP TABLE orders", "id", "state"},
			{"orders", "id\"", "state"},
			{"orders", "id", "a.b"},
			{"a.b.c", "id", "state"},
			{"", "id", "state"},
		} {
			if _, err := business.NewMachine(d, tc[0], tc[1], tc[2]); !errors.Is(err, business.ErrInvalidIdentifier) {
				t.Errorf("NewMachine%q: %v, want ErrInvalidIdentifier", tc, err)
			}
		}
	})
}
