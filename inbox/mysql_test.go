package inbox_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sqldb/mysql"
)

func openMySQL(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestRefusedRowIsNotDuplicate: an inbox row that MySQL/MariaDB cannot
// store as given — an ID longer than a user-managed table's column, a
// 4-byte UTF-8 character in a utf8mb3 column — is an error for that
// delivery, never a duplicate. INSERT IGNORE turned both into a warning and
// stored a truncated or '?'-substituted key, so two distinct IDs sharing it
// collapsed: the second was acked as a duplicate without running. Each case
// runs through the single handler and through a batch (fast path and
// savepoint path). The session has MariaDB's default, strict, sql_mode.
func TestRefusedRowIsNotDuplicate(t *testing.T) {
	for _, tc := range []struct {
		name, column string
		ids          [2]string // distinct IDs the column cannot tell apart
	}{
		{"id longer than the column", "VARBINARY(16)", [2]string{"0123456789abcdef-A", "0123456789abcdef-B"}},
		{"4-byte UTF-8 in a utf8mb3 column", "VARCHAR(64) CHARACTER SET utf8mb3 COLLATE utf8mb3_bin", [2]string{"order-\U0001F600", "order-\U0001F601"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := openMySQL(t, testenv.MySQLDB(t))
			ctx := context.Background()
			if _, err := db.ExecContext(ctx, `CREATE TABLE narrow_inbox (
	group_name  VARBINARY(255) NOT NULL,
	message_id  `+tc.column+` NOT NULL,
	received_at DATETIME(6) NOT NULL,
	PRIMARY KEY (group_name, message_id)) ENGINE=InnoDB`); err != nil {
				t.Fatal(err)
			}
			ib, err := inbox.New(ctx, mysql.Std(db), inbox.Config{Table: "narrow_inbox", NoMigrate: true})
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			ran := map[string]int{}
			h := func(_ context.Context, _ *sql.Tx, d *idemq.Delivery) error {
				mu.Lock()
				defer mu.Unlock()
				ran[d.MessageID]++
				return nil
			}
			check := func(path string, id string, err error) {
				t.Helper()
				mu.Lock()
				n := ran[id]
				mu.Unlock()
				if err == nil && n == 0 {
					t.Errorf("%s: delivery %q acked as a duplicate without running", path, id)
				} else if err == nil {
					t.Errorf("%s: delivery %q ran with a mangled inbox key (strict sql_mode: want an error)", path, id)
				}
			}
			var rec idemq.Counters
			rctx := idemq.WithRecorder(ctx, &rec)
			for _, id := range tc.ids {
				check("single", id, serve(rctx, ib.Handler(h), &idemq.Delivery{MessageID: id, Group: "g"}))
			}
			b := ib.Batch(h, inbox.BatchConfig{Size: 3, MaxWait: time.Minute})
			ds := []*idemq.Delivery{{MessageID: tc.ids[0], Group: "g"}, {MessageID: "fine", Group: "g"}, {MessageID: tc.ids[1], Group: "g"}}
			errs := make([]error, len(ds))
			var wg sync.WaitGroup
			for i, d := range ds {
				wg.Go(func() { errs[i] = serve(rctx, b, d) })
			}
			wg.Wait()
			check("batch", tc.ids[0], errs[0])
			check("batch", tc.ids[1], errs[2])
			if errs[1] != nil || ran["fine"] != 1 {
				t.Errorf("batch: the storable delivery: err=%v ran=%d, want nil and 1", errs[1], ran["fine"])
			}
			if d := rec.Get(idemq.CountDuplicates); d != 0 {
				t.Errorf("duplicates=%d, want 0", d)
			}
		})
	}
}

// serve runs h on d and does with the outcome what the consumer does:
// counts a processed delivery (nil) or a duplicate (idemq.ErrDuplicate,
// acked: nil) into the context's recorder.
func serve(ctx context.Context, h idemq.Handler, d *idemq.Delivery) error {
	err := h.Handle(ctx, d)
	switch {
	case err == nil:
		idemq.RecorderFrom(ctx).Add(idemq.CountProcessed, 1)
	case idemq.IsDuplicate(err):
		idemq.RecorderFrom(ctx).Add(idemq.CountDuplicates, 1)
		return nil
	}
	return err
}

// TestClientFoundRows: the inbox's duplicate detection does not depend on
// the DSN's clientFoundRows (with it, an unchanged ON DUPLICATE KEY UPDATE
// row counts as affected, and a duplicate would look fresh).
func TestClientFoundRows(t *testing.T) {
	db := openMySQL(t, testenv.MySQLDB(t)+"&clientFoundRows=true")
	ctx := context.Background()
	ib, err := inbox.New(ctx, mysql.Std(db), inbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	ran := 0
	h := func(context.Context, *sql.Tx, *idemq.Delivery) error { mu.Lock(); ran++; mu.Unlock(); return nil }
	var rec idemq.Counters
	rctx := idemq.WithRecorder(ctx, &rec)
	for range 2 {
		if err := serve(rctx, ib.Handler(h), &idemq.Delivery{MessageID: "m", Group: "g"}); err != nil {
			t.Fatal(err)
		}
	}
	b := ib.Batch(h, inbox.BatchConfig{Size: 2, MaxWait: time.Minute})
	var wg sync.WaitGroup
	for _, id := range []string{"m", "n"} {
		wg.Go(func() {
			if err := serve(rctx, b, &idemq.Delivery{MessageID: id, Group: "g"}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if p, d := rec.Get(idemq.CountProcessed), rec.Get(idemq.CountDuplicates); ran != 2 || p != 2 || d != 2 {
		t.Fatalf("ran=%d processed=%d duplicates=%d, want 2, 2, 2", ran, p, d)
	}
}
