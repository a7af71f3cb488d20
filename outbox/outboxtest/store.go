package outboxtest

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/sqldb"
	"github.com/idemq/idemq/sqldb/sqldbtest"
)

// Run runs the store cases: the database alone, no broker.
func Run[T any](t *testing.T, b sqldbtest.Backend[T], f Features) {
	s := newSuite(b, f)
	cases := []struct {
		name  string
		fn    func(*testing.T, suite)
		multi bool
	}{
		{"MigrateIsIdempotentAndConcurrent", migrateTwice, false},
		{"AddRejectsBadMessages", addRejects, false},
		{"RollbackLeavesNoRow", storeRollback, false},
		{"ClaimLeasesInIDOrder", claimOrder, false},
		{"ConcurrentClaimsAreDisjoint", claimDisjoint, true},
		{"ExpiredLeaseIsClaimableAgain", leaseExpiry, false},
		{"RetryDelaysAndFailStops", retryAndFail, false},
		{"OrderedClaimHoldsBackTheKey", orderedClaim, false},
		{"FailedRowsBlockAndRelease", failedRows, false},
		{"PurgeDeletesOldSentRows", storePurge, false},
		{"DeleteSentRemovesPublishedRows", deleteSent, false},
		{"HeadersRoundTrip", headersRoundTrip, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.multi && f.SingleRelay {
				t.Skip("Features.SingleRelay: this dialect has one claimer only")
			}
			if f.Parallel {
				t.Parallel()
			}
			c.fn(t, s)
		})
	}
}

func migrateTwice(t *testing.T, s suite) {
	e := setupDB(t, s)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := 0; i < 4; i++ {
		wg.Go(func() {
			store, _ := s.open(t, e.dsn, e.table+"_c") // migrates
			errs <- store.Migrate(tctx(t))
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent migrate: %v", err)
		}
	}
	if err := e.store.Migrate(tctx(t)); err != nil {
		t.Fatalf("second migrate: %v", err)
	}
	e.add(e.msg("m-1"))
	if c := e.counts(); c[outbox.StatePending] != 1 {
		t.Fatalf("counts = %v, want 1 pending", c)
	}
}

func addRejects(t *testing.T, s suite) {
	e := setupDB(t, s)
	ctx := tctx(t)
	cases := []struct {
		name string
		msg  outbox.Message
		is   error
	}{
		{"missing id", outbox.Message{RoutingKey: "x"}, idemq.ErrMissingMessageID},
		{"control char", outbox.Message{ID: "a\nb"}, idemq.ErrInvalidMessageID},
		{"too long", outbox.Message{ID: strings.Repeat("x", 256)}, idemq.ErrInvalidMessageID},
		{"routing key too long", outbox.Message{ID: "ok", RoutingKey: strings.Repeat("k", 256)}, outbox.ErrInvalidMessage},
		{"bad header", outbox.Message{ID: "ok", Headers: amqp.Table{"t": time.Now()}}, outbox.ErrInvalidMessage},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := e.inTx(ctx, false, func(tx sqldb.Querier) error { return e.store.Add(ctx, tx, c.msg) })
			if !errors.Is(err, c.is) {
				t.Fatalf("Add = %v, want errors.Is %v", err, c.is)
			}
		})
	}
	if c := e.counts(); len(c) != 0 && c[outbox.StatePending] != 0 {
		t.Fatalf("rows after rejected adds: %v", c)
	}
}

func storeRollback(t *testing.T, s suite) {
	e := setupDB(t, s)
	ctx := tctx(t)
	if err := e.inTx(ctx, false, func(tx sqldb.Querier) error { return e.store.Add(ctx, tx, e.msg("gone")) }); err != nil {
		t.Fatal(err)
	}
	e.add(e.msg("kept"))
	rows := e.claim("r", 10, time.Minute, false)
	if len(rows) != 1 || rows[0].Message.ID != "kept" {
		t.Fatalf("claimed %v, want only the committed row", ids(rows))
	}
}

func (e *env) claim(owner string, limit int, lease time.Duration, ordered bool) []outbox.Row {
	e.t.Helper()
	rows, err := e.store.Claim(tctx(e.t), owner, limit, lease, ordered)
	if err != nil {
		e.t.Fatalf("Claim: %v", err)
	}
	return rows
}

func ids(rows []outbox.Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.Message.ID
	}
	return out
}

func claimOrder(t *testing.T, s suite) {
	e := setupDB(t, s)
	e.addN("o", 5, 2)
	rows := e.claim("r1", 3, time.Minute, false)
	if got := strings.Join(ids(rows), ","); got != "o-0000,o-0001,o-0002" {
		t.Fatalf("claimed %s, want the three oldest in order", got)
	}
	for _, r := range rows {
		if r.Attempts != 1 || r.Owner != "r1" || string(r.Message.Body) != "body-"+r.Message.ID {
			t.Fatalf("row %+v", r)
		}
	}
	// Leased rows are not claimed again; the rest are.
	if got := ids(e.claim("r2", 10, time.Minute, false)); strings.Join(got, ",") != "o-0003,o-0004" {
		t.Fatalf("second claim %v", got)
	}
	if err := e.store.MarkSent(tctx(t), []int64{rows[0].ID, rows[1].ID}); err != nil {
		t.Fatal(err)
	}
	if c := e.counts(); c[outbox.StateSent] != 2 || c[outbox.StatePending] != 3 {
		t.Fatalf("counts %v", c)
	}
	if st, err := e.store.Stats(tctx(t)); err != nil || st.Pending != 3 {
		t.Fatalf("Stats = %+v, %v; want 3 pending", st, err)
	}
}

func claimDisjoint(t *testing.T, s suite) {
	e := setupDB(t, s)
	e.addN("d", 200, 50)
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for i := range 4 {
		store, _ := s.open(t, e.dsn, e.table)
		wg.Go(func() {
			for {
				rows, err := store.Claim(tctx(t), "r"+string(rune('a'+i)), 7, time.Minute, false)
				if err != nil {
					t.Errorf("Claim: %v", err)
					return
				}
				if len(rows) == 0 {
					return
				}
				mu.Lock()
				for _, r := range rows {
					seen[r.Message.ID]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(seen) != 200 {
		t.Fatalf("%d rows claimed, want 200", len(seen))
	}
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("%s claimed %d times", id, n)
		}
	}
}

func leaseExpiry(t *testing.T, s suite) {
	e := setupDB(t, s)
	e.add(e.msg("l"))
	if len(e.claim("dead", 1, 50*time.Millisecond, false)) != 1 {
		t.Fatal("first claim got nothing")
	}
	var rows []outbox.Row
	eventually(t, "the lease to expire", func() bool { rows = e.claim("next", 1, time.Minute, false); return len(rows) == 1 })
	if rows[0].Attempts != 2 || rows[0].Owner != "next" {
		t.Fatalf("reclaimed %+v, want attempts 2 by next", rows[0])
	}
}

func retryAndFail(t *testing.T, s suite) {
	e := setupDB(t, s)
	e.add(e.msg("a"), e.msg("b"))
	rows := e.claim("r", 2, time.Minute, false)
	ctx := tctx(t)
	// Another owner's retry or fail changes nothing.
	if err := e.store.Retry(ctx, "other", rows[0].ID, 0, "x"); err != nil {
		t.Fatal(err)
	}
	if got := e.claim("r2", 2, time.Minute, false); len(got) != 0 {
		t.Fatalf("claimed %v while leased", ids(got))
	}
	if err := e.store.Retry(ctx, "r", rows[0].ID, time.Hour, "later"); err != nil {
		t.Fatal(err)
	}
	if err := e.store.Fail(ctx, "r", rows[1].ID, "unroutable"); err != nil {
		t.Fatal(err)
	}
	if got := e.claim("r2", 2, time.Minute, false); len(got) != 0 {
		t.Fatalf("claimed %v: a row retried in an hour and a failed row", ids(got))
	}
	if err := e.store.Retry(ctx, "r", rows[0].ID, 0, "x"); err != nil { // no longer r's
		t.Fatal(err)
	}
	if c := e.counts(); c[outbox.StateFailed] != 1 || c[outbox.StatePending] != 1 {
		t.Fatalf("counts %v", c)
	}
}

func orderedClaim(t *testing.T, s suite) {
	e := setupDB(t, s)
	var msgs []outbox.Message
	for _, id := range []string{"k1-a", "k1-b", "free", "k2-a"} {
		m := e.msg(id)
		if id != "free" {
			m.OrderingKey = id[:2]
		}
		msgs = append(msgs, m)
	}
	e.add(msgs...)
	got := ids(e.claim("r", 10, time.Minute, true))
	if strings.Join(got, ",") != "k1-a,free,k2-a" {
		t.Fatalf("ordered claim %v, want the first row of each key and the free one", got)
	}
	rows := e.claim("r", 10, time.Minute, true)
	if len(rows) != 0 {
		t.Fatalf("claimed %v while the first of k1 is pending", ids(rows))
	}
}

func failedRows(t *testing.T, s suite) {
	e := setupDB(t, s)
	a, b := e.msg("f-a"), e.msg("f-b")
	a.OrderingKey, b.OrderingKey = "k", "k"
	e.add(a, b)
	rows := e.claim("r", 10, time.Minute, true)
	if len(rows) != 1 {
		t.Fatalf("claimed %v", ids(rows))
	}
	ctx := tctx(t)
	if err := e.store.Fail(ctx, "r", rows[0].ID, "boom"); err != nil {
		t.Fatal(err)
	}
	if got := e.claim("r", 10, time.Minute, true); len(got) != 0 {
		t.Fatalf("claimed %v behind a failed row", ids(got))
	}
	bl, err := e.store.Blocked(ctx)
	if err != nil || len(bl) != 1 || bl[0].FailedID != rows[0].ID || bl[0].Waiting != 1 || bl[0].LastError != "boom" {
		t.Fatalf("Blocked = %+v, %v", bl, err)
	}
	if err := e.store.RetryFailed(ctx, rows[0].ID); err != nil {
		t.Fatal(err)
	}
	if err := e.store.RetryFailed(ctx, rows[0].ID); !errors.Is(err, outbox.ErrNotFailed) {
		t.Fatalf("RetryFailed of a pending row: %v, want ErrNotFailed", err)
	}
	rows = e.claim("r", 10, time.Minute, true)
	if len(rows) != 1 || rows[0].Message.ID != "f-a" || rows[0].Attempts != 1 {
		t.Fatalf("after retry-failed claimed %+v", rows)
	}
	if err := e.store.Fail(ctx, "r", rows[0].ID, "again"); err != nil {
		t.Fatal(err)
	}
	if err := e.store.SkipFailed(ctx, rows[0].ID); err != nil {
		t.Fatal(err)
	}
	if got := ids(e.claim("r", 10, time.Minute, true)); strings.Join(got, ",") != "f-b" {
		t.Fatalf("after skip claimed %v, want f-b", got)
	}
	if err := e.store.SkipFailed(ctx, 1<<40); !errors.Is(err, outbox.ErrNotFailed) {
		t.Fatalf("SkipFailed of no row: %v", err)
	}
}

func storePurge(t *testing.T, s suite) {
	e := setupDB(t, s)
	e.addN("p", 5, 5)
	rows := e.claim("r", 5, time.Minute, false)
	var sent []int64
	for _, r := range rows[:4] {
		sent = append(sent, r.ID)
	}
	if err := e.store.MarkSent(tctx(t), sent); err != nil {
		t.Fatal(err)
	}
	if n, err := e.store.Purge(tctx(t), time.Hour, 10); err != nil || n != 0 {
		t.Fatalf("Purge of rows sent less than an hour ago = %d, %v", n, err)
	}
	var total int64
	eventually(t, "the sent rows purged", func() bool {
		n, err := e.store.Purge(tctx(t), 0, 3)
		if err != nil {
			t.Fatal(err)
		}
		total += n
		return total == 4
	})
	if c := e.counts(); c[outbox.StateSent] != 0 || c[outbox.StatePending] != 1 {
		t.Fatalf("counts %v", c)
	}
}

// With StoreConfig.DeleteSent, MarkSent deletes the pending rows it is
// given and nothing else: a failed row stays, a row marked twice (a
// relay's lease ran out while it published) is no error.
func deleteSent(t *testing.T, s suite) {
	e := setupDB(t, s)
	store, _ := s.openCfg(t, e.dsn, outbox.StoreConfig{Table: e.table, DeleteSent: true})
	e.addN("d", 4, 4)
	rows, err := store.Claim(tctx(t), "r", 4, time.Minute, false)
	if err != nil || len(rows) != 4 {
		t.Fatalf("claim: %d rows, %v", len(rows), err)
	}
	if err := store.Fail(tctx(t), "r", rows[3].ID, "unroutable"); err != nil {
		t.Fatal(err)
	}
	sent := []int64{rows[0].ID, rows[1].ID, rows[3].ID}
	for range 2 {
		if err := store.MarkSent(tctx(t), sent); err != nil {
			t.Fatalf("MarkSent: %v", err)
		}
	}
	if c := e.counts(); c[outbox.StateSent] != 0 || c[outbox.StatePending] != 1 || c[outbox.StateFailed] != 1 {
		t.Fatalf("counts %v, want 1 pending (leased), 1 failed and no sent row", c)
	}
	if n, err := store.Purge(tctx(t), 0, 10); err != nil || n != 0 {
		t.Fatalf("Purge = %d, %v; want nothing to purge", n, err)
	}
}

func headersRoundTrip(t *testing.T, s suite) {
	e := setupDB(t, s)
	m := e.msg("h")
	m.Headers = amqp.Table{"tenant": "t-1", "n": int64(3), "nested": amqp.Table{"ok": true}}
	m.Exchange, m.ContentType = "ex", "application/json"
	e.add(m)
	rows := e.claim("r", 1, time.Minute, false)
	if len(rows) != 1 || rows[0].HeadersErr != nil {
		t.Fatalf("claimed %+v", rows)
	}
	got := rows[0].Message
	if got.Exchange != "ex" || got.ContentType != "application/json" || got.Headers["tenant"] != "t-1" {
		t.Fatalf("message %+v", got)
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
