package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/sqldb/dburl"
)

// TestRelayFailedRows: the operator's commands for a failed row that holds
// back its ordering key (SQLite; the stores' behaviour is tested on every
// dialect by outboxtest).
func TestRelayFailedRows(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	ctx := context.Background()
	s, db := testStore(ctx, t, dburl.Target{Dialect: "sqlite", DSN: path})
	var msgs []outbox.Message
	for _, id := range []string{"K-1", "K-2", "J-1", "J-2"} {
		msgs = append(msgs, outbox.Message{ID: id, RoutingKey: "q", OrderingKey: id[:1]})
	}
	if err := s.Add(ctx, db, msgs...); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, "UPDATE idemq_outbox SET state = 'failed', last_error = 'unroutable: test' WHERE message_id IN ('K-1', 'J-1')"); err != nil {
		t.Fatal(err)
	}
	url := "sqlite://" + path
	out := mustRun(t, "", "relay", "blocked", "--db", url)
	if !strings.Contains(out, `row 1	message_id "K-1"	ordering_key "K"	waiting 1`) || !strings.Contains(out, `row 3	message_id "J-1"`) {
		t.Fatalf("relay blocked:\n%s", out)
	}
	mustRun(t, "", "relay", "skip-failed", "--db", url, "3")
	mustRun(t, "", "relay", "retry-failed", "--db", url, "1")
	if out := mustRun(t, "", "relay", "blocked", "--db", url); !strings.Contains(out, "no failed row") {
		t.Fatalf("relay blocked after skip and retry:\n%s", out)
	}
	rows, err := s.Rows(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		switch r.MessageID {
		case "K-1":
			if r.State != outbox.StatePending || r.Attempts != 0 {
				t.Errorf("retried row: %+v", r)
			}
		case "J-1":
			if r.State != outbox.StateFailed || r.OrderingKey != "" || !strings.Contains(r.LastError, `skipped by an operator, ordering key "J" released; unroutable: test`) {
				t.Errorf("skipped row: %+v", r)
			}
		}
	}
	for _, cmd := range []string{"retry-failed", "skip-failed"} {
		if _, _, err := runCLI(t, "", "relay", cmd, "--db", url, "2"); err == nil || !strings.Contains(err.Error(), "no such failed row") {
			t.Errorf("%s of a pending row: err = %v, want no such failed row", cmd, err)
		}
	}
}
