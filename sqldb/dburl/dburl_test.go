package dburl_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemq/idemq/sqldb"
	"github.com/idemq/idemq/sqldb/dburl"
)

// TestParse: each form resolves to its dialect and driver DSN; a string
// whose form says nothing, or that is not what the dialect named takes,
// is refused with its sentinel, and no error shows the password.
func TestParse(t *testing.T) {
	for _, c := range []struct {
		s, dialect string
		want       dburl.Target
		err        error
	}{
		{s: "postgres://u:p@h/db", want: dburl.Target{Dialect: sqldb.Postgres, DSN: "postgres://u:p@h/db"}},
		{s: "PostgreSQL://h/db", want: dburl.Target{Dialect: sqldb.Postgres, DSN: "PostgreSQL://h/db"}},
		{s: "host=db user=app", dialect: "pg", want: dburl.Target{Dialect: sqldb.Postgres, DSN: "host=db user=app"}},
		{s: "mysql://u:p@tcp(h:3306)/app?parseTime=true", want: dburl.Target{Dialect: sqldb.MySQL, DSN: "u:p@tcp(h:3306)/app?parseTime=true"}},
		{s: "mariadb://u:p@db.local/app", want: dburl.Target{Dialect: sqldb.MySQL, DSN: "u:p@tcp(db.local:3306)/app"}},
		{s: "mysql://u:p@db.local:3307/app?timeout=5s", want: dburl.Target{Dialect: sqldb.MySQL, DSN: "u:p@tcp(db.local:3307)/app?timeout=5s"}},
		{s: "u:p@/app", dialect: "MariaDB", want: dburl.Target{Dialect: sqldb.MySQL, DSN: "u:p@/app"}},
		{s: "sqlite:///var/lib/app.db", want: dburl.Target{Dialect: sqldb.SQLite, DSN: "/var/lib/app.db"}},
		{s: "file:app.db?mode=rwc", want: dburl.Target{Dialect: sqldb.SQLite, DSN: "file:app.db?mode=rwc"}},
		{s: "/var/lib/app.db", dialect: "sqlite3", want: dburl.Target{Dialect: sqldb.SQLite, DSN: "/var/lib/app.db"}},
		{s: "/var/lib/app.db", err: dburl.ErrForm},
		{s: "app:s3cret@127.0.0.1:1/app", err: dburl.ErrForm},
		{s: "host=db password=s3cret", err: dburl.ErrForm},
		{s: "host=db password=s3cret", dialect: "sqlite", err: dburl.ErrNotSQLite},
		{s: "postgres://u:s3cret@h/db", dialect: "sqlite", err: dburl.ErrNotSQLite},
		{s: "sqlite://", err: dburl.ErrEmptyPath},
		{s: "x", dialect: "oracle", err: dburl.ErrDialect},
		{s: "mysql://u:s3cret@[::1/app"},
	} {
		got, err := dburl.Parse(c.s, c.dialect)
		switch {
		case c.err == nil && c.want == (dburl.Target{}):
			if err == nil {
				t.Errorf("Parse(%q, %q) = %+v, want an error", c.s, c.dialect, got)
			}
		case c.err != nil:
			if !errors.Is(err, c.err) {
				t.Errorf("Parse(%q, %q) = %+v, %v; want %v", c.s, c.dialect, got, err, c.err)
			}
		case err != nil || got != c.want:
			t.Errorf("Parse(%q, %q) = %+v, %v; want %+v", c.s, c.dialect, got, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Parse(%q, %q): the error shows the password: %v", c.s, c.dialect, err)
		}
	}
}

// TestOpenRefuses: a DSN the driver cannot parse is an *Error naming it
// redacted; opening connects to nothing.
func TestOpenRefuses(t *testing.T) {
	_, _, err := dburl.Open(t.Context(), dburl.Target{Dialect: sqldb.Postgres, DSN: "postgres://u:s3cret@h:99999999/db"})
	var e *dburl.Error
	if !errors.As(err, &e) || e.Op != "open" || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("Open: %v", err)
	}
	db, closeDB, err := dburl.Open(t.Context(), dburl.Target{Dialect: sqldb.MySQL, DSN: "u:p@tcp(127.0.0.1:1)/db"})
	if err != nil || db.Dialect().Name != sqldb.MySQL {
		t.Fatalf("Open mysql: %v", err)
	}
	closeDB()
	if (dburl.Target{Dialect: sqldb.MySQL}).Listener() != nil || (dburl.Target{Dialect: sqldb.Postgres, DSN: "postgres://h/db"}).Listener() == nil {
		t.Fatal("Listener: want one on PostgreSQL only")
	}
}
