package fakemq_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/idemqtest/fakemq"
	"github.com/idemq/idemq/internal/testenv"
)

const wait = 10 * time.Second

// target is a broker a scenario runs on: the fake or the real RabbitMQ.
type target struct {
	name string
	url  string
	dial func(string, amqp.Config) (*amqp.Connection, error)
}

// fake starts a fake broker for the test.
func fake(t *testing.T) target {
	b := fakemq.New(fakemq.Config{})
	t.Cleanup(b.Close)
	return target{name: "fake", url: "amqp://guest:guest@fake/", dial: b.Dial}
}

// rabbit is the shared RabbitMQ (IDEMQ_AMQP_URL); missing, it fails the test
// under CI=true and skips it elsewhere.
func rabbit(t *testing.T) target {
	return target{name: "rabbitmq", url: testenv.RequireAMQP(t), dial: amqp.DialConfig}
}

// channel opens a connection and a channel on tg, closed at cleanup.
func (tg target) channel(t *testing.T) (*amqp.Connection, *amqp.Channel) {
	t.Helper()
	conn, err := tg.dial(tg.url, amqp.Config{Heartbeat: 10 * time.Second, Locale: "en_US"})
	if err != nil {
		t.Fatalf("%s: dial: %v", tg.name, err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("%s: channel: %v", tg.name, err)
	}
	return conn, ch
}

// rec is a scenario's transcript: what the client observed, in order.
type rec struct {
	t     *testing.T
	lines []string
}

func (r *rec) add(format string, args ...any) {
	r.lines = append(r.lines, fmt.Sprintf(format, args...))
}

func (r *rec) must(err error, what string) {
	r.t.Helper()
	if err != nil {
		r.t.Fatalf("%s: %v", what, err)
	}
}

// next waits for a delivery (or records that none came while the stream
// closed).
func next(t *testing.T, ds <-chan amqp.Delivery) amqp.Delivery {
	t.Helper()
	select {
	case d, ok := <-ds:
		if !ok {
			t.Fatal("delivery stream closed")
		}
		return d
	case <-time.After(wait):
		t.Fatal("no delivery")
	}
	return amqp.Delivery{}
}

// get waits for a message to be ready in q and takes it.
func get(t *testing.T, ch *amqp.Channel, q string) amqp.Delivery {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		d, ok, err := ch.Get(q, false)
		if err != nil {
			t.Fatalf("get %s: %v", q, err)
		}
		if ok {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing in %s after %v", q, wait)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ready is the number of ready messages in q (queue.declare-ok's count).
func ready(t *testing.T, ch *amqp.Channel, q string) int {
	t.Helper()
	qi, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("passive declare %s: %v", q, err)
	}
	return qi.Messages
}

// closeCode waits for ch's close and returns its AMQP code.
func closeCode(t *testing.T, closed <-chan *amqp.Error) int {
	t.Helper()
	select {
	case e := <-closed:
		if e == nil {
			return 0
		}
		return e.Code
	case <-time.After(wait):
		t.Fatal("channel not closed")
	}
	return -1
}

// headers prints a table with its keys sorted, the value types and the
// x-death entries spelled out; times print as their type only.
func headers(h amqp.Table, names map[string]string) string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s ", k, value(h[k], names))
	}
	return strings.TrimSpace(b.String())
}

func value(v any, names map[string]string) string {
	switch v := v.(type) {
	case amqp.Table:
		return "{" + headers(v, names) + "}"
	case []any:
		s := make([]string, len(v))
		for i, x := range v {
			s[i] = value(x, names)
		}
		return "[" + strings.Join(s, " ") + "]"
	case time.Time:
		return "time"
	case string:
		if n, ok := names[v]; ok {
			return n
		}
		return fmt.Sprintf("%q", v)
	default:
		return fmt.Sprintf("%T(%v)", v, v)
	}
}

// scenarios run on a target and return the transcript; each names its
// queues with testenv.Name and deletes them at cleanup.
var scenarios = []struct {
	name string
	run  func(t *testing.T, tg target, r *rec)
}{
	{"prefetch, nack requeue, redelivered, channel close requeues", func(t *testing.T, tg target, r *rec) {
		_, ch := tg.channel(t)
		q := queueFor(t, tg, ch, nil)
		publish(t, tg, "", q, "m1", "m2", "m3")
		r.must(ch.Qos(2, 0, false), "qos")
		ds, err := ch.Consume(q, "c1", false, false, false, false, nil)
		r.must(err, "consume")
		d1, d2 := next(t, ds), next(t, ds)
		r.add("got %s(tag %d, redelivered %v) %s(tag %d, redelivered %v); ready %d", d1.Body, d1.DeliveryTag, d1.Redelivered, d2.Body, d2.DeliveryTag, d2.Redelivered, ready(t, ch, q))
		r.must(d1.Nack(false, true), "nack")
		d3 := next(t, ds)
		r.add("after nack requeue: %s(tag %d, redelivered %v)", d3.Body, d3.DeliveryTag, d3.Redelivered)
		r.must(d2.Ack(false), "ack")
		d4 := next(t, ds)
		r.add("after ack: %s(tag %d, redelivered %v); ready %d", d4.Body, d4.DeliveryTag, d4.Redelivered, ready(t, ch, q))
		r.must(ch.Close(), "close")
		_, ch2 := tg.channel(t)
		for i := 0; i < 2; i++ {
			d := get(t, ch2, q)
			r.add("after close: %s redelivered %v", d.Body, d.Redelivered)
			r.must(d.Ack(false), "ack")
		}
		r.add("ready at the end %d", ready(t, ch2, q))
	}},
	{"ack multiple, then an unknown tag closes the channel", func(t *testing.T, tg target, r *rec) {
		_, ch := tg.channel(t)
		q := queueFor(t, tg, ch, nil)
		publish(t, tg, "", q, "a", "b", "c")
		ds, err := ch.Consume(q, "", false, false, false, false, nil)
		r.must(err, "consume")
		next(t, ds)
		next(t, ds)
		d := next(t, ds)
		r.must(ch.Ack(d.DeliveryTag-1, true), "ack multiple")
		r.must(d.Reject(false), "reject") // no dead-letter exchange: dropped
		r.add("ready %d", ready(t, ch, q))
		closed := ch.NotifyClose(make(chan *amqp.Error, 1))
		_ = ch.Ack(d.DeliveryTag, false) // already settled
		r.add("ack of a settled tag: channel closed with %d", closeCode(t, closed))
		_, ch2 := tg.channel(t)
		r.add("ready after %d", ready(t, ch2, q))
	}},
	{"reject to a dead-letter exchange: x-death", func(t *testing.T, tg target, r *rec) {
		_, ch := tg.channel(t)
		dlq := queueFor(t, tg, ch, nil)
		q := queueFor(t, tg, ch, amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
		names := map[string]string{q: "Q", dlq: "DLQ"}
		r.must(ch.PublishWithContext(context.Background(), "", q, false, false, amqp.Publishing{MessageId: "id-1",
			Expiration: "60000", Headers: amqp.Table{"app": "x"}, Body: []byte("m")}), "publish")
		d := get(t, ch, q)
		r.must(d.Reject(false), "reject")
		dl := get(t, ch, dlq)
		r.add("dead letter %s id %s expiration %q redelivered %v headers %s", dl.Body, dl.MessageId, dl.Expiration, dl.Redelivered, headers(dl.Headers, names))
		r.must(dl.Ack(false), "ack")
		// Back into the queue and rejected again: the same entry counts 2.
		r.must(ch.PublishWithContext(context.Background(), "", q, false, false, amqp.Publishing{MessageId: "id-1", Headers: dl.Headers, Body: dl.Body}), "republish")
		d = get(t, ch, q)
		r.must(d.Nack(false, false), "nack")
		dl = get(t, ch, dlq)
		r.add("dead letter again: %s", headers(dl.Headers, names))
		r.must(dl.Ack(false), "ack")
	}},
	{"retry queue: TTL dead-letters back, x-death counts", func(t *testing.T, tg target, r *rec) {
		_, ch := tg.channel(t)
		work := queueFor(t, tg, ch, nil)
		retryQ := queueFor(t, tg, ch, amqp.Table{"x-queue-type": "quorum", "x-message-ttl": int64(50),
			"x-dead-letter-exchange": "", "x-dead-letter-routing-key": work,
			"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"})
		names := map[string]string{work: "WORK", retryQ: "RETRY"}
		h := amqp.Table{"x-idemq-attempt": int64(1)}
		for i := 1; i <= 2; i++ {
			r.must(ch.PublishWithContext(context.Background(), "", retryQ, false, false, amqp.Publishing{MessageId: "r", Headers: h, Body: []byte("m")}), "publish")
			d := get(t, ch, work)
			r.add("pass %d: from %q key %s redelivered %v headers %s", i, d.Exchange, value(d.RoutingKey, names), d.Redelivered, headers(d.Headers, names))
			r.must(d.Ack(false), "ack")
			h = d.Headers
		}
		// A per-message expiration shorter than the queue's wins.
		r.must(ch.PublishWithContext(context.Background(), "", retryQ, false, false, amqp.Publishing{MessageId: "e", Expiration: "10", Body: []byte("e")}), "publish")
		d := get(t, ch, work)
		r.add("per-message ttl: %s", headers(d.Headers, names))
		r.must(d.Ack(false), "ack")
	}},
	{"quorum queue: x-delivery-count and the delivery limit", func(t *testing.T, tg target, r *rec) {
		_, ch := tg.channel(t)
		dlq := queueFor(t, tg, ch, nil)
		q := queueFor(t, tg, ch, amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(1),
			"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
		names := map[string]string{q: "Q", dlq: "DLQ"}
		publish(t, tg, "", q, "m")
		ds, err := ch.Consume(q, "", false, false, false, false, nil)
		r.must(err, "consume")
		for i := 1; i <= 2; i++ {
			d := next(t, ds)
			r.add("delivery %d: redelivered %v headers %s", i, d.Redelivered, headers(d.Headers, names))
			r.must(d.Nack(false, true), "nack")
		}
		dl := get(t, ch, dlq)
		r.add("past the limit: dead letter headers %s", headers(dl.Headers, names))
		r.must(dl.Ack(false), "ack")
		r.add("ready %d", ready(t, ch, q))
	}},
	{"confirms, mandatory returns, missing exchange and queue, inequivalent redeclare", func(t *testing.T, tg target, r *rec) {
		conn, ch := tg.channel(t)
		q := queueFor(t, tg, ch, nil)
		r.must(ch.Confirm(false), "confirm")
		returns := ch.NotifyReturn(make(chan amqp.Return, 1))
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", q+".nowhere", true, false, amqp.Publishing{MessageId: "lost", Body: []byte("x")})
		r.must(err, "publish")
		select {
		case ret := <-returns:
			r.add("returned %d %s id %s", ret.ReplyCode, ret.ReplyText, ret.MessageId)
		case <-time.After(wait):
			t.Fatal("no return")
		}
		ok, err := dc.WaitContext(context.Background())
		r.add("unroutable confirmed: ack %v err %v", ok, err)
		dc, err = ch.PublishWithDeferredConfirmWithContext(context.Background(), "", q, true, false, amqp.Publishing{Body: []byte("y")})
		r.must(err, "publish")
		ok, err = dc.WaitContext(context.Background())
		r.add("routed confirmed: ack %v err %v; ready %d", ok, err, ready(t, ch, q))

		_, err = ch.QueueDeclarePassive(q+".missing", true, false, false, false, nil)
		r.add("passive declare of a missing queue: %d", code(err))
		ch, err = conn.Channel()
		r.must(err, "channel")
		_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-message-ttl": int64(5)})
		r.add("inequivalent redeclare: %d", code(err))
		ch, err = conn.Channel()
		r.must(err, "channel")
		_, err = ch.QueueDeclare(q, true, false, false, false, nil)
		r.add("equivalent redeclare: %d", code(err))
		closed := ch.NotifyClose(make(chan *amqp.Error, 1))
		_ = ch.PublishWithContext(context.Background(), q+".noexchange", "k", false, false, amqp.Publishing{})
		r.add("publish to a missing exchange: channel closed with %d", closeCode(t, closed))
	}},
	{"deleting a queue cancels its consumer", func(t *testing.T, tg target, r *rec) {
		_, ch := tg.channel(t)
		q := queueFor(t, tg, ch, nil)
		cancels := ch.NotifyCancel(make(chan string, 1))
		_, err := ch.Consume(q, "the-consumer", false, false, false, false, nil)
		r.must(err, "consume")
		_, ch2 := tg.channel(t)
		_, err = ch2.QueueDelete(q, false, false, false)
		r.must(err, "delete")
		select {
		case tag := <-cancels:
			r.add("cancelled %s", tag)
		case <-time.After(wait):
			t.Fatal("no cancel")
		}
	}},
	{"topic and fanout routing", func(t *testing.T, tg target, r *rec) {
		_, ch := tg.channel(t)
		a, b := queueFor(t, tg, ch, nil), queueFor(t, tg, ch, nil)
		topic, fan := testenv.Name(t, "ext"), testenv.Name(t, "exf")
		r.must(ch.ExchangeDeclare(topic, "topic", false, true, false, false, nil), "declare topic")
		r.must(ch.ExchangeDeclare(fan, "fanout", false, true, false, false, nil), "declare fanout")
		r.must(ch.QueueBind(a, "order.*", topic, false, nil), "bind")
		r.must(ch.QueueBind(b, "order.#", topic, false, nil), "bind")
		r.must(ch.QueueBind(a, "", fan, false, nil), "bind")
		r.must(ch.QueueBind(b, "", fan, false, nil), "bind")
		publish(t, tg, topic, "order.created", "1")
		publish(t, tg, topic, "order.created.eu", "2")
		publish(t, tg, topic, "invoice.created", "3")
		publish(t, tg, fan, "whatever", "4")
		r.add("a has %d, b has %d", ready(t, ch, a), ready(t, ch, b))
		for _, n := range []string{topic, fan} {
			_ = ch.ExchangeDelete(n, false, false)
		}
	}},
}

// code is an error's AMQP reply code, 0 for nil.
func code(err error) int {
	var e *amqp.Error
	if errors.As(err, &e) {
		return e.Code
	}
	if err != nil {
		return -1
	}
	return 0
}

// queueFor declares a queue named for the test on tg, deleted at cleanup.
func queueFor(t *testing.T, tg target, ch *amqp.Channel, args amqp.Table) string {
	t.Helper()
	name := testenv.Name(t, "q")
	if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
		t.Fatalf("declare %s: %v", name, err)
	}
	t.Cleanup(func() {
		_, c := tg.channel(t)
		_, _ = c.QueueDelete(name, false, false, false)
	})
	return name
}

// publish publishes bodies to exchange with key, waiting for the confirms
// (so they are enqueued when it returns).
func publish(t *testing.T, tg target, exchange, key string, bodies ...string) {
	t.Helper()
	_, ch := tg.channel(t)
	if err := ch.Confirm(false); err != nil {
		t.Fatalf("confirm: %v", err)
	}
	for _, b := range bodies {
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), exchange, key, false, false, amqp.Publishing{MessageId: b, Body: []byte(b)})
		if err != nil {
			t.Fatalf("publish: %v", err)
		}
		if ok, err := dc.WaitContext(context.Background()); !ok || err != nil {
			t.Fatalf("publish %s not confirmed: %v", b, err)
		}
	}
}

// TestSameAsRabbitMQ runs each scenario on the fake and on RabbitMQ and
// requires the same transcript.
func TestSameAsRabbitMQ(t *testing.T) {
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			var got [2][]string
			for i, mk := range []func(*testing.T) target{fake, rabbit} {
				tg := mk(t)
				r := &rec{t: t}
				sc.run(t, tg, r)
				got[i] = r.lines
			}
			for i := 0; i < max(len(got[0]), len(got[1])); i++ {
				var f, b string
				if i < len(got[0]) {
					f = got[0][i]
				}
				if i < len(got[1]) {
					b = got[1][i]
				}
				if f != b {
					t.Errorf("line %d differs\n  fake:     %s\n  rabbitmq: %s", i, f, b)
				} else {
					t.Logf("same: %s", f)
				}
			}
		})
	}
}

func fakemqNew(t *testing.T) *fakemq.Broker {
	b := fakemq.New(fakemq.Config{})
	t.Cleanup(b.Close)
	return b
}
