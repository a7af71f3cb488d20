package idemq

import (
	"context"
	"errors"
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

// republishPolicy asks to publish again after every failed publish.
type republishPolicy struct{ BasePolicy }

func (republishPolicy) PublishFailed(_ *Delivery, dec Decision, err error) Decision {
	return Decision{Action: ActionPublish, Outcome: OutcomeRetried, Message: dec.Message, Sender: dec.Sender, Err: err}
}

type failingSender struct{ calls int }

func (s *failingSender) Publish(context.Context, Message) error {
	s.calls++
	return errors.New("broker unreachable")
}

// settledObserver records the settlements it hears of.
type settledObserver struct {
	orderRecorder
	settled []Settlement
}

func (o *settledObserver) Settled(_ *Delivery, s Settlement) { o.settled = append(o.settled, s) }

// The decision after a failed publish is the policy's, unless the policy
// keeps asking to publish past maxPublishFallbacks failed publishes: then
// the backstop requeues.
func TestAfterPublishFailed(t *testing.T) {
	errPub := errors.New("publish failed")
	publish := Decision{Action: ActionPublish, Outcome: OutcomeRetried, Message: &Message{ID: "m"}}
	for _, tc := range []struct {
		name   string
		policy FailurePolicy
		tries  int
		want   Decision
	}{
		{"policy's publish below the bound", republishPolicy{}, maxPublishFallbacks - 1,
			Decision{Action: ActionPublish, Outcome: OutcomeRetried, Message: publish.Message, Err: errPub}},
		{"backstop at the bound", republishPolicy{}, maxPublishFallbacks,
			Decision{Action: ActionRequeue, Outcome: OutcomeDeferred, Reason: "publish-failed", Err: errPub}},
		{"policy's requeue at the bound", BasePolicy{}, maxPublishFallbacks,
			BasePolicy{}.PublishFailed(nil, publish, errPub)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := afterPublishFailed(tc.policy, &Delivery{MessageID: "m"}, publish, errPub, tc.tries)
			if got.String() != tc.want.String() || got.Delay != tc.want.Delay || got.Err != tc.want.Err {
				t.Fatalf("afterPublishFailed = %v (%v), want %v (%v)", got, got.Err, tc.want, tc.want.Err)
			}
		})
	}
}

// A policy that never stops asking to publish: the executor publishes
// maxPublishFallbacks+1 times, then settles the backstop's requeue.
func TestCarryPublishBackstop(t *testing.T) {
	ack := acker.New(nopChannel{}, acker.Config{})
	defer ack.Close()
	obs := &settledObserver{}
	x := &executor{ack: ack, rq: acker.NewRequeuer(ack, nil), policy: republishPolicy{},
		rec: obs, obs: obs, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if err := ack.Register(1); err != nil {
		t.Fatal(err)
	}
	s := &failingSender{}
	x.carry(context.Background(), &Delivery{MessageID: "m"}, 1,
		Decision{Action: ActionPublish, Outcome: OutcomeRetried, Message: &Message{ID: "m"}, Sender: s}, 0)
	if s.calls != maxPublishFallbacks+1 {
		t.Fatalf("%d publishes, want %d", s.calls, maxPublishFallbacks+1)
	}
	if len(obs.settled) != 1 {
		t.Fatalf("%d settlements, want 1", len(obs.settled))
	}
	if dec := obs.settled[0].Decision; dec.Action != ActionRequeue || dec.Outcome != OutcomeDeferred || dec.Reason != "publish-failed" {
		t.Fatalf("settled %v, want the backstop's requeue", dec)
	}
}
