package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/metrics"
	"github.com/idemq/idemq/sqldb/postgres"
)

// The inbox's transactions, batch sizes and savepoint fallbacks, on a real
// PostgreSQL, as the registry exports them: three fresh deliveries, a
// duplicate and a failing handler one at a time, then one batch of four
// whose failing handler sends it down the savepoint path.
func TestInboxMetricsAgainstPostgres(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.PostgresDB(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	m, err := metrics.New(metrics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(ctx, postgres.Pgx(pool), inbox.Config{Logger: quiet(), Observer: m.Inbox("orders")})
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	handler := func(_ context.Context, tx pgx.Tx, d *idemq.Delivery) error {
		if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
			return err
		}
		if d.MessageID == "bad" || d.MessageID == "b-bad" {
			return boom
		}
		return nil
	}
	delivery := func(id string) *idemq.Delivery {
		return &idemq.Delivery{MessageID: id, Queue: "orders", Group: "billing"}
	}

	single := ib.Handler(handler)
	for _, id := range []string{"a", "b", "c", "a", "bad"} {
		_ = single.Handle(ctx, delivery(id))
	}

	batch := ib.Batch(handler, inbox.BatchConfig{Size: 4, Concurrency: 4, MaxWait: time.Minute})
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i, id := range []string{"b-1", "b-2", "b-3", "b-bad"} {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = batch.Handle(ctx, delivery(id)) }()
	}
	wg.Wait()
	if !errors.Is(errs[3], boom) || errors.Join(errs[:3]...) != nil {
		t.Fatalf("batch results %v, want only b-bad failed", errs)
	}

	g := m.Gatherer()
	tx := func(path, result string) map[string]string {
		return map[string]string{"inbox": "orders", "path": path, "result": result}
	}
	for _, c := range []struct {
		metric string
		labels map[string]string
		want   float64
	}{
		{"idemq_inbox_transactions_total", tx(inbox.PathSingle, inbox.ResultCommitted), 3},
		{"idemq_inbox_transactions_total", tx(inbox.PathSingle, inbox.ResultRolledBack), 2}, // the duplicate, the failure
		{"idemq_inbox_transactions_total", tx(inbox.PathSingle, inbox.ResultFailed), 0},
		{"idemq_inbox_transactions_total", tx(inbox.PathBatch, inbox.ResultRolledBack), 1},
		{"idemq_inbox_transactions_total", tx(inbox.PathBatch, inbox.ResultCommitted), 0},
		{"idemq_inbox_transactions_total", tx(inbox.PathSavepoints, inbox.ResultCommitted), 1},
		{"idemq_inbox_transaction_seconds", map[string]string{"inbox": "orders", "path": inbox.PathSingle}, 5},
		{"idemq_inbox_transaction_seconds", map[string]string{"inbox": "orders", "path": inbox.PathBatch}, 1},
		{"idemq_inbox_transaction_seconds", map[string]string{"inbox": "orders", "path": inbox.PathSavepoints}, 1},
		{"idemq_inbox_batch_size", map[string]string{"inbox": "orders"}, 1},
		{"idemq_inbox_savepoint_fallbacks_total", map[string]string{"inbox": "orders"}, 1},
	} {
		t.Run(fmt.Sprintf("%s%v", c.metric, c.labels), func(t *testing.T) {
			if got := value(t, g, c.metric, c.labels); got != c.want {
				t.Errorf("%s%v = %v, want %v", c.metric, c.labels, got, c.want)
			}
		})
	}
	if sum := histogramSum(t, g, "idemq_inbox_batch_size"); sum != 4 {
		t.Errorf("idemq_inbox_batch_size sum = %v, want 4 (one batch of four)", sum)
	}
}

// histogramSum is the sum of the observations of histogram name.
func histogramSum(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetHistogram().GetSampleSum()
			}
		}
	}
	return sum
}
