package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/sqldb/dburl"
)

// `idemq outbox list|show|retry` re-drive a failed row without SQL.
func TestOutboxListShowRetry(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	ctx := context.Background()
	s, db := testStore(ctx, t, dburl.Target{Dialect: "sqlite", DSN: path})
	if err := s.Add(ctx, db, outbox.Message{ID: "order-1", RoutingKey: "orders"}, outbox.Message{ID: "order-2", RoutingKey: "orders.created"}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, "UPDATE idemq_outbox SET state = 'failed', last_error = 'unroutable: orders.created' WHERE message_id = 'order-2'"); err != nil {
		t.Fatal(err)
	}
	url := "sqlite://" + path
	out := mustRun(t, "", "outbox", "list", "--db", url)
	if !strings.Contains(out, "row 1\tpending") || !strings.Contains(out, "row 2\tfailed") || !strings.Contains(out, "2 row(s)") {
		t.Fatalf("outbox list:\n%s", out)
	}
	out = mustRun(t, "", "outbox", "list", "--db", url, "--state", "failed")
	if strings.Contains(out, "order-1") || !strings.Contains(out, `"unroutable: orders.created"`) {
		t.Fatalf("outbox list --state failed:\n%s", out)
	}
	out = mustRun(t, "", "outbox", "show", "2", "--db", url)
	if !strings.Contains(out, "message id:   order-2") || !strings.Contains(out, "state:        failed") {
		t.Fatalf("outbox show:\n%s", out)
	}
	if out := mustRun(t, "", "outbox", "retry", "2", "--db", url); !strings.Contains(out, "row 2 is pending again") {
		t.Fatalf("outbox retry:\n%s", out)
	}
	if _, _, err := runCLI(t, "", "outbox", "retry", "1", "--db", url); err == nil || !strings.Contains(err.Error(), "no such failed row") {
		t.Fatalf("retry of a pending row: %v", err)
	}
	if _, _, err := runCLI(t, "", "outbox", "show", "9", "--db", url); err == nil {
		t.Fatal("show of a missing row succeeded")
	}
	rows, err := s.Rows(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.State != outbox.StatePending {
			t.Errorf("after retry: %+v", r)
		}
	}
}
