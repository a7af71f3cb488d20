package idemqtest_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/idemqtest"
)

// accounts is the state a handler changes: a balance per account.
type accounts struct {
	mu      sync.Mutex
	balance map[string]int64
}

// transfer is a naive handler: balance += amount. The hook marks where it
// would commit.
func (a *accounts) transfer(ctx context.Context, d *idemq.Delivery) error {
	amount, err := strconv.ParseInt(string(d.Body), 10, 64)
	if err != nil {
		return idemq.Reject(idemq.ReasonUnparseable, err)
	}
	idemqtest.CrashPoint(ctx, idemqtest.InHandler) // a crash here: nothing committed
	a.mu.Lock()
	defer a.mu.Unlock()
	a.balance[d.MessageID] += amount
	return nil
}

// applied reads the effect: each message pays into an account of its own.
func (a *accounts) applied(_ context.Context, m idemq.Message) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	amount, _ := strconv.ParseInt(string(m.Body), 10, 64)
	return int(a.balance[m.ID] / amount), nil
}

// Check a naive handler (balance += amount) alone, then behind the dedup
// guard: each message delivered three times, shuffled and concurrent, and
// crashed at every crash point. Alone it pays twice after the crashes
// that follow its effect; the guard closes every window but one — a crash
// after the effect, before the guard records it done. Only an inbox row
// written in the effect's own transaction closes that one.
func Example() {
	msgs := []idemq.Message{
		{ID: "t-1", Body: []byte("10")},
		{ID: "t-2", Body: []byte("25")},
	}
	for _, guarded := range []bool{false, true} {
		setup := func(ctx context.Context, scenario string) (idemqtest.Target, error) {
			a := &accounts{balance: map[string]int64{}}
			tg := idemqtest.Target{Applied: a.applied, Pipeline: idemq.Pipeline{Handler: idemq.HandlerFunc(a.transfer)}}
			if guarded {
				tg.Clock = idemqtest.NewClock(time.Time{})
				g, err := dedup.NewGuard(dedup.Config{Store: idemqtest.NewStore(tg.Clock),
					Logger: slog.New(slog.DiscardHandler)})
				if err != nil {
					return tg, err
				}
				tg.Pipeline.Guard = g
			}
			return tg, nil
		}
		opts := idemqtest.Options{Copies: 1}
		if guarded {
			opts.Copies = 3
		}
		r, err := idemqtest.Check(context.Background(), setup, msgs, opts)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("guard=%v idempotent=%v applied twice after %v\n", guarded, r.Idempotent(), r.Points(idemqtest.AppliedTwice))
	}
	// Output:
	// guard=false idempotent=false applied twice after [after-commit before-ack]
	// guard=true idempotent=false applied twice after [after-commit]
}

var quiet = slog.New(slog.DiscardHandler)
