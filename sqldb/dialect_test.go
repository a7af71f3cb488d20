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
	if got := pg.Rebind("a = ? AND b = ?"); got != "a = $1 AND b = $2" {
		t.Fatalf("Rebind = %s", got)
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
