package e2etest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/bloom"
	"github.com/idemq/idemq/dedup/bloom/redisbloom"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sqldb/postgres"
)

// One identity, end to end. The message ID comes from an extractor only —
// a header, or a field of the JSON body — and the AMQP message_id is absent
// on the first copy and different (unrelated) on each resend. The dedup
// guard over an exact Redis store, the inbox in PostgreSQL and the Bloom
// tier in Redis each key on that one extracted value: each, alone, stops
// both resends, and the key each wrote names the extracted ID, never an
// AMQP message_id. Stacked (Bloom guard verifying against the inbox
// table, inbox as the handler), the Bloom tier's filter hits are verified
// against the inbox row of the same ID.
func TestExtractorOnlyIDIsTheOneIdentity(t *testing.T) {
	const orderID = "order-7"
	extractors := []struct {
		name string
		cfg  idemq.IDConfig
		msg  func(amqpID string) amqp.Publishing
	}{
		{"header", idemq.IDConfig{Extractor: idemq.FromHeader("x-order-id")}, func(amqpID string) amqp.Publishing {
			return amqp.Publishing{MessageId: amqpID, Headers: amqp.Table{"x-order-id": orderID}, Body: []byte(`{"amount":5}`)}
		}},
		{"json field", idemq.IDConfig{Extractor: idemq.FromJSONField("order.id")}, func(amqpID string) amqp.Publishing {
			return amqp.Publishing{MessageId: amqpID, ContentType: "application/json", Body: []byte(`{"order":{"id":"` + orderID + `"},"amount":5}`)}
		}},
	}
	// The first copy has no AMQP message_id; the resends carry unrelated ones.
	copies := []string{"", "resend-a", "resend-b"}

	for _, ex := range extractors {
		t.Run(ex.name, func(t *testing.T) {
			for _, layer := range []string{"guard", "inbox", "bloom", "stacked"} {
				t.Run(layer, func(t *testing.T) {
					f := newIdentityFixture(t, layer)
					queue := testenv.Queue(t, nil)
					c, _ := runConsumer(t, idemq.ConsumerConfig{Queue: queue, Group: "billing", ID: ex.cfg,
						Pipeline: idemq.Pipeline{Guard: f.guard}}, f.handler)
					cnt := c.Counters()
					for _, amqpID := range copies {
						testenv.Publish(t, "", queue, ex.msg(amqpID))
					}
					testenv.Eventually(t, wait, "every copy acked", func() bool { return cnt.Get(idemq.CountAcked) == int64(len(copies)) })
					if got := f.ranFor(); len(got) != 1 || got[orderID] != 1 {
						t.Fatalf("the effect ran for %v, want once for %s", got, orderID)
					}
					if p, d := cnt.Get(idemq.CountProcessed), cnt.Get(idemq.CountDuplicates); p != 1 || d != int64(len(copies)-1) {
						t.Fatalf("processed %d duplicates %d, want 1 and %d (%v)", p, d, len(copies)-1, cnt.Snapshot())
					}
					f.check(t, orderID, copies[1:], cnt)
				})
			}
		})
	}
}

// identityFixture is one layer (or the stack) under test: its guard (nil
// for the inbox alone), its handler, and what its store must hold.
type identityFixture struct {
	guard   idemq.Layer
	handler idemq.Handler
	check   func(t *testing.T, id string, notIDs []string, cnt *idemq.Counters)

	mu  sync.Mutex
	ran map[string]int
}

func (f *identityFixture) effect(d *idemq.Delivery) {
	id, _ := d.ID()
	f.mu.Lock()
	f.ran[id]++
	f.mu.Unlock()
}

func (f *identityFixture) ranFor() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{}
	for k, v := range f.ran {
		out[k] = v
	}
	return out
}

const identityPrefix = "e2e-id"

func newIdentityFixture(t *testing.T, layer string) *identityFixture {
	f := &identityFixture{ran: map[string]int{}}
	plain := idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error { f.effect(d); return nil })
	rdb, prefix := testenv.Redis(t)
	key := func(id string) string { return dedup.Key(identityPrefix, "billing", id) }
	guardOver := func(store dedup.Store) *dedup.Guard {
		return mustGuard(store, dedup.Config{Prefix: identityPrefix, InFlightRetryAfter: 50 * time.Millisecond, Logger: quiet()})
	}
	var ib *inbox.Inbox[pgx.Tx]
	var pool *pgxpool.Pool
	openInbox := func() {
		var err error
		pool, err = pgxpool.New(context.Background(), testenv.PostgresDB(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		if ib, err = inbox.New(context.Background(), postgres.Pgx(pool), inbox.Config{Logger: quiet()}); err != nil {
			t.Fatal(err)
		}
		f.handler = ib.Handler(func(ctx context.Context, tx pgx.Tx, d *idemq.Delivery) error { f.effect(d); return nil })
	}
	inboxRows := func(t *testing.T) []string {
		t.Helper()
		rows, err := pool.Query(context.Background(), "SELECT group_name || '/' || message_id FROM "+inbox.DefaultTable)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	bloomStore := func(v bloom.Verifier) *redisbloom.Store {
		st, err := redisbloom.NewStore(rdb, redisbloom.StoreConfig{
			Filter: redisbloom.Config{Filter: bloom.FilterConfig{ExpectedIDs: 10_000, FPRate: 1e-6, Window: 24 * time.Hour},
				KeyPrefix: prefix + ":bloom:"},
			// No exact done marker: the filter itself answers every
			// resend, and its hits go to the verifier.
			Recent: -1, Verifier: v, Logger: quiet(),
		})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	bloomHeld := func(t *testing.T, st *redisbloom.Store, id string, notIDs []string, cnt *idemq.Counters) {
		t.Helper()
		// Each resend was a filter hit on the extracted ID's key, confirmed
		// by the verifier: the filter keyed on the same value.
		if v, fp := cnt.Get(bloom.CountVerifiedDone), cnt.Get(bloom.CountFalsePositives); v != int64(len(notIDs)) || fp != 0 {
			t.Fatalf("verified done %d, false positives %d; want %d and 0 (%v)", v, fp, len(notIDs), cnt.Snapshot())
		}
		ctx := context.Background()
		if ok, err := st.Filter().Test(ctx, key(id)); err != nil || !ok {
			t.Fatalf("the filter does not hold %q (err %v)", key(id), err)
		}
		for _, n := range notIDs {
			if ok, _ := st.Filter().Test(ctx, key(n)); ok {
				t.Errorf("the filter holds the AMQP message_id's key %q", key(n))
			}
		}
	}

	switch layer {
	case "guard":
		st, err := redisstore.New(rdb, redisstore.Config{KeyPrefix: prefix + ":"})
		if err != nil {
			t.Fatal(err)
		}
		f.guard, f.handler = guardOver(st), plain
		f.check = func(t *testing.T, id string, notIDs []string, cnt *idemq.Counters) {
			ctx := context.Background()
			if rec, ok, err := st.Get(ctx, key(id)); err != nil || !ok || rec.State != dedup.StateDone {
				t.Fatalf("record %q: %+v ok=%v err=%v, want done", key(id), rec, ok, err)
			}
			for _, n := range notIDs {
				if _, ok, _ := st.Get(ctx, key(n)); ok {
					t.Errorf("a record keyed on the AMQP message_id %q exists", n)
				}
			}
		}
	case "inbox":
		openInbox()
		f.check = func(t *testing.T, id string, _ []string, _ *idemq.Counters) {
			if got := inboxRows(t); len(got) != 1 || got[0] != "billing/"+id {
				t.Fatalf("inbox rows %v, want [billing/%s]", got, id)
			}
		}
	case "bloom":
		truth, err := redisstore.New(rdb, redisstore.Config{KeyPrefix: prefix + ":truth:"})
		if err != nil {
			t.Fatal(err)
		}
		st := bloomStore(bloom.RecordOfTruth(truth))
		f.guard, f.handler = guardOver(st), plain
		f.check = func(t *testing.T, id string, notIDs []string, cnt *idemq.Counters) {
			bloomHeld(t, st, id, notIDs, cnt)
			if rec, ok, err := truth.Get(context.Background(), key(id)); err != nil || !ok || rec.State != dedup.StateDone {
				t.Fatalf("record of truth %q: %+v ok=%v err=%v, want done", key(id), rec, ok, err)
			}
		}
	case "stacked":
		openInbox()
		// The Bloom tier verifies its hits against the inbox table: the
		// row of the group and ID its key names.
		verify := bloom.VerifierFunc(func(ctx context.Context, k string) (bool, error) {
			rest, ok := strings.CutPrefix(k, identityPrefix+":billing:")
			if !ok {
				return false, fmt.Errorf("unexpected key %q", k)
			}
			var n int
			err := pool.QueryRow(ctx, "SELECT count(*) FROM "+inbox.DefaultTable+" WHERE group_name = $1 AND message_id = $2", "billing", rest).Scan(&n)
			return n > 0, err
		})
		st := bloomStore(verify)
		f.guard = guardOver(st)
		f.check = func(t *testing.T, id string, notIDs []string, cnt *idemq.Counters) {
			bloomHeld(t, st, id, notIDs, cnt)
			if got := inboxRows(t); len(got) != 1 || got[0] != "billing/"+id {
				t.Fatalf("inbox rows %v, want [billing/%s]", got, id)
			}
		}
	default:
		t.Fatalf("unknown layer %q", layer)
	}
	return f
}
