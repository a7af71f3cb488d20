package idemqtest_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/retry"
	"github.com/idemq/idemq/sqldb/sqlite"
)

func ok(context.Context, *idemq.Delivery) error { return nil }

func TestDecisionAssertions(t *testing.T) {
	policy, err := retry.New(retry.Config{Sender: &idemqtest.Sender{}, QuickAttempts: 1, Delays: []time.Duration{time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	clock := idemqtest.NewClock(time.Time{})
	store := idemqtest.NewStore(clock)
	guard, err := dedup.NewGuard(dedup.Config{Store: store, Lease: 30 * time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	fail := idemq.HandlerFunc(func(context.Context, *idemq.Delivery) error { return errors.New("boom") })
	tests := []struct {
		name  string
		p     idemq.Pipeline
		d     *idemq.Delivery
		check func(testing.TB, idemq.Decision)
	}{
		{"processed", idemq.Pipeline{Handler: idemq.HandlerFunc(ok)}, idemqtest.NewDelivery("m-1", nil), idemqtest.RequireAcked},
		{"rejected with its reason", idemq.Pipeline{Handler: idemq.HandlerFunc(func(context.Context, *idemq.Delivery) error {
			return idemq.Reject(idemq.ReasonUnparseable, errors.New("bad json"))
		})}, idemqtest.NewDelivery("m-2", nil), func(t testing.TB, d idemq.Decision) {
			idemqtest.RequireDeadLettered(t, d, idemq.ReasonUnparseable)
		}},
		{"missing ID dead-lettered by the retry policy", idemq.Pipeline{Policy: policy, Guard: guard, Handler: idemq.HandlerFunc(ok)},
			idemqtest.NewDelivery("", nil), func(t testing.TB, d idemq.Decision) { idemqtest.RequireDeadLettered(t, d, idemq.ReasonMissingID) }},
		{"failure retried", idemq.Pipeline{Policy: policy, Handler: fail}, idemqtest.NewDelivery("m-3", nil), idemqtest.RequireRetried},
		{"last attempt dead-lettered", idemq.Pipeline{Policy: policy, Handler: fail},
			idemqtest.NewDelivery("m-4", nil, idemqtest.WithHeader(idemq.HeaderAttempt, int32(2)), idemqtest.WithHeader(idemq.HeaderQueue, "idemqtest"),
				idemqtest.WithXDeath("idemqtest.retry.1000", "expired", 1)),
			func(t testing.TB, d idemq.Decision) { idemqtest.RequireDeadLettered(t, d, idemq.ReasonMaxAttempts) }},
		{"delivery limit", idemq.Pipeline{Policy: mustPolicy(t, retry.Config{Sender: &idemqtest.Sender{}, DeliveryLimit: 5}), Handler: idemq.HandlerFunc(ok)},
			idemqtest.NewDelivery("m-5", nil, idemqtest.WithDeliveryCount(5), idemqtest.WithRedelivered()),
			func(t testing.TB, d idemq.Decision) { idemqtest.RequireDeadLettered(t, d, idemq.ReasonDeliveryLimit) }},
		{"ID from a header", idemq.Pipeline{Guard: guard, Handler: idemq.HandlerFunc(func(_ context.Context, d *idemq.Delivery) error {
			if id, _ := d.ID(); id != "biz-1" {
				return idemq.Permanent(errors.New("ID " + id))
			}
			return nil
		})}, idemqtest.NewDelivery("amqp-1", nil, idemqtest.WithHeader("order", "biz-1"), idemqtest.WithID(idemq.IDConfig{Extractor: idemq.FromHeader("order")})),
			idemqtest.RequireAcked},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.check(t, idemqtest.Decide(t, tt.p, tt.d)) })
	}
}

func mustPolicy(t *testing.T, cfg retry.Config) *retry.Policy {
	t.Helper()
	p, err := retry.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The dedup fixtures: a duplicate is recognised, a lease held by a
// handler that died defers the redelivery until the clock passes it, a
// lost record lets a duplicate through.
func TestGuardFixtures(t *testing.T) {
	clock := idemqtest.NewClock(time.Time{})
	store := idemqtest.NewStore(clock)
	guard, err := dedup.NewGuard(dedup.Config{Store: store, Lease: 30 * time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	p := idemq.Pipeline{Guard: guard, Handler: idemq.HandlerFunc(func(context.Context, *idemq.Delivery) error { runs++; return nil })}

	idemqtest.RequireAcked(t, idemqtest.Decide(t, p, idemqtest.NewDelivery("m-1", nil)))
	idemqtest.RequireDuplicate(t, idemqtest.Decide(t, p, idemqtest.NewDelivery("m-1", nil, idemqtest.WithRedelivered())), idemq.LayerGuard)

	// Another consumer claimed m-2 and died: in flight until its lease expires.
	key := dedup.Key("idemq", "idemqtest", "m-2")
	if _, err := store.Claim(t.Context(), key, "dead-owner", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	idemqtest.RequireRequeued(t, idemqtest.Decide(t, p, idemqtest.NewDelivery("m-2", nil)), dedup.RequeueInFlight)
	clock.Advance(31 * time.Second)
	idemqtest.RequireAcked(t, idemqtest.Decide(t, p, idemqtest.NewDelivery("m-2", nil, idemqtest.WithRedelivered())))

	// The store loses m-1's record: the guard alone lets the duplicate run.
	if err := idemqtest.LoseRecord(t.Context(), store, "", "idemqtest", "m-1"); err != nil {
		t.Fatal(err)
	}
	idemqtest.RequireAcked(t, idemqtest.Decide(t, p, idemqtest.NewDelivery("m-1", nil)))
	if runs != 3 {
		t.Fatalf("handler ran %d times, want 3 (m-1 twice: its record was lost)", runs)
	}
}

// The inbox on SQLite recognises a duplicate even when the guard's
// record is lost: the exactly-once path in a unit test.
func TestInboxOnSQLite(t *testing.T) {
	db := idemqtest.OpenSQLite(t)
	ib, err := inbox.New(t.Context(), sqlite.Std(db), inbox.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	clock := idemqtest.NewClock(time.Time{})
	store := idemqtest.NewStore(clock)
	guard, err := dedup.NewGuard(dedup.Config{Store: store, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	p := idemq.Pipeline{Guard: guard, Handler: ib.Handler(func(context.Context, *sql.Tx, *idemq.Delivery) error { return nil })}
	idemqtest.RequireAcked(t, idemqtest.Decide(t, p, idemqtest.NewDelivery("m-1", nil)))
	idemqtest.RequireDuplicate(t, idemqtest.Decide(t, p, idemqtest.NewDelivery("m-1", nil)), idemq.LayerGuard)
	clock.Advance(25 * time.Hour) // past the guard's window: the record is gone
	idemqtest.RequireDuplicate(t, idemqtest.Decide(t, p, idemqtest.NewDelivery("m-1", nil)), idemq.LayerInbox)
}

func TestXDeathParses(t *testing.T) {
	d := idemqtest.NewDelivery("m", nil, idemqtest.WithXDeath("q.retry.1000", "expired", 2), idemqtest.WithXDeath("q", "rejected", 1))
	got := retry.ParseXDeath(d.Header(idemq.HeaderDeath))
	if len(got) != 2 || got[0].Queue != "q" || got[1].Queue != "q.retry.1000" || got[1].Count != 2 || got[1].Reason != "expired" {
		t.Fatalf("x-death %+v", got)
	}
}
