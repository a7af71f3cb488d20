package retry

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/backoff"
	"github.com/idemq/idemq/internal/headerval"
	"github.com/idemq/idemq/topology"
)

// The policy's decisions are pure functions of (error, delivery, run,
// config): these tests need no broker. What the broker does with the
// decisions the consumer carries out is tested against the real broker in
// policy_test.go, loop_test.go and forged_test.go.

// scripted is a Sender that fails as told: one error per publish, nil past
// the end.
type scripted struct {
	errs []error
	got  []idemq.Message
}

func (s *scripted) Publish(_ context.Context, m idemq.Message) error {
	h := amqp.Table{}
	for k, v := range m.Headers {
		h[k] = v
	}
	m.Headers = h
	s.got = append(s.got, m)
	if i := len(s.got) - 1; i < len(s.errs) {
		return s.errs[i]
	}
	return nil
}

var testNow = time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)

// testConfig: quick attempts 3 (10ms, 20ms, no jitter), delays 100ms and
// 1s (MaxAttempts 3), a quorum DeliveryLimit of 10, a fixed clock.
func testConfig(s idemq.Sender) Config {
	return Config{Sender: s, QuickAttempts: 3, Delays: []time.Duration{100 * time.Millisecond, time.Second},
		QuickBackoff:  backoff.Policy{Min: 10 * time.Millisecond, Max: 200 * time.Millisecond, NoJitter: true},
		DeliveryLimit: 10, Now: func() time.Time { return testNow }}
}

func mustNew(t *testing.T, cfg Config) *Policy {
	t.Helper()
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// trusted marks h as written by the policy on idemq's own retry path of
// queue q (see FromRetryPath).
func trusted(h amqp.Table) amqp.Table {
	h[idemq.HeaderQueue] = "q"
	return h
}

func TestDecide(t *testing.T) {
	transient := errors.New("flaky")
	ctCut := &idemq.HandlerTimeoutError{Limit: time.Minute, ConsumerTimeout: true, Err: context.DeadlineExceeded}
	htCut := &idemq.HandlerTimeoutError{Limit: time.Second, Err: context.DeadlineExceeded}
	unavailable := idemq.Unavailable("postgres", errors.New("connection refused"))
	type want struct {
		action   idemq.Action
		outcome  idemq.Outcome
		to       string        // routing key of the message to publish
		delay    time.Duration // ActionRunAgain / ActionRequeue
		reason   string
		attempt  int64 // x-idemq-attempt of a retry; 0: absent
		requeues int64 // x-idemq-requeues of a deferral; 0: absent
		counter  string
		freshID  bool // the message got a new ID (the original was invalid)
	}
	tests := []struct {
		name     string
		cfg      func(Config) Config // nil: testConfig
		id       string              // "": no AMQP message_id
		exchange string              // the delivery's exchange ("": the default exchange, routing key q)
		headers  amqp.Table
		err      error
		run      int
		stopping bool
		// queueLimit is the broker's limit the consumer read from the
		// management API (Delivery.QueueDeliveryLimit; 0: unknown).
		queueLimit int
		want       want
	}{
		{name: "success", id: "m", err: nil, run: 1, want: want{action: idemq.ActionAck, outcome: idemq.OutcomeProcessed}},
		{name: "duplicate", id: "m", err: fmt.Errorf("inbox: %w", idemq.Duplicate(idemq.LayerInbox)), run: 1,
			want: want{action: idemq.ActionAck, outcome: idemq.OutcomeDuplicate, reason: idemq.LayerInbox}},
		{name: "success after quick retries", id: "m", err: nil, run: 3, want: want{action: idemq.ActionAck, outcome: idemq.OutcomeProcessed}},
		{name: "transient, first run", id: "m", err: transient, run: 1, want: want{action: idemq.ActionRunAgain, delay: 10 * time.Millisecond}},
		{name: "transient, second run", id: "m", err: transient, run: 2, want: want{action: idemq.ActionRunAgain, delay: 20 * time.Millisecond}},
		{name: "transient, quick attempts spent", id: "m", err: transient, run: 3,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeRetried, to: "q.retry.100", reason: idemq.ReasonHandlerError, attempt: 2}},
		{name: "transient, run past QuickAttempts", id: "m", err: transient, run: 7,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeRetried, to: "q.retry.100", reason: idemq.ReasonHandlerError, attempt: 2}},
		{name: "attempt 2 uses the second delay", id: "m", headers: trusted(amqp.Table{idemq.HeaderAttempt: int64(2)}), err: transient, run: 3,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeRetried, to: "q.retry.1000", reason: idemq.ReasonHandlerError, attempt: 3}},
		{name: "attempt at MaxAttempts", id: "m", headers: trusted(amqp.Table{idemq.HeaderAttempt: int64(3)}), err: transient, run: 3,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeDeadLettered, to: "q.dlq", reason: idemq.ReasonMaxAttempts}},
		{name: "attempt over MaxAttempts", id: "m", headers: trusted(amqp.Table{idemq.HeaderAttempt: "99"}), err: transient, run: 3,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeDeadLettered, to: "q.dlq", reason: idemq.ReasonMaxAttempts}},
		{name: "garbage attempt counts as 1", id: "m", headers: trusted(amqp.Table{idemq.HeaderAttempt: "x"}), err: transient, run: 3,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeRetried, to: "q.retry.100", reason: idemq.ReasonHandlerError, attempt: 2}},
		{name: "forged attempt on a business exchange is dropped", id: "m", exchange: "orders",
			headers: amqp.Table{idemq.HeaderAttempt: int64(99), idemq.HeaderQueue: "q"}, err: transient, run: 3,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeRetried, to: "q.retry.100", reason: idemq.ReasonHandlerError, attempt: 2}},
		{name: "forged attempt without the marker is dropped", id: "m", headers: amqp.Table{idemq.HeaderAttempt: int64(3)}, err: transient, run: 3,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeRetried, to: "q.retry.100", reason: idemq.ReasonHandlerError, attempt: 2}},
		{name: "permanent: no quick retry", id: "m", err: idemq.Permanent(transient), run: 1,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeDeadLettered, to: "q.dlq", reason: idemq.ReasonPermanent}},
		{name: "reject keeps its reason", id: "m", err: idemq.Reject(idemq.ReasonUnparseable, transient), run: 1,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeDeadLettered, to: "q.dlq", reason: idemq.ReasonUnparseable}},
		{name: "panic is retried in process", id: "m", err: &idemq.PanicError{Value: "boom"}, run: 1,
			want: want{action: idemq.ActionRunAgain, delay: 10 * time.Millisecond}},
		{name: "panic, quick attempts spent", id: "m", err: &idemq.PanicError{Value: "boom"}, run: 3,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeRetried, to: "q.retry.100", reason: idemq.ReasonPanic, attempt: 2}},
		{name: "handler timeout is an attempt", id: "m", err: htCut, run: 3,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeRetried, to: "q.retry.100", reason: idemq.ReasonHandlerError, attempt: 2}},
		{name: "missing ID: dead letter, not a retry", id: "", err: transient, run: 3,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeDeadLettered, to: "q.dlq", reason: idemq.ReasonMissingID, freshID: true}},
		{name: "invalid ID: dead letter with a fresh ID", id: "bad\x01id", err: transient, run: 3,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeDeadLettered, to: "q.dlq", reason: idemq.ReasonInvalidID, freshID: true}},
		{name: "dependency unavailable: given back, not an attempt", id: "m", err: unavailable, run: 1,
			want: want{action: idemq.ActionRequeue, outcome: idemq.OutcomeUnavailable, delay: UnavailableRetryAfter, reason: RequeueUnavailable}},
		{name: "dependency unavailable with its own After", id: "m", err: idemq.Requeue(3*time.Second, "store-unavailable", unavailable), run: 1,
			want: want{action: idemq.ActionRequeue, outcome: idemq.OutcomeUnavailable, delay: 3 * time.Second, reason: RequeueUnavailable}},
		{name: "dependency unavailable near the delivery limit: republished to the work queue", id: "m",
			headers: amqp.Table{idemq.HeaderDeliveryCount: int64(5)}, err: unavailable, run: 1,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeUnavailable, to: "q", reason: RequeueUnavailable, requeues: 1}},
		{name: "stopping: given back at once", id: "m", err: transient, run: 1, stopping: true,
			want: want{action: idemq.ActionRequeue, outcome: idemq.OutcomeStopped, reason: "shutdown"}},
		{name: "stopping, dependency unavailable", id: "m", err: unavailable, run: 1, stopping: true,
			want: want{action: idemq.ActionRequeue, outcome: idemq.OutcomeStopped, reason: "shutdown"}},
		{name: "stopping, permanent: no dead letter now", id: "m", err: idemq.Permanent(transient), run: 1, stopping: true,
			want: want{action: idemq.ActionRequeue, outcome: idemq.OutcomeStopped, reason: "shutdown"}},
		{name: "requeue: smallest retry queue >= After", id: "m", err: idemq.Requeue(500*time.Millisecond, "store-unavailable", transient), run: 1,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeDeferred, to: "q.retry.1000", reason: "store-unavailable", requeues: 1}},
		{name: "requeue: After beyond every delay uses the largest", id: "m", err: idemq.Requeue(time.Minute, "later", transient), run: 1,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeDeferred, to: "q.retry.1000", reason: "later", requeues: 1}},
		{name: "requeue counts requeues, not attempts", id: "m", headers: trusted(amqp.Table{idemq.HeaderRequeues: int64(4), idemq.HeaderAttempt: int64(2)}),
			err: idemq.Requeue(50*time.Millisecond, "later", transient), run: 1,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeDeferred, to: "q.retry.100", reason: "later", requeues: 5, attempt: 2}},
		{name: "in place with room: requeued after After", id: "m", headers: amqp.Table{idemq.HeaderDeliveryCount: int64(4)},
			err: idemq.RequeueInPlace(2*time.Second, "in-flight", transient), run: 1,
			want: want{action: idemq.ActionRequeue, outcome: idemq.OutcomeDeferred, delay: 2 * time.Second, reason: "in-flight"}},
		{name: "in place without room: republished to the work queue", id: "m", headers: amqp.Table{idemq.HeaderDeliveryCount: int64(5)},
			err: idemq.RequeueInPlace(2*time.Second, "in-flight", transient), run: 1,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeDeferred, to: "q", reason: "in-flight", requeues: 1}},
		// RabbitMQ 4.0+ gives a quorum queue declaring no delivery-limit
		// one of 20: in-place requeues must not walk into it.
		{name: "in place, no declared limit: RabbitMQ 4's 20 caps requeues", cfg: func(c Config) Config { c.DeliveryLimit = 0; return c }, id: "m",
			headers: amqp.Table{idemq.HeaderDeliveryCount: int64(10)}, err: idemq.RequeueInPlace(time.Second, "in-flight", transient), run: 1,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeDeferred, to: "q", reason: "in-flight", requeues: 1}},
		{name: "in place, no declared limit, count low: in place", cfg: func(c Config) Config { c.DeliveryLimit = 0; return c }, id: "m",
			headers: amqp.Table{idemq.HeaderDeliveryCount: int64(9)}, err: idemq.RequeueInPlace(time.Second, "in-flight", transient), run: 1,
			want: want{action: idemq.ActionRequeue, outcome: idemq.OutcomeDeferred, delay: time.Second, reason: "in-flight"}},
		{name: "in place, RequeueLimit from an operator policy", cfg: func(c Config) Config { c.RequeueLimit = 4; return c }, id: "m",
			headers: amqp.Table{idemq.HeaderDeliveryCount: int64(2)}, err: idemq.RequeueInPlace(time.Second, "in-flight", transient), run: 1,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeDeferred, to: "q", reason: "in-flight", requeues: 1}},
		// A policy's delivery-limit, read by the consumer from the
		// management API: the smaller of it and RequeueLimit counts.
		{name: "in place, broker limit 4 from a policy, count 2: republished", id: "m", queueLimit: 4,
			headers: amqp.Table{idemq.HeaderDeliveryCount: int64(2)}, err: idemq.RequeueInPlace(time.Second, "in-flight", transient), run: 1,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeDeferred, to: "q", reason: "in-flight", requeues: 1}},
		{name: "in place, broker limit 4 from a policy, count 1: in place", id: "m", queueLimit: 4,
			headers: amqp.Table{idemq.HeaderDeliveryCount: int64(1)}, err: idemq.RequeueInPlace(time.Second, "in-flight", transient), run: 1,
			want: want{action: idemq.ActionRequeue, outcome: idemq.OutcomeDeferred, delay: time.Second, reason: "in-flight"}},
		{name: "in place, broker limit above RequeueLimit: RequeueLimit counts", id: "m", queueLimit: 50,
			headers: amqp.Table{idemq.HeaderDeliveryCount: int64(5)}, err: idemq.RequeueInPlace(time.Second, "in-flight", transient), run: 1,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeDeferred, to: "q", reason: "in-flight", requeues: 1}},
		{name: "in place, broker limit 1 (a limit of 0): always republished", id: "m", queueLimit: 1,
			err: idemq.RequeueInPlace(time.Second, "in-flight", transient), headers: amqp.Table{idemq.HeaderDeliveryCount: int64(0)}, run: 1,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeDeferred, to: "q", reason: "in-flight", requeues: 1}},
		{name: "unavailable, broker limit 4, count 2: republished, not an attempt", id: "m", queueLimit: 4,
			headers: amqp.Table{idemq.HeaderDeliveryCount: int64(2)}, err: unavailable, run: 1,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeUnavailable, to: "q", reason: RequeueUnavailable, requeues: 1}},
		// The attempt count is x-idemq-attempt only: RabbitMQ 4.0 no
		// longer updates x-death on messages republished by clients, and
		// a producer can forge it.
		{name: "x-death absent: attempt from x-idemq-attempt", id: "m", headers: trusted(amqp.Table{idemq.HeaderAttempt: int64(2)}), err: transient, run: 3,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeRetried, to: "q.retry.1000", reason: idemq.ReasonHandlerError, attempt: 3}},
		{name: "x-death count high is ignored", id: "m", headers: trusted(amqp.Table{idemq.HeaderAttempt: int64(1),
			idemq.HeaderDeath: []any{amqp.Table{"count": int64(50), "reason": "expired", "queue": "q.retry.100"}}}), err: transient, run: 3,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeRetried, to: "q.retry.100", reason: idemq.ReasonHandlerError, attempt: 2}},
		{name: "x-death count low does not extend attempts", id: "m", headers: trusted(amqp.Table{idemq.HeaderAttempt: int64(3),
			idemq.HeaderDeath: []any{amqp.Table{"count": int64(1), "reason": "expired", "queue": "q.retry.100"}}}), err: transient, run: 3,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeDeadLettered, to: "q.dlq", reason: idemq.ReasonMaxAttempts}},
		{name: "x-death alone (no own header) counts as attempt 1", id: "m", headers: amqp.Table{
			idemq.HeaderDeath: []any{amqp.Table{"count": int64(7), "reason": "rejected", "queue": "q"}}}, err: transient, run: 3,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeRetried, to: "q.retry.100", reason: idemq.ReasonHandlerError, attempt: 2}},
		{name: "requeue without an ID waits in place", id: "", err: idemq.Requeue(time.Second, "later", transient), run: 1,
			want: want{action: idemq.ActionRequeue, outcome: idemq.OutcomeDeferred, delay: time.Second, reason: "later"}},
		{name: "requeue without delays waits in place", cfg: func(c Config) Config { c.Delays = []time.Duration{}; return c }, id: "m",
			err: idemq.Requeue(time.Second, "later", transient), run: 1,
			want: want{action: idemq.ActionRequeue, outcome: idemq.OutcomeDeferred, delay: time.Second, reason: "later"}},
		{name: "requeue without a sender waits in place", cfg: func(c Config) Config { c.Sender = nil; return c }, id: "m",
			err: idemq.Requeue(time.Second, "later", transient), run: 1,
			want: want{action: idemq.ActionRequeue, outcome: idemq.OutcomeDeferred, delay: time.Second, reason: "later"}},
		{name: "no sender: rejected to the broker", cfg: func(c Config) Config { c.Sender = nil; return c }, id: "m", err: transient, run: 3,
			want: want{action: idemq.ActionReject, outcome: idemq.OutcomeRejected, reason: idemq.ReasonHandlerError}},
		{name: "no sender, permanent: rejected", cfg: func(c Config) Config { c.Sender = nil; return c }, id: "m", err: idemq.Permanent(transient), run: 1,
			want: want{action: idemq.ActionReject, outcome: idemq.OutcomeRejected, reason: idemq.ReasonPermanent}},
		{name: "no sender, cut at the consumer timeout: given back", cfg: func(c Config) Config { c.Sender = nil; return c }, id: "m", err: ctCut, run: 3,
			want: want{action: idemq.ActionRequeue, outcome: idemq.OutcomeDeferred, reason: "consumer-timeout"}},
		{name: "no DLQ: rejected, counted", cfg: func(c Config) Config {
			return ForTopology(topology.Queue{Name: "q", DLQ: "-", RetryDelays: c.Delays}, c)
		}, id: "m", err: idemq.Permanent(transient), run: 1,
			want: want{action: idemq.ActionReject, outcome: idemq.OutcomeRejected, reason: idemq.ReasonPermanent, counter: CountNoDeadLetterQueue}},
		{name: "no delays: straight to the DLQ", cfg: func(c Config) Config { c.Delays = []time.Duration{}; c.MaxAttempts = 0; return c },
			id: "m", err: transient, run: 3,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeDeadLettered, to: "q.dlq", reason: idemq.ReasonMaxAttempts}},
		{name: "one quick attempt: retried at once", cfg: func(c Config) Config { c.QuickAttempts = 1; return c }, id: "m", err: transient, run: 1,
			want: want{action: idemq.ActionPublish, outcome: idemq.OutcomeRetried, to: "q.retry.100", reason: idemq.ReasonHandlerError, attempt: 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(&scripted{})
			if tt.cfg != nil {
				cfg = tt.cfg(cfg)
			}
			p := mustNew(t, cfg)
			h := amqp.Table{"own": "kept"}
			for k, v := range tt.headers {
				h[k] = v
			}
			d := &idemq.Delivery{MessageID: tt.id, Queue: "q", Group: "g", Exchange: tt.exchange, RoutingKey: "q", Headers: h, Body: []byte("b"),
				QueueDeliveryLimit: tt.queueLimit}
			if dec, ok := p.Admit(d); !ok {
				t.Fatalf("not admitted: %v", dec)
			}
			dec := p.Decide(d, idemq.Run{Err: tt.err, N: tt.run, Stopping: tt.stopping})
			w := tt.want
			if dec.Action != w.action || (w.action != idemq.ActionRunAgain && dec.Outcome != w.outcome) {
				t.Fatalf("decision %v (err %v), want %v/%v", dec, dec.Err, w.action, w.outcome)
			}
			if (w.action == idemq.ActionRunAgain || w.action == idemq.ActionRequeue) && dec.Delay != w.delay {
				t.Errorf("delay %v, want %v", dec.Delay, w.delay)
			}
			if dec.Reason != w.reason {
				t.Errorf("reason %q, want %q", dec.Reason, w.reason)
			}
			if w.counter != "" && (len(dec.Counters) != 1 || dec.Counters[0] != w.counter) {
				t.Errorf("counters %v, want [%s]", dec.Counters, w.counter)
			}
			if w.action != idemq.ActionPublish {
				if dec.Message != nil {
					t.Errorf("a %v decision carries a message to %q", dec.Action, dec.Message.RoutingKey)
				}
				return
			}
			m := dec.Message
			if m == nil || dec.Sender == nil {
				t.Fatalf("publish decision without a message or sender: %v", dec)
			}
			if m.RoutingKey != w.to || m.Exchange != "" {
				t.Errorf("published to %q/%q, want the default exchange/%q", m.Exchange, m.RoutingKey, w.to)
			}
			if idemq.ValidateID(m.ID) != nil || (w.freshID == (m.ID == tt.id)) {
				t.Errorf("message ID %q (delivery's %q, fresh wanted: %v)", m.ID, tt.id, w.freshID)
			}
			if w.freshID && tt.id != "" && m.Headers[idemq.HeaderOriginalMessageID] != tt.id {
				t.Errorf("original ID header %v, want %q", m.Headers[idemq.HeaderOriginalMessageID], tt.id)
			}
			if m.Headers["own"] != "kept" || string(m.Body) != "b" {
				t.Errorf("own header or body lost: %v %q", m.Headers, m.Body)
			}
			if _, ok := m.Headers[idemq.HeaderDeliveryCount]; ok {
				t.Error("x-delivery-count republished")
			}
			if n, _ := headerval.Count(m.Headers[idemq.HeaderAttempt]); n != w.attempt {
				t.Errorf("x-idemq-attempt %v, want %d", m.Headers[idemq.HeaderAttempt], w.attempt)
			}
			if n, _ := headerval.Count(m.Headers[idemq.HeaderRequeues]); n != w.requeues {
				t.Errorf("x-idemq-requeues %v, want %d", m.Headers[idemq.HeaderRequeues], w.requeues)
			}
			if m.Headers[idemq.HeaderQueue] != "q" {
				t.Errorf("x-idemq-queue %v, want q (the retry path's marker)", m.Headers[idemq.HeaderQueue])
			}
			if got := m.Headers[idemq.HeaderOriginalExchange]; got != tt.exchange {
				t.Errorf("original exchange %v, want the delivery's own %q", got, tt.exchange)
			}
			if dec.Outcome == idemq.OutcomeDeadLettered {
				if m.Headers[idemq.HeaderReason] != w.reason || m.Headers[idemq.HeaderDeadLetteredAt] != testNow.Format(headerval.TimeFormat) {
					t.Errorf("dead letter headers %v", m.Headers)
				}
				if _, ok := m.Headers[idemq.HeaderAttempt]; ok {
					t.Error("a dead letter carries x-idemq-attempt")
				}
			}
		})
	}
}

func TestAdmit(t *testing.T) {
	p := mustNew(t, testConfig(&scripted{}))
	t.Run("delivery limit reached: dead-lettered before running", func(t *testing.T) {
		d := &idemq.Delivery{MessageID: "m", Queue: "q", RoutingKey: "q", Headers: amqp.Table{idemq.HeaderDeliveryCount: int64(10)}}
		dec, ok := p.Admit(d)
		if ok || dec.Action != idemq.ActionPublish || dec.Outcome != idemq.OutcomeDeadLettered ||
			dec.Reason != idemq.ReasonDeliveryLimit || dec.Message.RoutingKey != "q.dlq" {
			t.Fatalf("admitted %v: %v", ok, dec)
		}
	})
	t.Run("below the limit: admitted", func(t *testing.T) {
		d := &idemq.Delivery{MessageID: "m", Queue: "q", RoutingKey: "q", Headers: amqp.Table{idemq.HeaderDeliveryCount: int64(9)}}
		if dec, ok := p.Admit(d); !ok {
			t.Fatalf("not admitted: %v", dec)
		}
	})
	// The broker's own limit (a policy's, read from the management API)
	// is below the declared 10: the check acts one delivery before the
	// broker would drop the message without idemq's headers.
	for _, tt := range []struct {
		name       string
		cfgLimit   int
		queueLimit int
		count      int64
		admitted   bool
	}{
		{"broker limit lower, reached", 10, 4, 4, false},
		{"broker limit lower, below", 10, 4, 3, true},
		{"broker limit higher: the declared one counts", 10, 30, 10, false},
		{"no declared limit, broker's reached", 0, 4, 4, false},
		{"no limit at all", 0, 0, 100, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(&scripted{})
			cfg.DeliveryLimit = tt.cfgLimit
			p := mustNew(t, cfg)
			d := &idemq.Delivery{MessageID: "m", Queue: "q", RoutingKey: "q", QueueDeliveryLimit: tt.queueLimit,
				Headers: amqp.Table{idemq.HeaderDeliveryCount: tt.count}}
			dec, ok := p.Admit(d)
			if ok != tt.admitted || !ok && dec.Reason != idemq.ReasonDeliveryLimit {
				t.Fatalf("admitted %v (%v), want %v", ok, dec, tt.admitted)
			}
		})
	}
	t.Run("forged headers dropped, trusted kept", func(t *testing.T) {
		forged := &idemq.Delivery{MessageID: "m", Queue: "q", Exchange: "orders", RoutingKey: "new",
			Headers: amqp.Table{idemq.HeaderAttempt: int64(3), idemq.HeaderQueue: "q", idemq.HeaderOriginalExchange: "evil", "own": 1}}
		p.Admit(forged)
		if len(forged.Headers) != 1 || forged.Headers["own"] != 1 {
			t.Fatalf("forged headers kept: %v", forged.Headers)
		}
		ours := &idemq.Delivery{MessageID: "m", Queue: "q", RoutingKey: "q",
			Headers: amqp.Table{idemq.HeaderAttempt: int64(3), idemq.HeaderQueue: "q"}}
		p.Admit(ours)
		if Attempt(ours.Headers) != 3 {
			t.Fatalf("trusted headers dropped: %v", ours.Headers)
		}
	})
}

// carry does what the consumer's executor does with a decision, against a
// scripted Sender: publish, and on failure ask PublishFailed, until the
// decision settles.
func carry(p *Policy, d *idemq.Delivery, dec idemq.Decision) idemq.Decision {
	for i := 0; dec.Action == idemq.ActionPublish && i < 10; i++ {
		err := dec.Sender.Publish(context.Background(), *dec.Message)
		if err == nil {
			return dec
		}
		dec = p.PublishFailed(d, dec, err)
	}
	return dec
}

func tooLarge() error {
	return fmt.Errorf("idemq: publish %q: %w: 140000 bytes, frame_max 131072", "m-1", idemq.ErrMessageTooLarge)
}

func unroutable() error {
	return &idemq.ReturnedError{MessageID: "m-1", ReplyCode: 312, ReplyText: "NO_ROUTE"}
}

func TestPublishFailed(t *testing.T) {
	transient := errors.New("flaky")
	type want struct {
		action    idemq.Action // the settled decision
		outcome   idemq.Outcome
		delay     time.Duration
		publishes []string
		minimal   bool // the last publish carries only reason+attempts
		counter   string
	}
	tests := []struct {
		name    string
		noDLQ   bool
		id      string
		handler error
		attempt int64
		errs    []error
		want    want
	}{
		{"retry ok", false, "m-1", transient, 0, nil,
			want{idemq.ActionPublish, idemq.OutcomeRetried, 0, []string{"q.retry.100"}, false, ""}},
		{"retry transient failure: waits in place", false, "m-1", transient, 0, []error{errors.New("connection reset")},
			want{idemq.ActionRequeue, idemq.OutcomeDeferred, time.Second, []string{"q.retry.100"}, false, ""}},
		{"retry too large, dead letter fits", false, "m-1", transient, 0, []error{tooLarge()},
			want{idemq.ActionPublish, idemq.OutcomeDeadLettered, 0, []string{"q.retry.100", "q.dlq"}, false, ""}},
		{"retry too large, dead letter too large, minimal fits", false, "m-1", transient, 0, []error{tooLarge(), tooLarge()},
			want{idemq.ActionPublish, idemq.OutcomeDeadLettered, 0, []string{"q.retry.100", "q.dlq", "q.dlq"}, true, ""}},
		{"nothing fits", false, "m-1", transient, 0, []error{tooLarge(), tooLarge(), tooLarge()},
			want{idemq.ActionReject, idemq.OutcomeRejected, 0, []string{"q.retry.100", "q.dlq", "q.dlq"}, true, CountUnpublishable}},
		{"retry queue and DLQ unroutable: held in the retry queue", false, "m-1", transient, 0, []error{unroutable(), unroutable()},
			want{idemq.ActionPublish, idemq.OutcomeDeferred, 0, []string{"q.retry.100", "q.dlq", "q.retry.100"}, false, CountDeadLetterHeld}},
		{"DLQ unroutable: held in the retry queue", false, "m-1", idemq.Permanent(transient), 0, []error{unroutable()},
			want{idemq.ActionPublish, idemq.OutcomeDeferred, 0, []string{"q.dlq", "q.retry.100"}, false, CountDeadLetterHeld}},
		{"DLQ and retry queue unroutable: held in the work queue", false, "m-1", idemq.Permanent(transient), 0, []error{unroutable(), unroutable()},
			want{idemq.ActionPublish, idemq.OutcomeDeferred, 0, []string{"q.dlq", "q.retry.100", "q"}, false, CountDeadLetterHeld}},
		{"everything unroutable: waits in place", false, "m-1", idemq.Permanent(transient), 0, []error{unroutable(), unroutable(), unroutable()},
			want{idemq.ActionRequeue, idemq.OutcomeDeferred, time.Second, []string{"q.dlq", "q.retry.100", "q"}, false, ""}},
		{"no DLQ configured, DLQ unroutable is not the question", true, "m-1", idemq.Permanent(transient), 0, []error{unroutable()},
			want{idemq.ActionReject, idemq.OutcomeRejected, 0, nil, false, CountNoDeadLetterQueue}},
		{"invalid headers", false, "m-1", idemq.Permanent(transient), 0,
			[]error{fmt.Errorf("%w: bad type", idemq.ErrInvalidHeaders)},
			want{idemq.ActionReject, idemq.OutcomeRejected, 0, []string{"q.dlq"}, false, CountUnpublishable}},
		{"dead letter transient failure: waits in place", false, "m-1", idemq.Permanent(transient), 0, []error{errors.New("timeout")},
			want{idemq.ActionRequeue, idemq.OutcomeDeferred, time.Second, []string{"q.dlq"}, false, ""}},
		{"no ID: dead-lettered, not retried", false, "", transient, 0, nil,
			want{idemq.ActionPublish, idemq.OutcomeDeadLettered, 0, []string{"q.dlq"}, false, ""}},
		{"no DLQ", true, "m-1", idemq.Permanent(transient), 0, nil,
			want{idemq.ActionReject, idemq.OutcomeRejected, 0, nil, false, CountNoDeadLetterQueue}},
		{"no DLQ after max attempts", true, "m-1", transient, 2, nil,
			want{idemq.ActionReject, idemq.OutcomeRejected, 0, nil, false, CountNoDeadLetterQueue}},
		{"deferral, unroutable: waits in place, never dead-lettered", false, "m-1", idemq.Requeue(300*time.Millisecond, "later", transient), 0,
			[]error{unroutable()}, want{idemq.ActionRequeue, idemq.OutcomeDeferred, 300 * time.Millisecond, []string{"q.retry.100"}, false, ""}},
		{"deferral, transient: waits in place", false, "m-1", idemq.Requeue(300*time.Millisecond, "later", transient), 0,
			[]error{errors.New("timeout")}, want{idemq.ActionRequeue, idemq.OutcomeDeferred, 300 * time.Millisecond, []string{"q.retry.100"}, false, ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &scripted{errs: tt.errs}
			cfg := Config{Sender: s, QuickAttempts: 1, Delays: []time.Duration{100 * time.Millisecond}}
			if tt.noDLQ {
				cfg = ForTopology(topology.Queue{Name: "q", DLQ: "-", RetryDelays: cfg.Delays}, cfg)
			}
			p := mustNew(t, cfg)
			h := amqp.Table{"own": "kept"}
			if tt.attempt > 0 {
				h[idemq.HeaderAttempt] = tt.attempt
				h[idemq.HeaderQueue] = "q"
			}
			d := &idemq.Delivery{MessageID: tt.id, Queue: "q", RoutingKey: "q", Headers: h, Body: []byte("b")}
			p.Admit(d)
			dec := carry(p, d, p.Decide(d, idemq.Run{Err: tt.handler, N: 1}))
			if dec.Action != tt.want.action || dec.Outcome != tt.want.outcome {
				t.Fatalf("settled on %v (err %v), want %v/%v", dec, dec.Err, tt.want.action, tt.want.outcome)
			}
			if dec.Action == idemq.ActionRequeue && dec.Delay != tt.want.delay {
				t.Errorf("waits %v, want %v", dec.Delay, tt.want.delay)
			}
			var keys []string
			for _, m := range s.got {
				keys = append(keys, m.RoutingKey)
				if idemq.ValidateID(m.ID) != nil {
					t.Errorf("published with ID %q", m.ID)
				}
				if m.Headers["own"] != "kept" {
					t.Errorf("own header lost: %v", m.Headers)
				}
			}
			if strings.Join(keys, ",") != strings.Join(tt.want.publishes, ",") {
				t.Fatalf("published to %v, want %v", keys, tt.want.publishes)
			}
			if n := len(s.got); n > 0 {
				last := s.got[n-1].Headers
				_, hasErr := last[idemq.HeaderError]
				if tt.want.minimal == hasErr && s.got[n-1].RoutingKey == "q.dlq" {
					t.Errorf("last publish headers %v (minimal %v)", last, tt.want.minimal)
				}
				if tt.want.minimal && (last[idemq.HeaderReason] == nil || last[idemq.HeaderAttempts] == nil) {
					t.Errorf("minimal dead letter lacks reason or attempts: %v", last)
				}
			}
			if tt.want.counter != "" && (len(dec.Counters) != 1 || dec.Counters[0] != tt.want.counter) {
				t.Errorf("counters %v, want [%s]", dec.Counters, tt.want.counter)
			}
		})
	}
}

// A dead letter the broker could not route is held back, marked, and
// dead-lettered again when it comes back, before the handler runs, with
// the reason and error it failed with. Held again, it waits in place while
// its delivery count allows; past half the limit it is republished to the
// work queue, still marked. A marker a producer set is not trusted.
func TestHeldDeadLetterComesBackAsADeadLetter(t *testing.T) {
	s := &scripted{errs: []error{unroutable()}}
	p := mustNew(t, Config{Sender: s, QuickAttempts: 1, Delays: []time.Duration{100 * time.Millisecond, 2 * time.Second},
		DeliveryLimit: 10, Now: func() time.Time { return testNow }})
	d := &idemq.Delivery{MessageID: "m-1", Queue: "q", RoutingKey: "q", Headers: amqp.Table{"own": "kept"}, Body: []byte("b")}
	p.Admit(d)
	dec := carry(p, d, p.Decide(d, idemq.Run{Err: idemq.Reject("bad-amount", errors.New("bad amount")), N: 1}))
	if dec.Action != idemq.ActionPublish || dec.Outcome != idemq.OutcomeDeferred || dec.Reason != RequeueDeadLetterHeld {
		t.Fatalf("settled on %v, want a held publish", dec)
	}
	// The hold waits in the smallest retry queue of at least PublishRetryAfter (1s).
	held := s.got[1]
	if held.RoutingKey != "q.retry.2000" || held.Headers[idemq.HeaderDeadLetterHeld] != "bad-amount" ||
		held.Headers[idemq.HeaderQueue] != "q" || held.Headers["own"] != "kept" {
		t.Fatalf("held message to %q headers %v", held.RoutingKey, held.Headers)
	}
	errClass := held.Headers[idemq.HeaderErrorClass]
	lastFailure := held.Headers[idemq.HeaderLastFailure]

	// It comes back from the retry queue: dead-lettered before any handler run.
	back := func(h amqp.Table) *idemq.Delivery {
		c := amqp.Table{}
		for k, v := range h {
			c[k] = v
		}
		return &idemq.Delivery{MessageID: "m-1", Queue: "q", RoutingKey: "q", Headers: c, Body: []byte("b")}
	}
	p.cfg.Now = func() time.Time { return testNow.Add(time.Hour) }
	d2 := back(held.Headers)
	dl, ok := p.Admit(d2)
	if ok || dl.Action != idemq.ActionPublish || dl.Outcome != idemq.OutcomeDeadLettered || dl.Reason != "bad-amount" {
		t.Fatalf("Admit of a held delivery: ok %v, %v", ok, dl)
	}
	h := dl.Message.Headers
	if dl.Message.RoutingKey != "q.dlq" || h[idemq.HeaderReason] != "bad-amount" || h[idemq.HeaderErrorClass] != errClass ||
		h[idemq.HeaderLastFailure] != lastFailure || !strings.Contains(fmt.Sprint(h[idemq.HeaderError]), "bad amount") ||
		h["own"] != "kept" {
		t.Fatalf("dead letter to %q headers %v", dl.Message.RoutingKey, h)
	}
	if _, marked := h[idemq.HeaderDeadLetterHeld]; marked {
		t.Fatalf("the dead letter still carries %s", idemq.HeaderDeadLetterHeld)
	}

	// Still unroutable: it waits in place (the marker stays on the message).
	s.errs, s.got = []error{unroutable()}, nil
	again := carry(p, d2, dl)
	if again.Action != idemq.ActionRequeue || again.Delay != time.Second || again.Reason != RequeueDeadLetterHeld ||
		len(again.Counters) != 1 || again.Counters[0] != CountDeadLetterHeld {
		t.Fatalf("held again: %v (counters %v), want in place after 1s", again, again.Counters)
	}
	// Past half the delivery limit: republished to the work queue, marked.
	d3 := back(held.Headers)
	d3.Headers[idemq.HeaderDeliveryCount] = int64(5)
	dl3, _ := p.Admit(d3)
	s.errs, s.got = []error{unroutable()}, nil
	if out := carry(p, d3, dl3); out.Action != idemq.ActionPublish || len(s.got) != 2 || s.got[1].RoutingKey != "q" ||
		s.got[1].Headers[idemq.HeaderDeadLetterHeld] != "bad-amount" {
		t.Fatalf("past half the limit: %v, published %v", out, s.got)
	}

	// A producer's marker is dropped: the delivery runs.
	forged := &idemq.Delivery{MessageID: "m-2", Queue: "q", RoutingKey: "q", Exchange: "ingress",
		Headers: amqp.Table{idemq.HeaderDeadLetterHeld: "rejected", idemq.HeaderQueue: "q", idemq.HeaderRequeues: int64(1)}}
	if _, ok := p.Admit(forged); !ok {
		t.Fatal("a forged hold marker dead-lettered the delivery")
	}
}

// What the policy adds to a message is bounded whatever the handler's
// error, the configured limit or a (trusted-path) inbound header says.
func TestAddedHeadersAreBounded(t *testing.T) {
	huge := strings.Repeat("é", 200_000)
	p := mustNew(t, Config{Sender: &scripted{}, QuickAttempts: 1, Delays: []time.Duration{}, ErrorTextLimit: 1 << 20})
	d := &idemq.Delivery{MessageID: "m-1", Queue: "q", RoutingKey: "q", Group: strings.Repeat("g", 10_000),
		Headers: amqp.Table{idemq.HeaderQueue: "q", idemq.HeaderRequeues: int64(1), idemq.HeaderOriginalExchange: huge,
			idemq.HeaderOriginalRoutingKey: []byte(huge), idemq.HeaderFirstFailure: huge, idemq.HeaderReplayedAt: amqp.Table{"a": huge}}}
	p.Admit(d)
	dec := p.Decide(d, idemq.Run{Err: idemq.Permanent(errors.New(huge)), N: 1})
	if dec.Action != idemq.ActionPublish {
		t.Fatalf("decision %v", dec)
	}
	total := 0
	for k, v := range dec.Message.Headers {
		s, ok := v.(string)
		if !ok {
			if _, isInt := v.(int64); !isInt {
				t.Errorf("header %s has type %T", k, v)
			}
			continue
		}
		total += len(k) + len(s)
	}
	if total > MaxErrorTextLimit+20*maxHeaderText {
		t.Fatalf("the policy added %d bytes of headers", total)
	}
	t.Logf("headers added: %d bytes", total)
}

func TestValidate(t *testing.T) {
	q := topology.Queue{Name: "orders", RetryDelays: []time.Duration{100 * time.Millisecond, time.Second}}
	tests := []struct {
		name string
		cfg  Config
		want string // "" = valid
	}{
		{"defaults", Config{}, ""},
		{"for topology", ForTopology(q, Config{}), ""},
		{"for topology, subset of delays", ForTopology(q, Config{Delays: []time.Duration{time.Second}}), ""},
		{"delay without retry queue", ForTopology(q, Config{Delays: []time.Duration{250 * time.Millisecond}}),
			`retry queue "orders.retry.250"`},
		{"no retry queues", ForTopology(topology.Queue{Name: "orders", NoRetry: true}, Config{Delays: []time.Duration{time.Second}}),
			`retry queue "orders.retry.1000"`},
		{"DLQ the topology lacks", ForTopology(topology.Queue{Name: "orders", DLQ: "-"},
			Config{DeadLetterQueue: topology.DLQName}), `declares none`},
		{"other DLQ", ForTopology(q, Config{DeadLetterQueue: func(string) string { return "elsewhere" }}), `declares "orders.dlq"`},
		{"non-positive delay", Config{Delays: []time.Duration{0}}, "must be positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if _, err := New(tt.cfg); err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want ErrInvalidConfig mentioning %s", err, tt.want)
			}
			if _, err2 := New(tt.cfg); err2 == nil {
				t.Fatal("New accepted it")
			}
			t.Log(err)
		})
	}
}
