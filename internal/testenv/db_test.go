package testenv

import (
	"context"
	"database/sql"
	"strconv"
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

// A test's Redis cleanup deletes its own keys, and does not walk a
// database too large to scan in passing (SCAN reads every key).
func TestRedisCleanupKeepsToItsKeysAndItsBound(t *testing.T) {
	r := StartPrivateRedis(t, false)
	c := r.Client()
	defer c.Close()
	ctx := context.Background()
	set := func(keys ...string) {
		t.Helper()
		pipe := c.Pipeline()
		for _, k := range keys {
			pipe.Set(ctx, k, "v", 0)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	exists := func(keys ...string) int64 {
		t.Helper()
		n, err := c.Exists(ctx, keys...).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	mine := []string{"t-x:a", "q:t-x:b", "t-x:{c}"}
	set(append(mine, "other:a", "t-y:a")...)
	if scanned, err := deleteKeys(ctx, c, "t-x", 10); err != nil || !scanned {
		t.Fatalf("small database: scanned %v, %v", scanned, err)
	}
	if n := exists(mine...); n != 0 {
		t.Fatalf("%d of the test's keys left", n)
	}
	if n := exists("other:a", "t-y:a"); n != 2 {
		t.Fatalf("%d of 2 other keys left", n)
	}

	set(mine...)
	filler := make([]string, 20)
	for i := range filler {
		filler[i] = "filler:" + strconv.Itoa(i)
	}
	set(filler...)
	if scanned, err := deleteKeys(ctx, c, "t-x", 10); err != nil || scanned {
		t.Fatalf("database over the bound: scanned %v, %v; want no scan", scanned, err)
	}
	if n := exists(mine...); n != int64(len(mine)) {
		t.Fatalf("%d of the test's %d keys left after a skipped cleanup", n, len(mine))
	}
}
