package postgres_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/postgres"
)

// Relay benchmarks (not run in CI). Run them with:
//
//	go test -run '^$' -bench BenchmarkRelay -benchtime 20000x ./outbox/postgres/   # throughput
//	go test -run '^$' -bench 'BenchmarkRelayLatency' -benchtime 500x ./outbox/postgres/
//
// Throughput reports rows/s published with confirms and marked sent, with
// one and with three relays. Latency reports commit→consume p50/p99 (ms) for
// single-message transactions, woken by LISTEN/NOTIFY and by polling.

func benchStore(b *testing.B) (*postgres.Store, string) {
	b.Helper()
	testenv.RequireAMQP(b)
	dsn := testenv.PostgresDB(b)
	s, err := postgres.Open(dsn, postgres.Config{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	if err := s.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	return s, dsn
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func startRelay(b *testing.B, dsn string, cfg outbox.RelayConfig) func() {
	b.Helper()
	s, err := postgres.Open(dsn, postgres.Config{})
	if err != nil {
		b.Fatal(err)
	}
	pub := idemq.NewPublisher(idemq.PublisherConfig{Logger: quietLogger()})
	cfg.Store, cfg.Publisher, cfg.Logger, cfg.SkipMigrate = s, pub, quietLogger(), true
	r := outbox.NewRelay(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = r.Run(ctx); close(done) }()
	var once sync.Once
	stop := func() {
		once.Do(func() { cancel(); <-done; pub.Close(); s.Close() })
	}
	b.Cleanup(stop)
	return stop
}

func BenchmarkRelayThroughput(b *testing.B) {
	for _, relays := range []int{1, 3} {
		b.Run(fmt.Sprintf("relays=%d", relays), func(b *testing.B) {
			store, dsn := benchStore(b)
			q := testenv.Queue(b, nil)
			ctx := context.Background()
			body := make([]byte, 128)
			const perTx = 500
			for i := 0; i < b.N; i += perTx {
				tx, err := store.DB.BeginTx(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				var msgs []outbox.Message
				for j := i; j < i+perTx && j < b.N; j++ {
					msgs = append(msgs, outbox.Message{ID: fmt.Sprintf("t-%d", j), RoutingKey: q, Body: body})
				}
				if err := store.Add(ctx, tx, msgs...); err != nil {
					b.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < relays; i++ {
				startRelay(b, dsn, outbox.RelayConfig{BatchSize: 500, Retention: -1})
			}
			for {
				st, err := store.Stats(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if st.Pending == 0 {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			el := time.Since(start)
			b.StopTimer()
			if m, err := store.Count(ctx); err != nil || m[outbox.StateSent] != int64(b.N) {
				b.Fatalf("counts %v (%v), want %d sent", m, err, b.N)
			}
			b.ReportMetric(float64(b.N)/el.Seconds(), "rows/s")
		})
	}
}

func BenchmarkRelayLatency(b *testing.B) {
	for _, mode := range []string{"notify", "poll"} {
		b.Run(mode, func(b *testing.B) {
			store, dsn := benchStore(b)
			q := testenv.Queue(b, nil)
			ctx := context.Background()
			cfg := outbox.RelayConfig{Retention: -1}
			if mode == "poll" {
				cfg.DisableNotify = true // defaults: 50ms doubling to 1s while idle
			} else {
				// Polling only as a far fallback, so the figures measure NOTIFY.
				cfg.PollInterval, cfg.MaxPollInterval = 5*time.Second, 5*time.Second
			}
			startRelay(b, dsn, cfg)

			ch := testenv.Channel(b)
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
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				id := fmt.Sprintf("l-%d", i)
				tx, err := store.DB.BeginTx(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				if err := store.Add(ctx, tx, outbox.Message{ID: id, RoutingKey: q, Body: []byte(id)}); err != nil {
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
			pct := func(p float64) float64 {
				return float64(lat[int(p*float64(len(lat)-1))]) / float64(time.Millisecond)
			}
			b.ReportMetric(pct(0.50), "p50-ms")
			b.ReportMetric(pct(0.99), "p99-ms")
		})
	}
}
