package topology_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/topology"
)

func TestForQueue(t *testing.T) {
	p := topology.ForQueue(topology.Queue{Name: "orders", Type: topology.Quorum,
		RetryDelays: []time.Duration{time.Second, 100 * time.Millisecond, time.Second}})
	if p.DLQ != "orders.dlq" || p.DeliveryLimit != topology.DefaultDeliveryLimit {
		t.Fatalf("plan %+v", p)
	}
	if p.Args[topology.ArgDLRoutingKey] != "orders.dlq" || p.Args[topology.ArgDeliveryLimit] != int64(20) || p.Args[topology.ArgQueueType] != "quorum" {
		t.Fatalf("work args %v", p.Args)
	}
	if len(p.Delays) != 3 || len(p.Retries) != 2 || p.Retries[0].Name != "orders.retry.100" || p.Retries[1].Name != "orders.retry.1000" {
		t.Fatalf("retries %+v", p.Retries)
	}
	// Released by the consumers (the default route): no TTL, no
	// dead-letter route, a delivery limit nothing reaches.
	if p.RetryRoute != topology.RouteRelease || len(p.Retries[0].Args) != 2 || p.Retries[0].Args[topology.ArgQueueType] != "quorum" ||
		p.Retries[0].Args[topology.ArgDeliveryLimit] != int64(topology.DLQDeliveryLimit) {
		t.Fatalf("retry args %v, route %q", p.Retries[0].Args, p.RetryRoute)
	}
	dl := topology.ForQueue(topology.Queue{Name: "orders", RetryRoute: topology.RouteDeadLetter, RetryDelays: []time.Duration{100 * time.Millisecond}})
	if a := dl.Retries[0].Args; a[topology.ArgMessageTTL] != int64(100) || a[topology.ArgDLRoutingKey] != "orders" ||
		a[topology.ArgDLStrategy] != topology.DLStrategyAtLeastOnce || a[topology.ArgDeliveryLimit] != nil {
		t.Fatalf("dead-letter route retry args %v", a)
	}
	if c := topology.ForQueue(topology.Queue{Name: "c", RetryType: topology.Classic}); len(c.Retries[0].Args) != 1 {
		t.Fatalf("released classic retry args %v", c.Retries[0].Args)
	}
	for _, tt := range []struct {
		d    time.Duration
		want string
	}{{0, "orders.retry.100"}, {100 * time.Millisecond, "orders.retry.100"}, {101 * time.Millisecond, "orders.retry.1000"}, {time.Hour, "orders.retry.1000"}} {
		if r, ok := p.RetryFor(tt.d); !ok || r.Name != tt.want {
			t.Errorf("RetryFor(%v) = %s, want %s", tt.d, r.Name, tt.want)
		}
	}
	c := topology.ForQueue(topology.Queue{Name: "c", DLQ: "-", NoRetry: true})
	if c.DLQ != "" || len(c.Retries) != 0 || c.Args[topology.ArgDLX] != nil || c.DeliveryLimit != 0 {
		t.Fatalf("classic plan %+v", c)
	}
}

func TestLoad(t *testing.T) {
	good := `
exchanges:
  - name: shop
    type: topic
queues:
  - name: orders
    type: quorum
    delivery_limit: 5
    retry_delays: [100ms, 2s]
    args:
      x-max-length: 1000
bindings:
  - exchange: shop
    queue: orders
    routing_key: order.*
`
	top, err := topology.Load(strings.NewReader(good))
	if err != nil {
		t.Fatal(err)
	}
	q, ok := top.Queue("orders")
	if !ok || q.Type != topology.Quorum || q.DeliveryLimit != 5 || len(q.RetryDelays) != 2 || q.RetryDelays[0] != 100*time.Millisecond {
		t.Fatalf("queue %+v", q)
	}
	if p := topology.ForQueue(q); p.Args["x-max-length"] != int64(1000) {
		t.Fatalf("args %v", p.Args)
	}
	bad := []struct{ name, yaml, want string }{
		{"unknown field", "queues:\n  - name: a\n    tpye: quorum\n", "tpye"},
		{"bad type", "queues:\n  - name: a\n    type: stream\n", "unknown type"},
		{"no name", "queues:\n  - type: quorum\n", "name is required"},
		{"bad delay", "queues:\n  - name: a\n    retry_delays: [-1s]\n", "positive"},
		{"undeclared exchange", "bindings:\n  - exchange: nope\n    queue: a\n", "not declared"},
		{"not yaml", "queues: [", "parse YAML"},
	}
	for _, tt := range bad {
		if _, err := topology.Load(strings.NewReader(tt.yaml)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err %v, want it to mention %q", tt.name, err, tt.want)
		}
	}
}

func cleanup(t *testing.T, top topology.Topology) {
	t.Cleanup(func() {
		var names []string
		for _, q := range top.Queues {
			p := topology.ForQueue(q)
			names = append(names, p.Queue, p.DLQ)
			for _, r := range p.Retries {
				names = append(names, r.Name)
			}
		}
		testenv.DeleteQueue(names...)
		ch := testenv.Channel(t)
		for _, e := range top.Exchanges {
			_ = ch.ExchangeDelete(e.Name, false, false)
		}
	})
}

func TestDeclareIdempotentAndRoutes(t *testing.T) {
	ex := testenv.Name(t, "x")
	// The broker's own route back (dead-letter): a message published to
	// the retry queue returns without a consumer releasing it.
	q := topology.Queue{Name: testenv.Name(t, "q"), Type: topology.Quorum, RetryDelays: []time.Duration{100 * time.Millisecond},
		RetryRoute: topology.RouteDeadLetter}
	top := topology.Topology{
		Exchanges: []topology.Exchange{{Name: ex, Type: "topic"}},
		Queues:    []topology.Queue{q},
		Bindings:  []topology.Binding{{Exchange: ex, Queue: q.Name, RoutingKey: "order.*"}},
	}
	cleanup(t, top)
	for i := 0; i < 2; i++ {
		if err := topology.Declare(context.Background(), testenv.Channel(t), top); err != nil {
			t.Fatalf("declare %d: %v", i+1, err)
		}
	}
	// A message in the retry queue comes back to the work queue after its TTL.
	testenv.Publish(t, "", topology.RetryQueueName(q.Name, 100*time.Millisecond), amqp.Publishing{MessageId: "m1"})
	testenv.Publish(t, ex, "order.created", amqp.Publishing{MessageId: "m2"})
	var got []amqp.Delivery
	testenv.Eventually(t, 30*time.Second, "both messages in the work queue", func() bool {
		got = append(got, testenv.Drain(t, q.Name)...)
		return len(got) == 2
	})
	// A nack without requeue lands in the DLQ.
	testenv.Publish(t, "", q.Name, amqp.Publishing{MessageId: "m3"})
	ch := testenv.Channel(t)
	testenv.Eventually(t, 30*time.Second, "m3", func() bool {
		d, ok, err := ch.Get(q.Name, false)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			_ = d.Nack(false, false)
		}
		return ok
	})
	testenv.Eventually(t, 30*time.Second, "m3 in the DLQ", func() bool { n, _ := testenv.QueueCounts(t, topology.DLQName(q.Name)); return n == 1 })
}

func TestDeclareMismatchNamesQueueAndArgument(t *testing.T) {
	name := testenv.Name(t, "q")
	first := topology.Topology{Queues: []topology.Queue{{Name: name, Type: topology.Quorum, DeliveryLimit: 5, NoRetry: true}}}
	cleanup(t, first)
	if err := topology.Declare(context.Background(), testenv.Channel(t), first); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		q    topology.Queue
		arg  string
	}{
		{"delivery limit", topology.Queue{Name: name, Type: topology.Quorum, DeliveryLimit: 7, NoRetry: true}, topology.ArgDeliveryLimit},
		{"queue type", topology.Queue{Name: name, Type: topology.Classic, NoRetry: true}, topology.ArgQueueType},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := topology.Declare(context.Background(), testenv.Channel(t), topology.Topology{Queues: []topology.Queue{tt.q}})
			var me *topology.MismatchError
			if !errors.As(err, &me) || !errors.Is(err, topology.ErrMismatch) {
				t.Fatalf("err %v, want a MismatchError", err)
			}
			if me.Name != name || me.Argument != tt.arg {
				t.Fatalf("mismatch names %q / %q, want %q / %q: %v", me.Name, me.Argument, name, tt.arg, err)
			}
			if !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), tt.arg) {
				t.Fatalf("message does not name the queue and argument: %v", err)
			}
			t.Log(err)
		})
	}
}

// The quorum x-delivery-limit is a backstop even without the retry policy:
// past it the broker dead-letters the message to the DLQ.
func TestQuorumDeliveryLimitBackstop(t *testing.T) {
	q := topology.Queue{Name: testenv.Name(t, "q"), Type: topology.Quorum, DeliveryLimit: 1, NoRetry: true}
	top := topology.Topology{Queues: []topology.Queue{q}}
	cleanup(t, top)
	if err := topology.Declare(context.Background(), testenv.Channel(t), top); err != nil {
		t.Fatal(err)
	}
	testenv.Publish(t, "", q.Name, amqp.Publishing{MessageId: "loop-1"})
	ch := testenv.Channel(t)
	dlq := topology.DLQName(q.Name)
	returns := 0
	testenv.Eventually(t, 30*time.Second, "the broker dead-letters the looping message", func() bool {
		if n, _ := testenv.QueueCounts(t, dlq); n == 1 {
			return true
		}
		d, ok, err := ch.Get(q.Name, false)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			returns++
			_ = d.Nack(false, true)
		}
		return false
	})
	got := testenv.Drain(t, dlq)
	if len(got) != 1 || got[0].MessageId != "loop-1" {
		t.Fatalf("DLQ %v", got)
	}
	t.Logf("dead-lettered by the broker after %d returns; x-death %v", returns, got[0].Headers["x-death"])
	if returns > 3 {
		t.Fatalf("%d returns with x-delivery-limit 1", returns)
	}
}

// Each YAML mistake that used to be accepted (and declared something other
// than what the plan, the retry policy and the operator believed) is now
// rejected with an error that says what to write instead.
func TestLoadRejectsInconsistentQueues(t *testing.T) {
	long := strings.Repeat("n", 250)
	bad := []struct{ name, yaml, want string }{
		{"args x-queue-type overrides type", "queues:\n  - name: a\n    args: {x-queue-type: quorum}\n", `x-queue-type "quorum" contradicts type "classic"`},
		{"args x-queue-type conflicts", "queues:\n  - name: a\n    type: quorum\n    args: {x-queue-type: classic}\n", `contradicts type "quorum"`},
		{"args dead-letter exchange", "queues:\n  - name: a\n    args: {x-dead-letter-exchange: elsewhere}\n", "use dlq"},
		{"args dead-letter routing key", "queues:\n  - name: a\n    args: {x-dead-letter-routing-key: b}\n", "use dlq"},
		{"args delivery limit", "queues:\n  - name: a\n    type: quorum\n    args: {x-delivery-limit: 3}\n", "use delivery_limit"},
		{"second document", "queues:\n  - name: a\n---\nqueues:\n  - name: b\n", "more than one YAML document"},
		{"dlq is the queue itself", "queues:\n  - name: a\n    dlq: a\n", "its own name"},
		{"dlq is another work queue", "queues:\n  - name: a\n    dlq: b\n  - name: b\n", "is a work queue"},
		{"ttl as a duration string", "queues:\n  - name: a\n    args: {x-message-ttl: 1h}\n", "integer number of milliseconds"},
		{"ttl as a float", "queues:\n  - name: a\n    args: {x-message-ttl: 1.5}\n", "integer number of milliseconds"},
		{"ttl negative", "queues:\n  - name: a\n    args: {x-message-ttl: -1}\n", "integer number of milliseconds"},
		{"max-length as a string", "queues:\n  - name: a\n    args: {x-max-length: \"1000\"}\n", "x-max-length"},
		{"delivery limit on a classic queue", "queues:\n  - name: a\n    delivery_limit: 5\n", "quorum queues only"},
		{"no_retry with retry_delays", "queues:\n  - name: a\n    no_retry: true\n    retry_delays: [1s]\n", "no_retry"},
		{"amq. prefix", "queues:\n  - name: amq.work\n", "reserved"},
		{"derived name too long", "queues:\n  - name: " + long + "\n", "255 bytes"},
		{"arg the broker cannot take", "queues:\n  - name: a\n    args: {x-custom: {1: 2}}\n", "x-custom"},
		{"exchange twice", "exchanges:\n  - name: e\n  - name: e\n", "declared twice"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			_, err := topology.Load(strings.NewReader(tt.yaml))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want it to mention %q", err, tt.want)
			}
			t.Log(err)
		})
	}
	good := []struct {
		name, yaml string
		check      func(p topology.Plan) bool
	}{
		{"x-queue-type equal to type", "queues:\n  - name: a\n    type: quorum\n    args: {x-queue-type: quorum}\n",
			func(p topology.Plan) bool {
				return p.Type == topology.Quorum && p.DeliveryLimit == topology.DefaultDeliveryLimit
			}},
		{"ttl in milliseconds", "queues:\n  - name: a\n    args: {x-message-ttl: 3600000}\n",
			func(p topology.Plan) bool { return p.Args[topology.ArgMessageTTL] == int64(3600000) }},
		{"no DLQ is said out loud", "queues:\n  - name: a\n    dlq: \"-\"\n",
			func(p topology.Plan) bool {
				return p.DLQ == "" && len(p.Notes) == 1 && strings.Contains(p.Notes[0], "no dead-letter queue")
			}},
	}
	for _, tt := range good {
		t.Run(tt.name, func(t *testing.T) {
			top, err := topology.Load(strings.NewReader(tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if p := topology.ForQueue(top.Queues[0]); !tt.check(p) {
				t.Fatalf("plan %+v", p)
			}
		})
	}
}

// Built in Go rather than YAML, a queue's own Args never override what
// the plan computes (type, dead-lettering, delivery limit).
func TestForQueueComputedArgsWin(t *testing.T) {
	p := topology.ForQueue(topology.Queue{Name: "a", Args: map[string]any{
		topology.ArgQueueType: "quorum", topology.ArgDLRoutingKey: "x", topology.ArgDeliveryLimit: 99}})
	if p.Args[topology.ArgQueueType] != "classic" || p.Args[topology.ArgDLRoutingKey] != "a.dlq" || p.Args[topology.ArgDeliveryLimit] != nil {
		t.Fatalf("args %v", p.Args)
	}
	if err := (topology.Topology{Queues: []topology.Queue{{Name: "a", Args: map[string]any{topology.ArgQueueType: "quorum"}}}}).Validate(); err == nil {
		t.Fatal("Validate accepted the contradiction")
	}
}

func TestWarnings(t *testing.T) {
	for _, tc := range []struct {
		name string
		q    topology.Queue
		want int
	}{
		{"quorum work, default retry", topology.Queue{Name: "a", Type: topology.Quorum}, 0},
		{"quorum work, quorum retry", topology.Queue{Name: "a", Type: topology.Quorum, RetryType: topology.Quorum}, 0},
		{"classic work, classic retry", topology.Queue{Name: "a", Type: topology.Classic, RetryType: topology.Classic}, 0},
		{"quorum work, classic retry, released", topology.Queue{Name: "a", Type: topology.Quorum, RetryType: topology.Classic}, 0},
		{"quorum work, classic retry, dead-letter route", topology.Queue{Name: "a", Type: topology.Quorum, RetryType: topology.Classic, RetryRoute: topology.RouteDeadLetter}, 1},
		{"quorum work, classic retry, no retry", topology.Queue{Name: "a", Type: topology.Quorum, RetryType: topology.Classic, RetryRoute: topology.RouteDeadLetter, NoRetry: true}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			top := topology.Topology{Queues: []topology.Queue{tc.q}}
			if err := top.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			ws := top.Warnings()
			if len(ws) != tc.want {
				t.Fatalf("Warnings() = %q, want %d", ws, tc.want)
			}
			for _, w := range ws {
				if !strings.Contains(w, `"a"`) || !strings.Contains(w, "retry_type: quorum") {
					t.Errorf("warning %q does not name the queue and the fix", w)
				}
			}
		})
	}
}

// Dead-letter queues are quorum queues by default (a node loss leaves them
// available), with a delivery limit far beyond any inspection; dlq_type
// classic keeps the old classic DLQ.
func TestDLQType(t *testing.T) {
	tests := []struct {
		name  string
		q     topology.Queue
		typ   topology.QueueType
		limit any
	}{
		{"default, classic work queue", topology.Queue{Name: "a"}, topology.Quorum, int64(topology.DLQDeliveryLimit)},
		{"default, quorum work queue", topology.Queue{Name: "a", Type: topology.Quorum}, topology.Quorum, int64(topology.DLQDeliveryLimit)},
		{"classic", topology.Queue{Name: "a", DLQType: topology.Classic}, topology.Classic, nil},
		{"quorum, named", topology.Queue{Name: "a", DLQ: "errors", DLQType: topology.Quorum}, topology.Quorum, int64(topology.DLQDeliveryLimit)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := topology.ForQueue(tt.q)
			if p.DLQType != tt.typ || p.DLQArgs[topology.ArgQueueType] != string(tt.typ) || p.DLQArgs[topology.ArgDeliveryLimit] != tt.limit {
				t.Fatalf("DLQ type %q args %v, want %s with limit %v", p.DLQType, p.DLQArgs, tt.typ, tt.limit)
			}
		})
	}
	if p := topology.ForQueue(topology.Queue{Name: "a", DLQ: "-"}); p.DLQType != "" || p.DLQArgs != nil {
		t.Fatalf("no DLQ: type %q args %v", p.DLQType, p.DLQArgs)
	}
	bad := []struct{ name, yaml, want string }{
		{"unknown", "queues:\n  - name: a\n    dlq_type: stream\n", `unknown dlq_type "stream"`},
		{"type without a DLQ", "queues:\n  - name: a\n    dlq: \"-\"\n    dlq_type: quorum\n", "dlq is \"-\""},
		{"shared DLQ, two types", "queues:\n  - name: a\n    dlq: errors\n  - name: b\n    dlq: errors\n    dlq_type: classic\n", "give both the same dlq_type"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			_, err := topology.Load(strings.NewReader(tt.yaml))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want %q", err, tt.want)
			}
		})
	}
}

// A classic DLQ declared by an older idemq makes the default (quorum)
// declare fail with a mismatch that says how to keep it or move it;
// dlq_type classic declares it as it is.
func TestDeclareExistingClassicDLQ(t *testing.T) {
	name := testenv.Name(t, "q")
	cleanup(t, topology.Topology{Queues: []topology.Queue{{Name: name, NoRetry: true}}})
	if _, err := testenv.Channel(t).QueueDeclare(topology.DLQName(name), true, false, false, false,
		amqp.Table{topology.ArgQueueType: "classic"}); err != nil {
		t.Fatal(err)
	}
	err := topology.Declare(context.Background(), testenv.Channel(t), topology.Topology{Queues: []topology.Queue{{Name: name, NoRetry: true}}})
	var me *topology.MismatchError
	if !errors.As(err, &me) || me.Name != topology.DLQName(name) || me.Argument != topology.ArgQueueType ||
		!strings.Contains(err.Error(), "dlq_type: classic") {
		t.Fatalf("err %v, want a mismatch on the DLQ's x-queue-type with the dlq_type hint", err)
	}
	keep := topology.Topology{Queues: []topology.Queue{{Name: name, NoRetry: true, DLQType: topology.Classic}}}
	if err := topology.Declare(context.Background(), testenv.Channel(t), keep); err != nil {
		t.Fatalf("dlq_type classic: %v", err)
	}
}
