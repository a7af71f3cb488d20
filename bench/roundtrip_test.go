package bench

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// BenchmarkPostgresRoundTrip prices what bounds the batch inbox with a
// statement per delivery: the same one-row INSERT, 50 to a transaction,
// sent one round trip each (pgx Exec, what an Inbox.Batch handler does)
// or queued in one pgx.Batch per transaction (one round trip, what the
// pipelined Inbox.BatchFunc handler does). It reports the client's CPU
// and the PostgreSQL backend's CPU per statement (the backend's
// /proc/<pid>/task/*/schedstat: the server must run on this machine) and
// the wall time per statement, commits included.
func BenchmarkPostgresRoundTrip(b *testing.B) {
	for _, pipeline := range []bool{false, true} {
		name := "exec-each"
		if pipeline {
			name = "pipelined"
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			conn, err := pgx.Connect(ctx, createDB(b, "idemq_bench_roundtrip"))
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close(ctx)
			if _, err := conn.Exec(ctx, `CREATE TABLE effect (message_id text NOT NULL, amount bigint NOT NULL)`); err != nil {
				b.Fatal(err)
			}
			var backend int
			if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
				b.Fatal(err)
			}
			const perTx = 50
			const insert = `INSERT INTO effect (message_id, amount) VALUES ($1, 1)`
			ids := make([]string, b.N)
			for i := range ids {
				ids[i] = strconv.Itoa(i)
			}
			b.ResetTimer()
			pg0, _ := schedTimes(backend)
			cpu0 := cpuSeconds()
			start := time.Now()
			for i := 0; i < b.N; i += perTx {
				tx, err := conn.Begin(ctx)
				if err != nil {
					b.Fatal(err)
				}
				end := min(i+perTx, b.N)
				if pipeline {
					q := &pgx.Batch{}
					for _, id := range ids[i:end] {
						q.Queue(insert, id)
					}
					err = tx.SendBatch(ctx, q).Close()
				} else {
					for _, id := range ids[i:end] {
						if _, err = tx.Exec(ctx, insert, id); err != nil {
							break
						}
					}
				}
				if err != nil {
					b.Fatal(err)
				}
				if err := tx.Commit(ctx); err != nil {
					b.Fatal(err)
				}
			}
			el := time.Since(start)
			cpu := cpuSeconds() - cpu0
			pg, _ := schedTimes(backend)
			b.StopTimer()
			n := float64(b.N)
			b.ReportMetric(n/el.Seconds(), "stmts/s")
			b.ReportMetric(cpu/n*1e6, "client-cpu-us/stmt")
			b.ReportMetric((pg-pg0)/1e3/n, "pg-cpu-us/stmt")
			var rows int
			if err := conn.QueryRow(ctx, `SELECT count(*) FROM effect`).Scan(&rows); err != nil {
				b.Fatal(err)
			}
			if rows != b.N {
				b.Fatalf("%d rows, want %d", rows, b.N)
			}
		})
	}
}
