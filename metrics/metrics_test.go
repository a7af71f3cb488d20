package metrics_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/metrics"
)

func TestConsumerMetricsAgainstBroker(t *testing.T) {
	m, err := metrics.New(metrics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s := runScenario(t, m, 20, 5, 2)
	q := map[string]string{"queue": s.queue, "group": s.group}
	with := func(k, v string) map[string]string {
		out := map[string]string{k: v}
		for a, b := range q {
			out[a] = b
		}
		return out
	}
	g := m.Gatherer()
	for _, c := range []struct {
		metric string
		labels map[string]string
		want   float64
	}{
		{"idemq_deliveries_total", with("outcome", "processed"), 20},
		{"idemq_deliveries_total", with("outcome", "duplicate"), 5},
		{"idemq_deliveries_total", with("outcome", "dead_lettered"), 2},
		{"idemq_duplicates_total", with("layer", "guard"), 5},
		{"idemq_dead_lettered_total", with("reason", idemq.ReasonMaxAttempts), 2},
		{"idemq_settlements_total", with("action", "acked"), 25},
		{"idemq_settlements_total", with("action", "republished"), 2},
		{"idemq_received_total", q, 27},
		{"idemq_unacked_deliveries", q, 0},
		{"idemq_handler_duration_seconds", q, 27},
		{"idemq_critical_time_seconds", q, 27},
		{"idemq_consumer_ready", q, 1},
		{"idemq_breaker_open", q, 0},
		{"idemq_publisher_confirms_total", map[string]string{"publisher": "retry"}, 2},
		{"idemq_publisher_inflight", map[string]string{"publisher": "retry"}, 0},
		{"idemq_dedup_store_seconds", map[string]string{"store": "memory", "op": "claim"}, 27},
		{"idemq_dedup_store_seconds", map[string]string{"store": "memory", "op": "complete"}, 20},
		{"idemq_dedup_store_errors_total", map[string]string{"store": "memory"}, 0},
	} {
		t.Run(fmt.Sprintf("%s%v", c.metric, c.labels), func(t *testing.T) {
			if got := value(t, g, c.metric, c.labels); got != c.want {
				t.Errorf("%s%v = %v, want %v", c.metric, c.labels, got, c.want)
			}
		})
	}
}

// Labels never carry a message ID: 10k distinct IDs through a recorder add
// no series.
func TestCardinalityBounded(t *testing.T) {
	m, err := metrics.New(metrics.Config{Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	rec := m.Consumer("orders", "billing")
	pub := m.Publisher("orders")
	settle := func(i int) {
		d := &idemq.Delivery{MessageID: fmt.Sprintf("id-%d", i), Queue: "orders", Group: "billing", Timestamp: time.Now(), ReceivedAt: time.Now()}
		rec.Add(idemq.CountDelivered, 1)
		rec.Add(idemq.CountInFlight, 1)
		pub.Add(idemq.CountPublished, 1)
		outcomes := []idemq.Decision{
			idemq.Ack(nil), idemq.Ack(idemq.Duplicate(idemq.LayerInbox)),
			{Action: idemq.ActionPublish, Outcome: idemq.OutcomeDeadLettered, Reason: idemq.ReasonMaxAttempts},
			{Action: idemq.ActionRequeue, Outcome: idemq.OutcomeDeferred, Reason: "in-flight"},
		}
		rec.Settled(d, idemq.Settlement{Decision: outcomes[i%len(outcomes)], Handler: time.Millisecond, Total: 2 * time.Millisecond})
	}
	for i := range 100 {
		settle(i)
	}
	before := series(t, m.Gatherer())
	for i := 100; i < 10_100; i++ {
		settle(i)
	}
	if after := series(t, m.Gatherer()); after != before {
		t.Fatalf("series grew from %d to %d over 10k distinct message IDs", before, after)
	}
	if got := value(t, m.Gatherer(), "idemq_duplicates_total", map[string]string{"layer": "inbox"}); got != 10_100/4 {
		t.Fatalf("inbox duplicates = %v, want %v", got, 10_100/4)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  metrics.Config
		ok   bool
	}{
		{"zero", metrics.Config{}, true},
		{"namespace", metrics.Config{Namespace: "shop_idemq"}, true},
		{"bad namespace", metrics.Config{Namespace: "1-x"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := c.cfg.Validate(); (err == nil) != c.ok || (err != nil && !errors.Is(err, metrics.ErrInvalidConfig)) {
				t.Fatalf("Validate() = %v, want ok=%v (else ErrInvalidConfig)", err, c.ok)
			}
		})
	}
}

type fakeConsumer struct {
	ready  chan struct{}
	paused bool
}

func (f *fakeConsumer) Ready() <-chan struct{} { return f.ready }
func (f *fakeConsumer) Paused() bool           { return f.paused }

func TestHealthHandler(t *testing.T) {
	m, err := metrics.New(metrics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	c := &fakeConsumer{ready: make(chan struct{})}
	srv := httptest.NewServer(metrics.NewHealth(metrics.HealthConfig{Gatherer: m.Gatherer(),
		Checks: map[string]metrics.Check{"consumer": metrics.ConsumerReady(c)}}))
	defer srv.Close()
	get := func(path string) int {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, step := range []struct {
		name   string
		before func()
		path   string
		want   int
	}{
		{"live", nil, "/healthz", 200},
		{"not subscribed", nil, "/readyz", 503},
		{"subscribed", func() { close(c.ready) }, "/readyz", 200},
		{"breaker open", func() { c.paused = true }, "/readyz", 503},
		{"metrics", nil, "/metrics", 200},
	} {
		if step.before != nil {
			step.before()
		}
		if got := get(step.path); got != step.want {
			t.Fatalf("%s: GET %s = %d, want %d", step.name, step.path, got, step.want)
		}
	}
}
