package idemqtest_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/retry"
	"github.com/idemq/idemq/sqldb/sqlite"
)

// bank is a table of accounts in SQLite, one per message, and the naive
// transfer: balance += amount.
type bank struct{ db *sql.DB }

func newBank(t testing.TB, msgs []idemq.Message) *bank {
	t.Helper()
	db := idemqtest.OpenSQLite(t)
	if _, err := db.Exec(`CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if _, err := db.Exec(`INSERT INTO accounts VALUES (?, 0)`, m.ID); err != nil {
			t.Fatal(err)
		}
	}
	return &bank{db: db}
}

// apply is the effect in tx: the account named by the message ID gets
// the amount in the body.
func apply(ctx context.Context, tx *sql.Tx, d *idemq.Delivery) error {
	amount, err := strconv.ParseInt(string(d.Body), 10, 64)
	if err != nil {
		return idemq.Reject(idemq.ReasonUnparseable, err)
	}
	_, err = tx.ExecContext(ctx, `UPDATE accounts SET balance = balance + ? WHERE id = ?`, amount, d.MessageID)
	return err
}

// naive runs apply in a transaction of its own, with the in-handler crash
// point right before its commit.
func (b *bank) naive() idemq.Handler {
	return idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
		tx, err := b.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		if err := apply(ctx, tx, d); err != nil {
			return err
		}
		idemqtest.CrashPoint(ctx, idemqtest.InHandler)
		return tx.Commit()
	})
}

// applied is balance / amount.
func (b *bank) applied(ctx context.Context, m idemq.Message) (int, error) {
	var bal int64
	if err := b.db.QueryRowContext(ctx, `SELECT balance FROM accounts WHERE id = ?`, m.ID).Scan(&bal); err != nil {
		return 0, err
	}
	amount, _ := strconv.ParseInt(string(m.Body), 10, 64)
	return int(bal / amount), nil
}

func transfers(n int) []idemq.Message {
	msgs := make([]idemq.Message, n)
	for i := range msgs {
		msgs[i] = idemq.Message{ID: fmt.Sprintf("t-%d", i+1), Body: []byte(strconv.Itoa(10 * (i + 1)))}
	}
	return msgs
}

// modes are the three ways of the bank example: no protection, the dedup
// guard over its own transaction, the inbox.
func setupFor(t *testing.T, mode string, msgs []idemq.Message) idemqtest.Setup {
	return func(ctx context.Context, _ string) (idemqtest.Target, error) {
		b := newBank(t, msgs)
		tg := idemqtest.Target{Applied: b.applied}
		switch mode {
		case "none":
			tg.Pipeline = idemq.Pipeline{Handler: b.naive()}
		case "dedup":
			clock := idemqtest.NewClock(time.Time{})
			g, err := dedup.NewGuard(dedup.Config{Store: idemqtest.NewStore(clock), Logger: quiet})
			if err != nil {
				return tg, err
			}
			tg.Clock = clock
			tg.Pipeline = idemq.Pipeline{Guard: g, Handler: b.naive()}
		case "inbox":
			ib, err := inbox.New(ctx, sqlite.Std(b.db), inbox.Config{Logger: quiet})
			if err != nil {
				return tg, err
			}
			tg.Pipeline = idemq.Pipeline{Handler: ib.Handler(idemqtest.BeforeCommit(apply))}
		}
		return tg, nil
	}
}

func TestCheckVerdicts(t *testing.T) {
	msgs := transfers(6)
	tests := []struct {
		mode   string
		copies int
		// twice: the scenarios ("" the duplicates alone) where a message
		// is applied more than once.
		twice []idemqtest.Point
	}{
		// One delivery each: only the crashes duplicate, after the commit.
		{"none", 1, []idemqtest.Point{idemqtest.AfterCommit, idemqtest.BeforeAck}},
		// Published three times: every scenario applies twice.
		{"none", 3, []idemqtest.Point{"", idemqtest.BeforeClaim, idemqtest.InHandler, idemqtest.AfterCommit, idemqtest.BeforeAck}},
		// The guard stops the copies; its after-commit window stays open.
		{"dedup", 3, []idemqtest.Point{idemqtest.AfterCommit}},
		// The inbox row commits with the effect: exactly once.
		{"inbox", 3, nil},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/copies=%d", tt.mode, tt.copies), func(t *testing.T) {
			r, err := idemqtest.Check(t.Context(), setupFor(t, tt.mode, msgs), msgs, idemqtest.Options{Copies: tt.copies})
			if err != nil {
				t.Fatal(err)
			}
			got := r.Points(idemqtest.AppliedTwice)
			if !slices.Equal(got, tt.twice) {
				t.Fatalf("applied twice after %q, want %q\n%s", got, tt.twice, r)
			}
			for _, s := range r.Scenarios {
				if s.Point != "" && !s.Reached {
					t.Errorf("scenario %s: crash point not reached\n%s", s.Name, r)
				}
			}
			for _, k := range []idemqtest.Kind{idemqtest.Lost, idemqtest.Stuck} {
				if ps := r.Points(k); len(ps) > 0 {
					t.Errorf("%s after %q\n%s", k, ps, r)
				}
			}
			for _, v := range r.Violations {
				if v.Point != "" && (v.Attempt < 1 || v.Trace[slices.IndexFunc(v.Trace, func(tr idemqtest.Trace) bool { return tr.Crashed != "" })].Attempt != v.Attempt) {
					t.Errorf("%s: attributed to attempt %d, not the crashed one\n%s", v, v.Attempt, r)
				}
			}
		})
	}
}

func TestCheckIdempotentInbox(t *testing.T) {
	msgs := transfers(8)
	idemqtest.CheckIdempotent(t, setupFor(t, "inbox", msgs), msgs, idemqtest.Options{Copies: 4, Workers: 8, Crashes: 2})
}

// Through the retry policy: every message fails its first run (retried
// through a retry queue, which the kit delivers again) and one is
// unparseable (dead-lettered, not lost): still exactly once with the inbox.
func TestCheckRetryPolicyInbox(t *testing.T) {
	msgs := append(transfers(4), idemq.Message{ID: "t-bad", Body: []byte("x")})
	var failed sync.Map
	setup := func(ctx context.Context, name string) (idemqtest.Target, error) {
		good := msgs[:4]
		b := newBank(t, good)
		ib, err := inbox.New(ctx, sqlite.Std(b.db), inbox.Config{Logger: quiet})
		if err != nil {
			return idemqtest.Target{}, err
		}
		policy, err := retry.New(retry.Config{Sender: &idemqtest.Sender{}, QuickAttempts: 1, Delays: []time.Duration{time.Second}, MaxAttempts: 3})
		if err != nil {
			return idemqtest.Target{}, err
		}
		flaky := func(ctx context.Context, tx *sql.Tx, d *idemq.Delivery) error {
			if _, seen := failed.LoadOrStore(name+"/"+d.MessageID, true); !seen {
				return errors.New("transient")
			}
			return apply(ctx, tx, d)
		}
		applied := func(ctx context.Context, m idemq.Message) (int, error) {
			if m.ID == "t-bad" {
				return 0, nil
			}
			return b.applied(ctx, m)
		}
		return idemqtest.Target{Applied: applied, Pipeline: idemq.Pipeline{Policy: policy,
			Handler: ib.Handler(idemqtest.BeforeCommit(flaky))}}, nil
	}
	r := idemqtest.CheckIdempotent(t, setup, msgs, idemqtest.Options{})
	for _, s := range r.Scenarios {
		if s.Outcomes["retried"] == 0 || s.Outcomes["dead-lettered"] == 0 {
			t.Errorf("scenario %s outcomes %v: want retries and a dead letter", s.Name, s.Outcomes)
		}
	}
}

// CrashPoint does nothing outside Check, and a scenario whose handler
// never calls it says its point was not reached.
func TestCrashPointOutsideAndUnreached(t *testing.T) {
	idemqtest.CrashPoint(t.Context(), idemqtest.InHandler) // returns
	var mu sync.Mutex
	applied := map[string]int{}
	setup := func(context.Context, string) (idemqtest.Target, error) {
		clear(applied)
		return idemqtest.Target{
			Pipeline: idemq.Pipeline{Handler: idemq.HandlerFunc(func(_ context.Context, d *idemq.Delivery) error {
				mu.Lock()
				defer mu.Unlock()
				applied[d.MessageID]++
				return nil
			})},
			Applied: func(_ context.Context, m idemq.Message) (int, error) {
				mu.Lock()
				defer mu.Unlock()
				return applied[m.ID], nil
			},
		}, nil
	}
	r, err := idemqtest.Check(t.Context(), setup, transfers(2), idemqtest.Options{Copies: 1, Points: []idemqtest.Point{idemqtest.InHandler}, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Scenarios) != 2 || r.Scenarios[1].Reached || r.Scenarios[1].Crashes != 0 || !r.Idempotent() || r.Seed != 7 {
		t.Fatalf("report:\n%s", r)
	}
}

// A classic mistake: skipping redelivered deliveries "because they were
// processed". A crash before the commit makes the message lost.
func TestCheckReportsLost(t *testing.T) {
	msgs := transfers(3)
	setup := func(ctx context.Context, _ string) (idemqtest.Target, error) {
		b := newBank(t, msgs)
		naive := b.naive()
		skip := idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
			if d.Redelivered {
				return nil
			}
			return naive.Handle(ctx, d)
		})
		return idemqtest.Target{Applied: b.applied, Pipeline: idemq.Pipeline{Handler: skip}}, nil
	}
	r, err := idemqtest.Check(t.Context(), setup, msgs, idemqtest.Options{Copies: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := r.Points(idemqtest.Lost), []idemqtest.Point{idemqtest.BeforeClaim, idemqtest.InHandler}; !slices.Equal(got, want) {
		t.Fatalf("lost after %q, want %q\n%s", got, want, r)
	}
	if got := r.Points(idemqtest.AppliedTwice); len(got) != 0 {
		t.Fatalf("applied twice after %q\n%s", got, r)
	}
}
