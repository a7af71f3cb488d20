package sqldb_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemq/idemq/sqldb"
	"github.com/idemq/idemq/sqldb/mysql"
	"github.com/idemq/idemq/sqldb/postgres"
	"github.com/idemq/idemq/sqldb/sqlite"
)

// TestCheckTable: the one identifier rule, on every dialect.
func TestCheckTable(t *testing.T) {
	for _, d := range []*sqldb.Dialect{postgres.Dialect(), mysql.Dialect(), sqlite.Dialect()} {
		for name, ok := range map[string]bool{
			"idemq_outbox": true, "_x1": true, "App_Outbox": true, strings.Repeat("a", sqldb.MaxTableLength): true,
			"app.outbox": d.Schemas,
			"":           false, "1abc": false, "a;drop": false, "a.b.c": false, `a"b`: false, "a`b": false, "a b": false,
			strings.Repeat("a", sqldb.MaxTableLength+1): false, ".x": false, "x.": false,
		} {
			err := d.CheckTable(name)
			if (err == nil) != ok || (err != nil && !errors.Is(err, sqldb.ErrInvalidIdentifier)) {
				t.Errorf("%s: CheckTable(%q) = %v, want ok=%v", d.Name, name, err, ok)
			}
		}
	}
}

func TestQuote(t *testing.T) {
	for _, tc := range []struct {
		d    *sqldb.Dialect
		in   string
		want string
	}{
		{postgres.Dialect(), "orders", `"orders"`},
		{postgres.Dialect(), "shop.orders", `"shop"."orders"`},
		{mysql.Dialect(), "orders", "`orders`"},
		{sqlite.Dialect(), "o_1", `"o_1"`},
	} {
		if got, err := tc.d.QuoteTable(tc.in); err != nil || got != tc.want {
			t.Errorf("%s.QuoteTable(%q) = %q, %v", tc.d.Name, tc.in, got, err)
		}
	}
	if got := postgres.Dialect().Derived("shop.orders", "_idx"); got != `"orders_idx"` {
		t.Errorf("Derived = %s", got)
	}
}

func TestCompile(t *testing.T) {
	pg, my := postgres.Dialect(), mysql.Dialect()
	const tmpl = "SELECT @a, @b, @a FROM {table} WHERE x < {now} AND {idx:_i} IS NULL"
	st, err := pg.Compile(tmpl, pg.TableVars("s.t"), "a", "b")
	if err != nil {
		t.Fatal(err)
	}
	if want := `SELECT $1, $2, $1 FROM "s"."t" WHERE x < ` + pg.NowMillis + ` AND "t_i" IS NULL`; st.SQL != want {
		t.Fatalf("postgres:\n%s\nwant\n%s", st.SQL, want)
	}
	if got := st.Args("A", "B"); len(got) != 2 || got[0] != "A" || got[1] != "B" {
		t.Fatalf("postgres args %v", got)
	}
	st, err = my.Compile(tmpl, my.TableVars("t"), "a", "b")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(st.SQL, "SELECT ?, ?, ? FROM `t`") {
		t.Fatalf("mysql: %s", st.SQL)
	}
	if got := st.Args("A", "B"); len(got) != 3 || got[2] != "A" {
		t.Fatalf("mysql args %v", got)
	}
	if _, err := my.Compile("SELECT @c", nil, "a"); err == nil {
		t.Fatal("unknown parameter accepted")
	}
	if _, err := my.Compile("SELECT {nope}", nil); err == nil {
		t.Fatal("unknown variable accepted")
	}
	st, err = sqlite.Dialect().Compile("SELECT {ts} FROM t LIMIT 1{skip_locked}", nil)
	if err != nil || st.SQL != "SELECT "+sqlite.Dialect().Now+" FROM t LIMIT 1" {
		t.Fatalf("sqlite built-ins: %q, %v", st.SQL, err)
	}
	st, err = pg.Compile("SELECT 1 LIMIT 1{skip_locked}", nil)
	if err != nil || st.SQL != "SELECT 1 LIMIT 1 FOR UPDATE SKIP LOCKED" {
		t.Fatalf("postgres {skip_locked}: %q, %v", st.SQL, err)
	}
}

// TestRepeat: a list's template, numbered parameters and all, compiles
// for each dialect.
func TestRepeat(t *testing.T) {
	list, names := sqldb.Repeat("(@g, @id, 'x')", 3)
	if want := "(@g0, @id0, 'x'), (@g1, @id1, 'x'), (@g2, @id2, 'x')"; list != want {
		t.Fatalf("Repeat = %q, want %q", list, want)
	}
	if got := strings.Join(names, ","); got != "g0,id0,g1,id1,g2,id2" {
		t.Fatalf("names = %s", got)
	}
	list, names = sqldb.Repeat("@id", 11)
	pg := postgres.Dialect()
	st, err := pg.Compile("SELECT @k WHERE id IN ("+list+")", nil, append([]string{"k"}, names...)...)
	if err != nil {
		t.Fatal(err)
	}
	if want := "SELECT $1 WHERE id IN ($2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"; st.SQL != want {
		t.Fatalf("postgres: %s", st.SQL)
	}
	if got := st.Args("k", 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10); len(got) != 12 || got[11] != 10 {
		t.Fatalf("args %v", got)
	}
	l := sqldb.NewList(func(n int) (sqldb.Stmt, error) {
		in, names := sqldb.Repeat("@id", n)
		return mysql.Dialect().Compile("DELETE FROM t WHERE id IN ("+in+")", nil, names...)
	})
	for _, n := range []int{2, 2, 600} {
		st, err := l.Stmt(n)
		if err != nil || strings.Count(st.SQL, "?") != n {
			t.Fatalf("List.Stmt(%d) = %q, %v", n, st.SQL, err)
		}
	}
}

// TestLimitedDelete: DELETE with a limit, in each dialect's form.
func TestLimitedDelete(t *testing.T) {
	del := sqldb.LimitedDelete{Table: "t", Key: "a, b", RowID: true, Where: "x < @c", StableOrder: "x", Limit: "@n"}
	for _, tc := range []struct {
		d          *sqldb.Dialect
		skipLocked bool
		want       string
	}{
		{postgres.Dialect(), false, "DELETE FROM t WHERE (a, b) IN (SELECT a, b FROM t WHERE x < @c LIMIT @n)"},
		{postgres.Dialect(), true, "DELETE FROM t WHERE (a, b) IN (SELECT a, b FROM t WHERE x < @c LIMIT @n FOR UPDATE SKIP LOCKED) AND x < @c"},
		{mysql.Dialect(), true, "DELETE FROM t WHERE x < @c ORDER BY x LIMIT @n"},
		{sqlite.Dialect(), true, "DELETE FROM t WHERE rowid IN (SELECT rowid FROM t WHERE x < @c LIMIT @n)"},
	} {
		del.SkipLocked = tc.skipLocked
		if got := tc.d.LimitedDelete(del); got != tc.want {
			t.Errorf("%s (skip locked %v):\n%s\nwant\n%s", tc.d.Name, tc.skipLocked, got, tc.want)
		}
	}
	del = sqldb.LimitedDelete{Table: "t", Key: "id", Where: "x < 1", OrderBy: "id", Limit: "5"}
	if got, want := sqlite.Dialect().LimitedDelete(del), "DELETE FROM t WHERE id IN (SELECT id FROM t WHERE x < 1 ORDER BY id LIMIT 5)"; got != want {
		t.Errorf("sqlite ordered: %s", got)
	}
	if got, want := mysql.Dialect().LimitedDelete(del), "DELETE FROM t WHERE x < 1 ORDER BY id LIMIT 5"; got != want {
		t.Errorf("mysql ordered: %s", got)
	}
}

// TestSQLiteDSN: a path with characters that mean something in a URI is
// escaped; a file: URI keeps its own options.
func TestSQLiteDSN(t *testing.T) {
	for _, tc := range []struct{ path, want string }{
		{"/tmp/x.db", "file:/tmp/x.db?_pragma=busy_timeout%2830000%29&_pragma=journal_mode%28WAL%29"},
		{"/tmp/a dir?#%/x.db", "file:/tmp/a%20dir%3F%23%25/x.db?_pragma"},
		{"file:/tmp/x.db?mode=rwc", "file:/tmp/x.db?mode=rwc&_pragma"},
	} {
		if got := sqlite.DSN(tc.path, 0); !strings.HasPrefix(got, tc.want) || !strings.Contains(got, "_txlock=immediate") {
			t.Errorf("DSN(%q) = %q, want prefix %q and _txlock=immediate", tc.path, got, tc.want)
		}
	}
}
