package outbox_test

import (
	"context"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/sqltest"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/sqldb"
)

// statementLog records the statements a store runs on its database.
type statementLog struct {
	sqldb.DB
	mu   sync.Mutex
	stmt []string
}

func (l *statementLog) note(q string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stmt = append(l.stmt, q)
}

// since returns the statements run since the first n, joined.
func (l *statementLog) since(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.stmt[n:], "; ")
}

func (l *statementLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.stmt)
}

// Begin logs the transaction's statements too.
func (l *statementLog) Begin(ctx context.Context, opts sqldb.TxOptions) (sqldb.Tx, error) {
	tx, err := l.DB.Begin(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &txLog{Tx: tx, log: l}, nil
}

type txLog struct {
	sqldb.Tx
	log *statementLog
}

func (t *txLog) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	t.log.note(q)
	return t.Tx.Exec(ctx, q, args...)
}

func (t *txLog) Query(ctx context.Context, q string, args ...any) (sqldb.Rows, error) {
	t.log.note(q)
	return t.Tx.Query(ctx, q, args...)
}

func (l *statementLog) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	l.note(q)
	return l.DB.Exec(ctx, q, args...)
}

func (l *statementLog) Query(ctx context.Context, q string, args ...any) (sqldb.Rows, error) {
	l.note(q)
	return l.DB.Query(ctx, q, args...)
}

// On PostgreSQL the relay's bookkeeping skips the commit's WAL flush wait
// by default (unordered claims and marks), ordered claims never do, and
// SyncBookkeeping keeps every statement synchronous. The statements run
// against a real database: the claim and the mark still do their work.
func TestBookkeepingCommitsAsync(t *testing.T) {
	const async = "set_config('synchronous_commit', 'off', true)"
	for _, c := range []struct {
		name                           string
		sync, deleteSent               bool
		claimAsync, ordered, markAsync bool
	}{
		{name: "default", claimAsync: true, markAsync: true},
		{name: "default ordered", ordered: true, claimAsync: false, markAsync: true},
		{name: "SyncBookkeeping", sync: true},
		{name: "SyncBookkeeping ordered", sync: true, ordered: true},
		{name: "DeleteSent", deleteSent: true, claimAsync: true, markAsync: true},
		{name: "DeleteSent SyncBookkeeping", deleteSent: true, sync: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			be := sqltest.PostgresStd()
			db, _ := be.Open(t, be.NewDatabase(t))
			log := &statementLog{DB: db}
			ctx := context.Background()
			store, err := outbox.NewStore(ctx, log, outbox.StoreConfig{SyncBookkeeping: c.sync, DeleteSent: c.deleteSent})
			if err != nil {
				t.Fatal(err)
			}
			if err := store.Add(ctx, db, outbox.Message{ID: "b-1", RoutingKey: "q", Body: []byte("x")}); err != nil {
				t.Fatal(err)
			}
			n := log.count()
			rows, err := store.Claim(ctx, "me", 10, time.Minute, c.ordered)
			if err != nil || len(rows) != 1 {
				t.Fatalf("claim: %d rows, %v", len(rows), err)
			}
			if got := strings.Contains(log.since(n), async); got != c.claimAsync {
				t.Errorf("claim commits async: %v, want %v (%s)", got, c.claimAsync, log.since(n))
			}
			n = log.count()
			if err := store.MarkSent(ctx, []int64{rows[0].ID}); err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(log.since(n), async); got != c.markAsync {
				t.Errorf("mark commits async: %v, want %v (%s)", got, c.markAsync, log.since(n))
			}
			want := map[outbox.State]int64{outbox.StateSent: 1}
			if c.deleteSent {
				want = map[outbox.State]int64{} // the row is gone
			}
			if n, err := store.Count(ctx); err != nil || !maps.Equal(n, want) {
				t.Fatalf("counts %v (%v), want %v", n, err, want)
			}
		})
	}
}
