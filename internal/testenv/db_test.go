package testenv

import (
	"context"
	"database/sql"
	"testing"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	_ "modernc.org/sqlite"
)

func TestServicesReachable(t *testing.T) {
	ctx := context.Background()
	RequireAMQP(t)
	c, prefix := Redis(t)
	if err := c.Set(ctx, prefix+":k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	pg, err := pgx.Connect(ctx, PostgresDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close(ctx)
	var v string
	if err := pg.QueryRow(ctx, "SHOW server_version").Scan(&v); err != nil {
		t.Fatal(err)
	}
	t.Logf("PostgreSQL %s", v)
	my, err := sql.Open("mysql", MySQLDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer my.Close()
	if err := my.QueryRow("SELECT VERSION()").Scan(&v); err != nil {
		t.Fatal(err)
	}
	t.Logf("MariaDB %s", v)
	lite, err := sql.Open("sqlite", SQLitePath(t))
	if err != nil {
		t.Fatal(err)
	}
	defer lite.Close()
	if err := lite.QueryRow("SELECT sqlite_version()").Scan(&v); err != nil {
		t.Fatal(err)
	}
	t.Logf("SQLite %s", v)
}

func TestPrivateRedisRestart(t *testing.T) {
	r := StartPrivateRedis(t, true)
	c := r.Client()
	defer c.Close()
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	r.Restart()
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("after restart with appendonly: %q %v", got, err)
	}
}
