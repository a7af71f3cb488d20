package bloom_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup/bloom"
)

type nopSender struct{}

func (nopSender) Publish(context.Context, idemq.Message) error { return nil }

// The router's decisions, without a broker: a suspected duplicate is
// published to the suspected-duplicate queue (then acked), a failed publish
// waits in place, every other case is the wrapped policy's.
func TestRouterDecisions(t *testing.T) {
	r, err := bloom.NewRouter(bloom.RouterConfig{Sender: nopSender{}, RetryAfter: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	suspect := idemq.Reject(idemq.ReasonSuspectedDuplicate, fmt.Errorf("dedup: %w", &bloom.SuspectedDuplicateError{Key: "idemq:g:m-1"}))
	d := &idemq.Delivery{MessageID: "m-1", Queue: "q", Exchange: "shop", RoutingKey: "order.created",
		Headers: amqp.Table{"own": "kept"}, Body: []byte("b")}

	dec := r.Decide(d, idemq.Run{Err: suspect, N: 1})
	m := dec.Message
	if dec.Action != idemq.ActionPublish || dec.Outcome != idemq.OutcomeRouted || m == nil || m.RoutingKey != "q.suspected" ||
		len(dec.Counters) != 1 || dec.Counters[0] != bloom.CountSuspectedRouted {
		t.Fatalf("suspect: %v counters %v", dec, dec.Counters)
	}
	if m.ID != "m-1" || m.Headers["own"] != "kept" || m.Headers[idemq.HeaderReason] != idemq.ReasonSuspectedDuplicate ||
		m.Headers[idemq.HeaderDedupKey] != "idemq:g:m-1" || m.Headers[idemq.HeaderOriginalQueue] != "q" ||
		m.Headers[idemq.HeaderOriginalExchange] != "shop" || m.Headers[idemq.HeaderOriginalRoutingKey] != "order.created" {
		t.Fatalf("suspect copy %+v", m)
	}
	if back := r.PublishFailed(d, dec, errors.New("connection reset")); back.Action != idemq.ActionRequeue || back.Delay != 3*time.Second ||
		back.Reason != bloom.RequeueSuspectPublish {
		t.Fatalf("failed suspect publish: %v", back)
	}
	if dec := r.Decide(d, idemq.Run{Err: suspect, N: 1, Stopping: true}); dec.Action != idemq.ActionRequeue || dec.Outcome != idemq.OutcomeStopped {
		t.Fatalf("stopping: %v, want the wrapped policy's give-back", dec)
	}
	if dec := r.Decide(d, idemq.Run{Err: errors.New("boom"), N: 1}); dec.Action != idemq.ActionReject {
		t.Fatalf("another error: %v, want the wrapped (base) policy's reject", dec)
	}
	if dec := r.Decide(d, idemq.Run{N: 1}); dec.Action != idemq.ActionAck || dec.Outcome != idemq.OutcomeProcessed {
		t.Fatalf("success: %v", dec)
	}
	if _, err := bloom.NewRouter(bloom.RouterConfig{}); !errors.Is(err, bloom.ErrInvalidConfig) {
		t.Fatalf("no sender: %v", err)
	}
}
