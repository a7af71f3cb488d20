package gate_test

import (
	"context"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/gate"
	"github.com/idemq/idemq/internal/testenv"
)

// Every property and every header (one of each AMQP field type amqp091-go
// reads) arrives at the target exactly as a direct copy of the same
// publish arrives in a control queue.
func TestForwardsPropertiesAndHeadersUnchanged(t *testing.T) {
	r := newRig(t)
	ch := testenv.Channel(t)
	fan := testenv.Name(t, "fan")
	control := testenv.Queue(t, nil)
	if err := ch.ExchangeDeclare(fan, "fanout", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{r.ingress, control} {
		if err := ch.QueueBind(q, "", fan, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	ts := time.Unix(1767225600, 0)
	headers := amqp.Table{
		"x-deduplication-header": "dedup-1",
		"bool":                   true, "u8": byte(7), "i8": int8(-8), "i16": int16(-16), "u16": uint16(16),
		"i32": int32(-32), "u32": uint32(32), "i64": int64(-64), "f32": float32(3.5), "f64": float64(-2.25),
		"dec": amqp.Decimal{Scale: 2, Value: 12345}, "str": "text", "bytes": []byte{0, 1, 2, 0xff},
		"arr": []any{"a", int32(1), []any{int64(2)}}, "ts": ts, "nil": nil,
		"table":         amqp.Table{"inner": "v", "n": int32(1)},
		"x-idemq-extra": "a producer's own x-idemq-* header",
		"traceparent":   "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	}
	pubs := []amqp.Publishing{
		{
			Headers: headers, ContentType: "application/json", ContentEncoding: "gzip",
			DeliveryMode: amqp.Persistent, Priority: 3, CorrelationId: "corr-1", ReplyTo: "replies",
			Expiration: "600000", MessageId: "full-1", Timestamp: ts, Type: "order.created",
			UserId: "guest", AppId: "shop", Body: []byte(`{"order":1}`),
		},
		// Nothing set but the ID: the gate adds no default (no content
		// type, no timestamp, no delivery mode).
		{MessageId: "bare-1", Body: []byte("bare")},
	}
	for _, p := range pubs {
		if err := ch.Publish(fan, "orders.created", false, false, p); err != nil {
			t.Fatal(err)
		}
	}
	_, _ = start(t, r.config())
	got := collect(t, r.out, len(pubs), 30*time.Second)
	want := collect(t, control, len(pubs), 30*time.Second)
	sort.Slice(got, func(i, j int) bool { return got[i].MessageId < got[j].MessageId })
	sort.Slice(want, func(i, j int) bool { return want[i].MessageId < want[j].MessageId })
	for i := range want {
		g, w := got[i], want[i]
		type props struct {
			Headers                                              amqp.Table
			ContentType, ContentEncoding, CorrelationId, ReplyTo string
			Expiration, MessageId, Type, UserId, AppId           string
			DeliveryMode, Priority                               uint8
			Timestamp                                            time.Time
			Body                                                 []byte
		}
		of := func(d amqp.Delivery) props {
			return props{d.Headers, d.ContentType, d.ContentEncoding, d.CorrelationId, d.ReplyTo,
				d.Expiration, d.MessageId, d.Type, d.UserId, d.AppId, d.DeliveryMode, d.Priority, d.Timestamp, d.Body}
		}
		if !reflect.DeepEqual(of(g), of(w)) {
			t.Errorf("message %s forwarded as\n%#v\nwant (the direct copy)\n%#v", w.MessageId, of(g), of(w))
		}
		if g.Exchange != r.exchange || g.RoutingKey != "out" {
			t.Errorf("forwarded to %q/%q", g.Exchange, g.RoutingKey)
		}
	}
}

// A route without a routing key keeps the message's own.
func TestRouteKeepsTheRoutingKey(t *testing.T) {
	r := newRig(t)
	cfg := r.config()
	cfg.Routes = []gate.Route{{Exchange: r.exchange}}
	_, _ = start(t, cfg)
	testenv.Publish(t, "", r.ingress, amqp.Publishing{MessageId: "k-1"}) // routing key = ingress: unroutable at the target
	ch := testenv.Channel(t)
	if err := ch.Publish("", r.ingress, false, false, amqp.Publishing{MessageId: "k-2"}); err != nil {
		t.Fatal(err)
	}
	dl := collect(t, r.dlq, 2, 30*time.Second)
	for _, d := range dl {
		if d.Headers[idemq.HeaderReason] != gate.ReasonUnroutable {
			t.Fatalf("dead letter %s reason %v", d.MessageId, d.Headers[idemq.HeaderReason])
		}
	}
	// Now with the routing key the output queue is bound with.
	if err := ch.QueueBind(r.out, r.ingress, r.exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	testenv.Publish(t, "", r.ingress, amqp.Publishing{MessageId: "k-3"})
	got := collect(t, r.out, 1, 30*time.Second)
	if got[0].MessageId != "k-3" || got[0].RoutingKey != r.ingress {
		t.Fatalf("got %s with routing key %q", got[0].MessageId, got[0].RoutingKey)
	}
}

// Copies of an ID within the window are acked and counted, never
// forwarded; after the window the ID is forwarded again.
func TestDuplicatesWithinWindowDroppedAfterWindowForwarded(t *testing.T) {
	r := newRig(t)
	cfg := r.config()
	// Longer than the lease: a copy deferred while the first was in
	// flight comes back after up to a lease.
	cfg.Window = 8 * time.Second
	g, _ := start(t, cfg)
	testenv.Publish(t, "", r.ingress,
		amqp.Publishing{MessageId: "a", Body: []byte("1")},
		amqp.Publishing{MessageId: "a", Body: []byte("2")},
		amqp.Publishing{MessageId: "b"},
		amqp.Publishing{MessageId: "a", Body: []byte("3")})
	got := collect(t, r.out, 2, 30*time.Second)
	testenv.Eventually(t, 30*time.Second, "4 deliveries settled", func() bool {
		s := g.Stats()
		return s.Forwarded+s.Duplicates == 4
	})
	got = append(got, drain(t, testenv.Channel(t), r.out)...)
	if s := strings.Join(ids(got), ","); s != "a,b" && s != "b,a" {
		t.Fatalf("forwarded %s, want a and b once", s)
	}
	if s := g.Stats(); s.Duplicates != 2 || s.Forwarded != 2 {
		t.Fatalf("stats %+v", s)
	}
	// After the window (the record expires in the store) "a" is new again.
	key := dedup.Key("idemq", gate.GroupPrefix+r.ingress, "a")
	testenv.Eventually(t, 30*time.Second, "record of a expired", func() bool {
		_, ok, err := r.store.Get(context.Background(), key)
		return err == nil && !ok
	})
	testenv.Publish(t, "", r.ingress, amqp.Publishing{MessageId: "a", Body: []byte("4")})
	again := collect(t, r.out, 1, 30*time.Second)
	if again[0].MessageId != "a" || string(again[0].Body) != "4" {
		t.Fatalf("after the window got %s %q", again[0].MessageId, again[0].Body)
	}
	if lat := g.Stats().ForwardLatency; lat.Count != 3 || lat.Max <= 0 || lat.P50 <= 0 || lat.P99 < lat.P50 {
		t.Fatalf("latency %+v", lat)
	}
}

// A message without an ID is dead-lettered with reason missing-id; one
// with a bad ID with invalid-id; neither is forwarded.
func TestNoIDDeadLettered(t *testing.T) {
	r := newRig(t)
	g, _ := start(t, r.config())
	testenv.Publish(t, "", r.ingress,
		amqp.Publishing{Body: []byte("no id")},
		amqp.Publishing{MessageId: "bad\x01id", Body: []byte("bad id")},
		amqp.Publishing{MessageId: "good"})
	dl := collect(t, r.dlq, 2, 30*time.Second)
	reasons := map[string]string{}
	for _, d := range dl {
		reasons[string(d.Body)] = fmt.Sprint(d.Headers[idemq.HeaderReason])
	}
	if reasons["no id"] != idemq.ReasonMissingID || reasons["bad id"] != idemq.ReasonInvalidID {
		t.Fatalf("reasons %v", reasons)
	}
	got := collect(t, r.out, 1, 30*time.Second)
	if len(got) != 1 || got[0].MessageId != "good" {
		t.Fatalf("forwarded %v", ids(got))
	}
	// The counters move after the broker saw the message (the forward's
	// confirm, the reject), so a fast broker can show it first.
	testenv.Eventually(t, 5*time.Second, "stats dead_lettered 2, forwarded 1", func() bool {
		s := g.Stats()
		return s.DeadLettered == 2 && s.Forwarded == 1
	})
}

// An unroutable message is dead-lettered with reason unroutable and its
// claim released: once a queue is bound, the same ID is forwarded.
func TestUnroutableDeadLetteredAndReleased(t *testing.T) {
	r := newRig(t)
	cfg := r.config()
	cfg.Routes = []gate.Route{{Exchange: r.exchange, RoutingKey: "nowhere"}}
	g, stop := start(t, cfg)
	testenv.Publish(t, "", r.ingress, amqp.Publishing{MessageId: "u-1", Body: []byte("x")})
	dl := collect(t, r.dlq, 1, 30*time.Second)
	if dl[0].Headers[idemq.HeaderReason] != gate.ReasonUnroutable || dl[0].MessageId != "u-1" {
		t.Fatalf("dead letter %s %v", dl[0].MessageId, dl[0].Headers)
	}
	if s := g.Stats(); s.Unroutable != 1 || s.Forwarded != 0 {
		t.Fatalf("stats %+v", s)
	}
	stop()
	ch := testenv.Channel(t)
	if err := ch.QueueBind(r.out, "nowhere", r.exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	_, _ = start(t, cfg)
	testenv.Publish(t, "", r.ingress, amqp.Publishing{MessageId: "u-1", Body: []byte("x")})
	if got := collect(t, r.out, 1, 30*time.Second); got[0].MessageId != "u-1" {
		t.Fatalf("got %v", ids(got))
	}
}

// The plugin's x-deduplication-header as the ID source (drop-in
// migration), and a JSON field.
func TestIDFromHeaderAndJSON(t *testing.T) {
	cases := []struct {
		name string
		id   idemq.IDConfig
		pubs []amqp.Publishing
	}{
		{"header", idemq.IDConfig{Extractor: idemq.FromHeader("x-deduplication-header")}, []amqp.Publishing{
			{Headers: amqp.Table{"x-deduplication-header": "h-1"}, MessageId: "m-1"},
			{Headers: amqp.Table{"x-deduplication-header": "h-1"}, MessageId: "m-2"},
			{Headers: amqp.Table{"x-deduplication-header": "h-2"}, MessageId: "m-3"},
		}},
		{"json", idemq.IDConfig{Extractor: idemq.FromJSONField("order.id")}, []amqp.Publishing{
			{Body: []byte(`{"order":{"id":"o-1"}}`), MessageId: "m-1"},
			{Body: []byte(`{"order":{"id":"o-1"},"resent":true}`), MessageId: "m-2"},
			{Body: []byte(`{"order":{"id":"o-2"}}`), MessageId: "m-3"},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			cfg := r.config()
			cfg.ID = tc.id
			g, _ := start(t, cfg)
			testenv.Publish(t, "", r.ingress, tc.pubs...)
			testenv.Eventually(t, 30*time.Second, "3 settled", func() bool {
				s := g.Stats()
				return s.Forwarded+s.Duplicates == 3
			})
			got := collect(t, r.out, 2, 30*time.Second)
			sort.Slice(got, func(i, j int) bool { return got[i].MessageId < got[j].MessageId })
			// m-1 and m-2 are one message: whichever came first.
			if s := strings.Join(ids(got), ","); s != "m-1,m-3" && s != "m-2,m-3" {
				t.Fatalf("forwarded %s", s)
			}
		})
	}
}

// Two gates on one ingress share the work; with producers resending 30%
// of the messages, each ID reaches the output exactly once (no crash).
func TestTwoGatesShareWork(t *testing.T) {
	r := newRig(t)
	cfg := r.config()
	g1, _ := start(t, cfg)
	g2, _ := start(t, cfg)
	const n = 1500
	var pubs []amqp.Publishing
	for i := 0; i < n; i++ {
		p := amqp.Publishing{MessageId: fmt.Sprintf("s-%d", i), Body: []byte("x")}
		pubs = append(pubs, p)
		if i%10 < 3 {
			pubs = append(pubs, p)
		}
	}
	var wg sync.WaitGroup
	for part := 0; part < 2; part++ {
		wg.Add(1)
		go func(part int) {
			defer wg.Done()
			testenv.Publish(t, "", r.ingress, pubs[part*len(pubs)/2:(part+1)*len(pubs)/2]...)
		}(part)
	}
	wg.Wait()
	got := collect(t, r.out, n, 60*time.Second)
	testenv.Eventually(t, 60*time.Second, "every copy settled", func() bool {
		s1, s2 := g1.Stats(), g2.Stats()
		return s1.Forwarded+s1.Duplicates+s2.Forwarded+s2.Duplicates == int64(len(pubs))
	})
	got = append(got, drain(t, testenv.Channel(t), r.out)...)
	seen := map[string]int{}
	for _, id := range ids(got) {
		seen[id]++
	}
	for id, c := range seen {
		if c != 1 {
			t.Errorf("%s forwarded %d times", id, c)
		}
	}
	s1, s2 := g1.Stats(), g2.Stats()
	if len(seen) != n || s1.Forwarded == 0 || s2.Forwarded == 0 || s1.Forwarded+s2.Forwarded != n {
		t.Fatalf("unique %d of %d; gate 1 %+v; gate 2 %+v", len(seen), n, s1, s2)
	}
	t.Logf("gate 1 forwarded %d (dup %d, deferred %d), gate 2 forwarded %d (dup %d, deferred %d)",
		s1.Forwarded, s1.Duplicates, s1.Deferred, s2.Forwarded, s2.Duplicates, s2.Deferred)
}

// A target exchange that does not exist is an outage of the target, not
// the message's fault: nothing is dead-lettered; once it is declared the
// message is forwarded.
func TestMissingTargetExchangeWaits(t *testing.T) {
	r := newRig(t)
	cfg := r.config()
	missing := testenv.Name(t, "later")
	cfg.Routes = []gate.Route{{Exchange: missing, RoutingKey: "out"}}
	cfg.ForwardTimeout = time.Second
	g, _ := start(t, cfg)
	testenv.Publish(t, "", r.ingress, amqp.Publishing{MessageId: "late-1"})
	testenv.Eventually(t, 30*time.Second, "forward retried", func() bool { return g.Stats().Retries > 0 })
	ch := testenv.Channel(t)
	if err := ch.ExchangeDeclare(missing, "direct", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(r.out, "out", missing, false, nil); err != nil {
		t.Fatal(err)
	}
	if got := collect(t, r.out, 1, 60*time.Second); got[0].MessageId != "late-1" {
		t.Fatalf("got %v", ids(got))
	}
	if n, _ := testenv.QueueCounts(t, r.dlq); n != 0 || g.Stats().DeadLettered != 0 {
		t.Fatalf("dead-lettered %d (stats %+v)", n, g.Stats())
	}
}

func TestCheck(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	g, err := gate.New(r.config())
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Check(ctx); err != nil {
		t.Fatal(err)
	}
	cfg := r.config()
	cfg.Routes = append(cfg.Routes, gate.Route{Exchange: "no-such-exchange-" + r.prefix})
	cfg.Ingress = "no-such-queue-" + r.prefix
	g, err = gate.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = g.Check(ctx)
	if err == nil || !strings.Contains(err.Error(), "no-such-exchange") || !strings.Contains(err.Error(), "no-such-queue") {
		t.Fatalf("Check: %v", err)
	}
}

// Two routes, the second's exchange missing for a while: the first
// route's forward is confirmed, the second times out and the message is
// given back, the gate pauses. When the exchange appears, the redelivery
// forwards to the second route only: route A receives the message once
// (it received it twice before routes recorded their progress, issue 38).
func TestRedeliveryForwardsOnlyToRoutesNotYetConfirmed(t *testing.T) {
	r := newRig(t)
	cfg := r.config()
	missing := testenv.Name(t, "b")
	outB := testenv.Name(t, "outb")
	ch := testenv.Channel(t)
	if _, err := ch.QueueDeclare(outB, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.DeleteQueue(outB) })
	cfg.Routes = []gate.Route{{Exchange: r.exchange, RoutingKey: "out"}, {Exchange: missing, RoutingKey: "out"}}
	cfg.ForwardTimeout = 500 * time.Millisecond
	g, _ := start(t, cfg)
	testenv.Publish(t, "", r.ingress, amqp.Publishing{MessageId: "m-1"})
	// Route A confirmed, route B timed out: the message is given back and
	// the gate pauses until route B's exchange exists (its probe).
	testenv.Eventually(t, 30*time.Second, "the gate paused for route B", func() bool { return g.Paused() })
	if err := ch.ExchangeDeclare(missing, "direct", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(outB, "out", missing, false, nil); err != nil {
		t.Fatal(err)
	}
	if got := collect(t, outB, 1, 60*time.Second); got[0].MessageId != "m-1" {
		t.Fatalf("route B got %v", ids(got))
	}
	testenv.Eventually(t, 30*time.Second, "forwarded", func() bool { return g.Stats().Forwarded == 1 })
	if got := drain(t, ch, r.out); len(got) != 1 {
		t.Fatalf("route A received %d copies (%v), want 1", len(got), ids(got))
	}
	if got := drain(t, ch, outB); len(got) != 0 {
		t.Fatalf("route B received %d more copies", len(got))
	}
}
