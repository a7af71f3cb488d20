package retry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/topology"
)

// These tests drive the policy's reaction to each republish error with a
// scripted publish function: what the broker or the publisher does is
// tested against the real broker in policy_test.go and loop_test.go; here
// only the decision is, for errors that are hard to provoke on demand
// (idemq.ErrMessageTooLarge comes from the publisher's own size check).

type scripted struct {
	errs []error // one per publish; nil past the end
	got  []idemq.Message
}

func (s *scripted) publish(_ context.Context, m idemq.Message) error {
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

func newTestPolicy(cfg Config, pub *scripted, h idemq.HandlerFunc) *policy {
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.defaults()
	return &policy{cfg: cfg, next: h, pub: pub.publish}
}

func tooLarge() error {
	return fmt.Errorf("idemq: publish %q: %w: 140000 bytes, frame_max 131072", "m-1", idemq.ErrMessageTooLarge)
}

func unroutable() error {
	return &idemq.ReturnedError{MessageID: "m-1", ReplyCode: 312, ReplyText: "NO_ROUTE"}
}

func TestPolicyReactionToRepublishErrors(t *testing.T) {
	transient := errors.New("flaky")
	type want struct {
		ret       string // "nil", "reject", "requeue"
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
		{"retry ok", false, "m-1", transient, 0, nil, want{"nil", []string{"q.retry.100"}, false, ""}},
		{"retry transient failure", false, "m-1", transient, 0, []error{errors.New("connection reset")},
			want{"requeue", []string{"q.retry.100"}, false, ""}},
		{"retry too large, dead letter fits", false, "m-1", transient, 0, []error{tooLarge()},
			want{"nil", []string{"q.retry.100", "q.dlq"}, false, ""}},
		{"retry too large, dead letter too large, minimal fits", false, "m-1", transient, 0, []error{tooLarge(), tooLarge()},
			want{"nil", []string{"q.retry.100", "q.dlq", "q.dlq"}, true, ""}},
		{"nothing fits", false, "m-1", transient, 0, []error{tooLarge(), tooLarge(), tooLarge()},
			want{"reject", []string{"q.retry.100", "q.dlq", "q.dlq"}, true, CountUnpublishable}},
		{"retry queue and DLQ unroutable", false, "m-1", transient, 0, []error{unroutable(), unroutable()},
			want{"reject", []string{"q.retry.100", "q.dlq"}, false, CountUnpublishable}},
		{"invalid headers", false, "m-1", idemq.Permanent(transient), 0,
			[]error{fmt.Errorf("%w: bad type", idemq.ErrInvalidHeaders)},
			want{"reject", []string{"q.dlq"}, false, CountUnpublishable}},
		{"dead letter transient failure", false, "m-1", idemq.Permanent(transient), 0, []error{errors.New("timeout")},
			want{"requeue", []string{"q.dlq"}, false, ""}},
		{"no ID: dead-lettered, not retried", false, "", transient, 0, nil, want{"nil", []string{"q.dlq"}, false, ""}},
		{"no DLQ", true, "m-1", idemq.Permanent(transient), 0, nil, want{"reject", nil, false, CountNoDeadLetterQueue}},
		{"no DLQ after max attempts", true, "m-1", transient, 2, nil, want{"reject", nil, false, CountNoDeadLetterQueue}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{QuickAttempts: 1, Delays: []time.Duration{100 * time.Millisecond}}
			if tt.noDLQ {
				cfg = ForTopology(topology.Queue{Name: "q", DLQ: "-", RetryDelays: cfg.Delays}, cfg)
			}
			pub := &scripted{errs: tt.errs}
			p := newTestPolicy(cfg, pub, func(context.Context, *idemq.Delivery) error { return tt.handler })
			h := amqp.Table{"own": "kept"}
			if tt.attempt > 0 {
				h[idemq.HeaderAttempt] = tt.attempt
				h[idemq.HeaderQueue] = "q"
			}
			d := &idemq.Delivery{MessageID: tt.id, Queue: "q", RoutingKey: "q", Headers: h, Body: []byte("b")}
			var rec idemq.Counters
			err := p.Handle(idemq.WithRecorder(context.Background(), &rec), d)
			var rq *idemq.RequeueError
			var rj *idemq.RejectError
			switch {
			case tt.want.ret == "nil" && err != nil,
				tt.want.ret == "reject" && !errors.As(err, &rj),
				tt.want.ret == "requeue" && !errors.As(err, &rq):
				t.Fatalf("returned %v, want %s", err, tt.want.ret)
			}
			var keys []string
			for _, m := range pub.got {
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
			if n := len(pub.got); n > 0 {
				last := pub.got[n-1].Headers
				_, hasErr := last[idemq.HeaderError]
				if tt.want.minimal == hasErr {
					t.Errorf("last publish headers %v (minimal %v)", last, tt.want.minimal)
				}
				if tt.want.minimal && (last[idemq.HeaderReason] == nil || last[idemq.HeaderAttempts] == nil) {
					t.Errorf("minimal dead letter lacks reason or attempts: %v", last)
				}
			}
			if tt.want.counter != "" && rec.Get(tt.want.counter) != 1 {
				t.Errorf("counter %s = %d, want 1 (%v)", tt.want.counter, rec.Get(tt.want.counter), rec.Snapshot())
			}
		})
	}
}

// What the policy adds to a message is bounded whatever the handler's
// error, the configured limit or a (trusted-path) inbound header says.
func TestAddedHeadersAreBounded(t *testing.T) {
	huge := strings.Repeat("é", 200_000)
	pub := &scripted{}
	p := newTestPolicy(Config{QuickAttempts: 1, Delays: []time.Duration{}, ErrorTextLimit: 1 << 20}, pub,
		func(context.Context, *idemq.Delivery) error { return idemq.Permanent(errors.New(huge)) })
	d := &idemq.Delivery{MessageID: "m-1", Queue: "q", RoutingKey: "q", Group: strings.Repeat("g", 10_000),
		Headers: amqp.Table{idemq.HeaderQueue: "q", idemq.HeaderRequeues: int64(1), idemq.HeaderOriginalExchange: huge,
			idemq.HeaderOriginalRoutingKey: []byte(huge), idemq.HeaderFirstFailure: huge, idemq.HeaderReplayedAt: amqp.Table{"a": huge}}}
	if err := p.Handle(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	if len(pub.got) != 1 {
		t.Fatalf("%d publishes", len(pub.got))
	}
	total := 0
	for k, v := range pub.got[0].Headers {
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
				if _, err := NewPolicy(tt.cfg); err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want ErrConfig mentioning %s", err, tt.want)
			}
			if _, err2 := NewPolicy(tt.cfg); err2 == nil {
				t.Fatal("NewPolicy accepted it")
			}
			t.Log(err)
		})
	}
}
