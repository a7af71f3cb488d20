package idemq_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idemq/idemq"
)

// runAgain asks for runs until the chain has run n times, then acks.
type runAgain struct {
	idemq.BasePolicy
	n int
}

func (p runAgain) Decide(d *idemq.Delivery, r idemq.Run) idemq.Decision {
	if r.Err != nil && r.N < p.n {
		return idemq.Decision{Action: idemq.ActionRunAgain}
	}
	return p.BasePolicy.Decide(d, r)
}

func TestPipelineDecide(t *testing.T) {
	fails := func(n int, runs *int) idemq.Handler {
		return idemq.HandlerFunc(func(context.Context, *idemq.Delivery) error {
			*runs++
			if *runs <= n {
				return errors.New("transient")
			}
			return nil
		})
	}
	tests := []struct {
		name     string
		p        func(runs *int) idemq.Pipeline
		action   idemq.Action
		outcome  idemq.Outcome
		reason   string
		wantRuns int
	}{
		{"processed", func(r *int) idemq.Pipeline { return idemq.Pipeline{Handler: fails(0, r)} }, idemq.ActionAck, idemq.OutcomeProcessed, "", 1},
		{"quick retries run the chain again", func(r *int) idemq.Pipeline {
			return idemq.Pipeline{Policy: runAgain{n: 3}, Handler: fails(2, r)}
		}, idemq.ActionAck, idemq.OutcomeProcessed, "", 3},
		{"a panic is a failed run", func(r *int) idemq.Pipeline {
			return idemq.Pipeline{Handler: idemq.HandlerFunc(func(context.Context, *idemq.Delivery) error { *r++; panic("boom") })}
		}, idemq.ActionReject, idemq.OutcomeRejected, idemq.ReasonPanic, 1},
		{"a panic in a middleware too", func(r *int) idemq.Pipeline {
			return idemq.Pipeline{Handler: fails(0, r), Middleware: []idemq.Middleware{func(idemq.Handler) idemq.Handler {
				return idemq.HandlerFunc(func(context.Context, *idemq.Delivery) error { panic("mw") })
			}}}
		}, idemq.ActionReject, idemq.OutcomeRejected, idemq.ReasonPanic, 0},
		{"no handler", func(*int) idemq.Pipeline { return idemq.Pipeline{} }, idemq.ActionReject, idemq.OutcomeRejected, "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runs := 0
			dec := tt.p(&runs).Decide(t.Context(), &idemq.Delivery{MessageID: "m-1"})
			if dec.Action != tt.action || dec.Outcome != tt.outcome || tt.reason != "" && dec.Reason != tt.reason || runs != tt.wantRuns {
				t.Fatalf("decision %s after %d runs, want %s/%s reason %q after %d", dec, runs, tt.action, tt.outcome, tt.reason, tt.wantRuns)
			}
			if tt.name == "no handler" && !errors.Is(dec.Err, idemq.ErrNoHandler) {
				t.Fatalf("err %v, want ErrNoHandler", dec.Err)
			}
		})
	}
}
