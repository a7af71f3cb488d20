package idemq

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"

	"github.com/idemq/idemq/internal/acker"
)

// nopChannel accepts every ack and nack.
type nopChannel struct{}

func (nopChannel) Ack(uint64, bool) error        { return nil }
func (nopChannel) Nack(uint64, bool, bool) error { return nil }

// orderRecorder records the order of the counters added.
type orderRecorder struct {
	mu    sync.Mutex
	names []string
}

func (r *orderRecorder) Add(name string, _ int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.names = append(r.names, name)
}

// A delivery's outcome (and the decision's own counters) are counted
// before it is counted acked, so a reader that sees "acked" reach n also
// sees the n outcomes: with many workers settling at once, a test that
// waited for acked == n read processed short (dedup/e2etest, 64 workers:
// "rejected 5 processed 3").
func TestSettleCountsTheOutcomeBeforeAcked(t *testing.T) {
	for _, dec := range []Decision{
		{Action: ActionAck, Outcome: OutcomeProcessed, Counters: []string{"extra"}},
		{Action: ActionAck, Outcome: OutcomeDuplicate, Counters: []string{"extra"}},
	} {
		t.Run(dec.Outcome.String(), func(t *testing.T) {
			ack := acker.New(nopChannel{}, acker.Config{})
			defer ack.Close()
			rec := &orderRecorder{}
			x := &executor{ack: ack, rq: acker.NewRequeuer(ack, nil), policy: BasePolicy{},
				rec: rec, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
			if err := ack.Register(1); err != nil {
				t.Fatal(err)
			}
			x.settle(context.Background(), &Delivery{MessageID: "m"}, 1, dec)
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if n := len(rec.names); n == 0 || rec.names[n-1] != CountAcked {
				t.Fatalf("counters in the order %v; want %q last", rec.names, CountAcked)
			}
		})
	}
}
