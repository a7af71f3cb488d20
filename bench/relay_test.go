package bench

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/sqldb"
	"github.com/idemq/idemq/sqldb/postgres"
)

// Relay benchmarks (issue: ≥ 10k rows/s; commit→publish p99 < 50 ms with
// LISTEN/NOTIFY), in this module
// so they run in `make bench` next to the consumer cases.

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// openOutbox opens a database/sql pool (pgx/v5/stdlib) on dsn and a
// migrated outbox store on it that LISTENs for new rows.
func openOutbox(b *testing.B, dsn string, cfg outbox.StoreConfig) (*outbox.SQLStore, *sql.DB) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		b.Fatal(err)
	}
	cfg.Listen = postgres.Listener(dsn)
	s, err := outbox.NewStore(context.Background(), postgres.Std(db), cfg)
	if err != nil {
		db.Close()
		b.Fatal(err)
	}
	return s, db
}

// outboxStore opens a migrated outbox store on a fresh database.
func outboxStore(b *testing.B, name string) (*outbox.SQLStore, *sql.DB, string) {
	dsn := createDB(b, name)
	s, db := openOutbox(b, dsn, outbox.StoreConfig{})
	b.Cleanup(func() { db.Close() })
	return s, db, dsn
}

// startRelay runs one relay process-alike (its own pool, LISTEN connection
// and publisher) until the case ends.
func startRelay(b *testing.B, dsn string, scfg outbox.StoreConfig, cfg outbox.RelayConfig) {
	s, db := openOutbox(b, dsn, scfg)
	pub, err := idemq.NewPublisher(idemq.PublisherConfig{URL: amqpURL(), Logger: quiet()})
	if err != nil {
		b.Fatal(err)
	}
	cfg.Store, cfg.Publisher, cfg.Logger = s, pub, quiet()
	r, err := outbox.NewRelay(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = r.Run(ctx); close(done) }()
	var once sync.Once
	b.Cleanup(func() { once.Do(func() { cancel(); <-done; pub.Close(); db.Close() }) })
}

// BenchmarkRelay/throughput-relays-N: b.N committed rows (transactions of
// 500) published with confirms and marked sent by N relays at their default
// configuration; rows/s from the relays' start to the last row marked.
// Compare with Publish/raw-confirm-window-256 of the same run.
func BenchmarkRelay(b *testing.B) {
	for _, c := range []struct {
		relays     int
		deleteSent bool
	}{{1, false}, {3, false}, {1, true}} {
		relays := c.relays
		name := fmt.Sprintf("throughput-relays-%d", relays)
		if c.deleteSent {
			// StoreConfig.DeleteSent: the row deleted once published
			// instead of marked sent.
			name += "-delete-sent"
		}
		b.Run(name, func(b *testing.B) {
			store, db, dsn := outboxStore(b, fmt.Sprintf("idemq_bench_relay_%d_%v", relays, c.deleteSent))
			q := freshQueue(b, fmt.Sprintf("idemq.bench.relay.%d", relays))
			ctx := context.Background()
			body := make([]byte, BodySize)
			const perTx = 500
			for i := 0; i < b.N; i += perTx {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				var msgs []outbox.Message
				for j := i; j < i+perTx && j < b.N; j++ {
					msgs = append(msgs, outbox.Message{ID: fmt.Sprintf("t-%d", j), RoutingKey: q, Body: body})
				}
				if err := store.Add(ctx, sqldb.StdTx(tx), msgs...); err != nil {
					b.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
			}
			// The relays' own published counters tell when the last row is
			// marked: polling the table (COUNT(*) of the pending rows) would
			// load PostgreSQL during the measurement.
			var rec idemq.Counters
			b.ResetTimer()
			cpu0 := cpuSeconds()
			start := time.Now()
			for i := 0; i < relays; i++ {
				// The README's configuration: every relay setting at its default.
				startRelay(b, dsn, outbox.StoreConfig{DeleteSent: c.deleteSent}, outbox.RelayConfig{Recorder: &rec})
			}
			deadline := time.Now().Add(10 * time.Minute)
			for rec.Get(outbox.CountRelayPublished) < int64(b.N) {
				if time.Now().After(deadline) {
					b.Fatalf("%d of %d rows marked sent after 10 minutes", rec.Get(outbox.CountRelayPublished), b.N)
				}
				time.Sleep(time.Millisecond)
			}
			el := time.Since(start)
			cpu := cpuSeconds() - cpu0
			b.StopTimer()
			want := map[outbox.State]int64{outbox.StateSent: int64(b.N)}
			if c.deleteSent {
				want = map[outbox.State]int64{}
			}
			if m, err := store.Count(ctx); err != nil || !maps.Equal(m, want) {
				b.Fatalf("counts %v (%v), want %v", m, err, want)
			}
			if got := queueDepth(b, q); got != b.N {
				b.Fatalf("queue holds %d messages, want %d", got, b.N)
			}
			b.ReportMetric(float64(b.N)/el.Seconds(), "rows/s")
			b.ReportMetric(cpu/float64(b.N)*10000, "cpu-s/10k")
		})
	}
	latencyCase(b, "latency-notify", outbox.RelayConfig{
		// Polling only as a far fallback, so the figures measure NOTIFY.
		PollInterval: 5 * time.Second, MaxPollInterval: 5 * time.Second,
	})
	latencyCase(b, "latency-poll", outbox.RelayConfig{DisableNotify: true}) // 50ms doubling to 1s while idle
}

// latencySamples is how many single-row transactions a latency case
// commits: b.N/50, between 10 and 200 (each waits for its delivery).
func latencySamples(n int) int { return max(10, min(n/50, 200)) }

// latencyCase commits single-row transactions one at a time and measures
// commit → delivery at a plain consumer (the relay's publish plus the
// broker's routing): p50-ms, p99-ms.
func latencyCase(b *testing.B, name string, cfg outbox.RelayConfig) {
	b.Run(name, func(b *testing.B) {
		store, db, dsn := outboxStore(b, "idemq_bench_relay_"+name[len("latency-"):])
		q := freshQueue(b, "idemq.bench.relay."+name)
		ctx := context.Background()
		cfg.Retention = -1
		startRelay(b, dsn, outbox.StoreConfig{}, cfg)
		conn := dial(b)
		b.Cleanup(func() { conn.Close() })
		ch, err := conn.Channel()
		if err != nil {
			b.Fatal(err)
		}
		dels, err := ch.Consume(q, "", true, true, false, false, nil)
		if err != nil {
			b.Fatal(err)
		}
		got := make(chan string, 16)
		go func() {
			for d := range dels {
				got <- d.MessageId
			}
		}()
		n := latencySamples(b.N)
		lat := make([]time.Duration, 0, n)
		b.ResetTimer()
		for i := 0; i < n; i++ {
			id := fmt.Sprintf("l-%d", i)
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				b.Fatal(err)
			}
			if err := store.Add(ctx, sqldb.StdTx(tx), outbox.Message{ID: id, RoutingKey: q, Body: []byte(id)}); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				b.Fatal(err)
			}
			committed := time.Now()
			select {
			case m := <-got:
				if m != id {
					b.Fatalf("got %s, want %s", m, id)
				}
			case <-time.After(60 * time.Second):
				b.Fatalf("%s not delivered within 60s", id)
			}
			lat = append(lat, time.Since(committed))
			// Spread the commits over the relay's poll cycle.
			time.Sleep(time.Duration(i%7) * 3 * time.Millisecond)
		}
		b.StopTimer()
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		b.ReportMetric(float64(n), "samples")
		b.ReportMetric(pct(lat, 0.50).Seconds()*1e3, "p50-ms")
		b.ReportMetric(pct(lat, 0.99).Seconds()*1e3, "p99-ms")
	})
}
