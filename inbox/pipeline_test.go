package inbox_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sqldb/postgres"
)

// TestBatchFuncPipelineFailsOnlyItsDelivery: the pattern of
// ExampleInbox_BatchFunc_pipeline (each delivery's statement queued in one
// pgx.Batch) when one queued statement fails. The pipeline's error rolls
// the batch back; it runs again per delivery, and only the delivery whose
// statement failed gets the error, with the database's own error in its
// chain. The others commit, each once.
func TestBatchFuncPipelineFailsOnlyItsDelivery(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, testenv.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	run := idemq.NewMessageID()[24:]
	effects, ibox := "pipe_effect_"+run, "pipe_inbox_"+run
	if _, err := pool.Exec(ctx, `CREATE TABLE `+effects+` (message_id text PRIMARY KEY, amount int NOT NULL)`); err != nil {
		t.Fatalf("PostgreSQL at %s: %v", testenv.PostgresURL(), err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+effects+`, `+ibox)
		_, _ = pool.Exec(context.Background(), `DELETE FROM idemq_migrations WHERE table_name = $1`, ibox)
	})
	ib, err := inbox.New(ctx, postgres.Pgx(pool), inbox.Config{Table: ibox})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var calls []string
	b := ib.BatchFunc(func(ctx context.Context, tx pgx.Tx, ds []*idemq.Delivery) error {
		q := &pgx.Batch{}
		var ids []string
		for _, d := range ds {
			ids = append(ids, d.MessageID)
			q.Queue(`INSERT INTO `+effects+` (message_id, amount) VALUES ($1, $2::text::int)`, d.MessageID, string(d.Body))
		}
		mu.Lock()
		calls = append(calls, strings.Join(ids, ","))
		mu.Unlock()
		return tx.SendBatch(ctx, q).Close()
	}, inbox.BatchConfig{Size: 3, Concurrency: 3, MaxWait: time.Minute})

	ds := []*idemq.Delivery{
		{MessageID: "p-1", Body: []byte("1"), Group: "g", Queue: "q"},
		{MessageID: "p-2", Body: []byte("not a number"), Group: "g", Queue: "q"},
		{MessageID: "p-3", Body: []byte("3"), Group: "g", Queue: "q"},
	}
	errs := make([]error, len(ds))
	var wg sync.WaitGroup
	for i, d := range ds {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = b.Handle(ctx, d) }()
	}
	wg.Wait()

	var pgErr *pgconn.PgError
	if !errors.As(errs[1], &pgErr) || pgErr.Code != "22P02" {
		t.Errorf("p-2: %v, want its own invalid_text_representation (22P02)", errs[1])
	}
	if errs[0] != nil || errs[2] != nil {
		t.Errorf("p-1: %v, p-3: %v, want both committed", errs[0], errs[2])
	}
	if want := "p-1,p-2,p-3 p-1 p-2 p-3"; strings.Join(calls, " ") != want {
		t.Errorf("batch handler calls %q, want %q (the pipeline, then each delivery alone)", calls, want)
	}
	var got string
	if err := pool.QueryRow(ctx, `SELECT string_agg(message_id || '=' || amount, ',' ORDER BY message_id) FROM `+effects).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != "p-1=1,p-3=3" {
		t.Errorf("effect rows %q, want p-1=1,p-3=3", got)
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+ibox).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 2 {
		t.Errorf("%d inbox rows, want 2 (p-1, p-3)", rows)
	}
}
