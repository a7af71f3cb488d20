package bench

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/dedup/sqlstore"
	pgstore "github.com/idemq/idemq/dedup/sqlstore/postgres"
)

// DedupWorkers is the handler concurrency of the dedup cases: each message
// costs two store round trips (claim, complete), so throughput comes from
// having many in flight, well within the prefetch window.
const DedupWorkers = 32

func noop() idemq.Handler {
	return idemq.HandlerFunc(func(context.Context, *idemq.Delivery) error { return nil })
}

func pgURL() string {
	if u := os.Getenv("IDEMQ_POSTGRES_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
}

// benchDB creates a fresh PostgreSQL database for one case.
func benchDB(b *testing.B, name string) *pgxpool.Pool {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgURL())
	if err != nil {
		b.Fatalf("PostgreSQL not reachable (%v): run `make services`", err)
	}
	ident := pgx.Identifier{name}.Sanitize()
	_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)")
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		b.Fatal(err)
	}
	conn.Close(ctx)
	cfg, err := pgxpool.ParseConfig(pgURL())
	if err != nil {
		b.Fatal(err)
	}
	cfg.ConnConfig.Database = name
	cfg.MaxConns = 40
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		pool.Close()
		if c, err := pgx.Connect(ctx, pgURL()); err == nil {
			_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)")
			c.Close(ctx)
		}
	})
	return pool
}

func guardConsume(b *testing.B, queue string, n int, store dedup.Store) *idemq.Counters {
	prefix := fmt.Sprintf("idemq-bench-%d", time.Now().UnixNano())
	return idemqConsumeWorkers(b, queue, n, DedupWorkers, noop(),
		dedup.Guard(store, dedup.Config{Prefix: prefix, Lease: 30 * time.Second, Window: time.Hour}))
}

func BenchmarkDedup(b *testing.B) {
	consumeCase(b, "idemq-dedup-memory", func(b *testing.B, queue string, n int) {
		guardConsume(b, queue, n, dedup.NewMemory(dedup.MemoryConfig{}))
	})
	consumeCase(b, "idemq-dedup-redis", func(b *testing.B, queue string, n int) {
		guardConsume(b, queue, n, redisstore.New(redisClient(b), redisstore.Config{}))
	})
	consumeCase(b, "idemq-dedup-redis-autopipeline", func(b *testing.B, queue string, n int) {
		guardConsume(b, queue, n, redisstore.New(redisClient(b), redisstore.Config{AutoPipeline: true}))
	})
	consumeCase(b, "idemq-dedup-postgres", func(b *testing.B, queue string, n int) {
		pool := benchDB(b, "idemq_bench_dedup")
		st, err := pgstore.New(context.Background(), pool, sqlstore.Config{})
		if err != nil {
			b.Fatal(err)
		}
		defer st.Close()
		guardConsume(b, queue, n, st)
	})
}
