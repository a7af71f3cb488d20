package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The private PostgreSQL starts, stops (immediate) and starts again with
// its data.
func TestPrivatePostgresStopStart(t *testing.T) {
	p := StartPrivatePostgres(t)
	db := p.CreateDB("privtest")
	ctx := context.Background()
	c, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "CREATE TABLE t (x int); INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	_ = c.Close(ctx)
	p.Stop()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if c, err := pgx.Connect(cctx, db); err == nil {
		_ = c.Close(ctx)
		t.Fatal("connected to a stopped server")
	}
	p.Start()
	c, err = pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil || n != 1 {
		t.Fatalf("after restart: n=%d err=%v", n, err)
	}
}
