package outagetest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/backoff"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sqldb"
)

// pgCheck connects to url and pings it: what a process starting checks.
func pgCheck(url string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		return conn.Ping(ctx)
	}
}

func mysqlCheck(dsn string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			return err
		}
		defer db.Close()
		return db.PingContext(ctx)
	}
}

// withDatabase returns url with its database replaced.
func withDatabase(t *testing.T, raw, db string) string {
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + db
	return u.String()
}

// sqldb.ConfigError on the errors real servers give: only definite
// configuration errors are; refusals, full servers, closed ports and
// stalls are not (a process starting waits them out).
func TestConfigErrorOnRealServers(t *testing.T) {
	pgURL := testenv.PostgresURL()
	dbURL := testenv.PostgresDB(t)
	refuse, allow := refuseConnections(t, dbURL)
	mysqlDSN := testenv.MySQLURL()
	closedPort := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", testenv.FreePort(t))
	cases := []struct {
		name   string
		check  func(ctx context.Context) error
		config bool
		before func()
	}{
		{"postgres: unknown database (3D000)", pgCheck(withDatabase(t, pgURL, "idemq_no_such_db")), true, nil},
		{"postgres: malformed URL", pgCheck("postgres://postgres@127.0.0.1:notaport/x"), true, nil},
		{"postgres: not accepting connections (55000)", pgCheck(dbURL), false, refuse},
		{"postgres: connection refused", pgCheck(closedPort), false, allow},
		{"mysql: wrong password (1045)", mysqlCheck(strings.Replace(mysqlDSN, "idemq:idemq@", "idemq:wrong@", 1)), true, nil},
		{"mysql: unknown database (1049)", mysqlCheck(mysqlDSN + "idemq_no_such_db"), true, nil},
		{"postgres: ready", pgCheck(dbURL), false, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.before != nil {
				tc.before()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := tc.check(ctx)
			if tc.name == "postgres: ready" {
				if err != nil {
					t.Fatalf("ready database: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("check succeeded; want an error")
			}
			if got := sqldb.ConfigError(err); got != tc.config {
				t.Errorf("ConfigError(%v) = %v, want %v", err, got, tc.config)
			}
		})
	}
}

// A process starting while PostgreSQL refuses new connections with a
// server error waits (logged once) and starts when it accepts them; an
// unknown database ends the wait after the grace period with an error
// naming what to fix.
func TestWaitForDatabase(t *testing.T) {
	dbURL := testenv.PostgresDB(t)
	refuse, allow := refuseConnections(t, dbURL)
	refuse()
	var checks atomic.Int32
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		done <- idemq.WaitFor(context.Background(), idemq.WaitConfig{Logger: logger(), Backoff: backoff.Policy{Min: 20 * time.Millisecond, Max: 200 * time.Millisecond}},
			idemq.Dependency{Name: "postgres", Config: sqldb.ConfigError, Fix: "--pg-url", Check: func(ctx context.Context) error {
				checks.Add(1)
				return pgCheck(dbURL)(ctx)
			}})
	}()
	testenv.Eventually(t, 30*time.Second, "several checks while refused", func() bool { return checks.Load() >= 3 })
	select {
	case err := <-done:
		t.Fatalf("WaitFor returned while the database refused connections: %v", err)
	default:
	}
	allow()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("WaitFor: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("WaitFor did not return within 30s of the database accepting connections")
	}

	grace := 500 * time.Millisecond
	start = time.Now()
	err := idemq.WaitFor(context.Background(), idemq.WaitConfig{Logger: logger(), Grace: grace, Backoff: backoff.Policy{Min: 20 * time.Millisecond, Max: 100 * time.Millisecond}},
		idemq.Dependency{Name: "postgres", Config: sqldb.ConfigError, Fix: "--pg-url (the database name)",
			Check: pgCheck(withDatabase(t, testenv.PostgresURL(), "idemq_no_such_db"))})
	var ce *idemq.DependencyConfigError
	if !errors.Is(err, idemq.ErrDependencyConfig) || !errors.As(err, &ce) || !strings.Contains(err.Error(), "--pg-url (the database name)") {
		t.Fatalf("unknown database: %v; want a DependencyConfigError naming --pg-url", err)
	}
	if el := time.Since(start); el < grace {
		t.Errorf("gave up after %v, before the grace period (%v)", el, grace)
	}
}
