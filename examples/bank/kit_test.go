package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/retry"
	"github.com/idemq/idemq/sqldb/postgres"
)

// The bank's own handler, policy and middleware, checked with idemqtest in
// its three modes (a fresh PostgreSQL database per scenario, no broker):
// none duplicates after the commit, dedup only in its after-commit window,
// inbox never.
func TestBankHandlerWithKit(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	msgs := make([]idemq.Message, 4)
	for i := range msgs {
		msgs[i] = idemq.Message{ID: fmt.Sprintf("kit-%d", i), Body: fmt.Appendf(nil, `{"account":"a-%d","amount":10}`, i)}
	}
	tests := []struct {
		mode   string
		copies int
		twice  []idemqtest.Point
	}{
		{"none", 1, []idemqtest.Point{idemqtest.AfterCommit, idemqtest.BeforeAck}},
		{"dedup", 3, []idemqtest.Point{idemqtest.AfterCommit}},
		{"inbox", 3, nil},
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			setup := func(ctx context.Context, _ string) (idemqtest.Target, error) {
				pool, err := pgxpool.New(ctx, testenv.PostgresDB(t))
				if err != nil {
					return idemqtest.Target{}, err
				}
				if err := migrate(ctx, pool); err != nil {
					pool.Close()
					return idemqtest.Target{}, err
				}
				policy, err := retry.New(retry.ForTopology(bankQueue("bank.kit", "quorum"), retry.Config{Sender: &idemqtest.Sender{}}))
				if err != nil {
					pool.Close()
					return idemqtest.Target{}, err
				}
				effect := transferEffect(tt.mode, 0, func(ctx context.Context) { idemqtest.CrashPoint(ctx, idemqtest.InHandler) })
				tg := idemqtest.Target{
					Pipeline: idemq.Pipeline{Policy: policy, Middleware: []idemq.Middleware{requireID()},
						Handler: ownTxHandler(pool, effect, func(context.Context) {})},
					Applied: func(ctx context.Context, m idemq.Message) (int, error) {
						var n int
						err := pool.QueryRow(ctx, `SELECT count(*) FROM bank_applied WHERE message_id = $1`, m.ID).Scan(&n)
						return n, err
					},
					Close: func() error { pool.Close(); return nil },
				}
				switch tt.mode {
				case "dedup":
					tg.Clock = idemqtest.NewClock(time.Time{})
					g, err := dedup.NewGuard(dedup.Config{Store: idemqtest.NewStore(tg.Clock), Prefix: "bank", Logger: quiet})
					if err != nil {
						return tg, err
					}
					tg.Pipeline.Guard = g
				case "inbox":
					ib, err := inbox.New(ctx, postgres.Pgx(pool), inbox.Config{Logger: quiet})
					if err != nil {
						return tg, err
					}
					tg.Pipeline.Handler = ib.Handler(effect)
				}
				return tg, nil
			}
			r, err := idemqtest.Check(t.Context(), setup, msgs, idemqtest.Options{Copies: tt.copies, Queue: "bank.kit", Group: "bank"})
			if err != nil {
				t.Fatal(err)
			}
			if got := r.Points(idemqtest.AppliedTwice); !slices.Equal(got, tt.twice) {
				t.Fatalf("applied twice after %q, want %q\n%s", got, tt.twice, r)
			}
			for _, k := range []idemqtest.Kind{idemqtest.Lost, idemqtest.Stuck} {
				if ps := r.Points(k); len(ps) > 0 {
					t.Fatalf("%s after %q\n%s", k, ps, r)
				}
			}
			for _, s := range r.Scenarios {
				if s.Point != "" && !s.Reached {
					t.Fatalf("crash point %s not reached\n%s", s.Point, r)
				}
			}
		})
	}
}
