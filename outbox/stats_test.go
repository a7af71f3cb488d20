package outbox_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/sqltest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/outbox"
)

func sqliteStore(t *testing.T) (outbox.Store, func(context.Context, ...outbox.Message)) {
	t.Helper()
	be := sqltest.SQLite()
	db, _ := be.Open(t, be.NewDatabase(t))
	ctx := context.Background()
	store, err := outbox.NewStore(ctx, db, outbox.StoreConfig{})
	if err != nil {
		t.Fatal(err)
	}
	add := func(ctx context.Context, msgs ...outbox.Message) {
		t.Helper()
		if err := store.Add(ctx, db, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	return store, add
}

// An invalid message's error from Add is one line, and still
// ErrInvalidMessage.
func TestAddErrorOneLine(t *testing.T) {
	be := sqltest.SQLite()
	db, _ := be.Open(t, be.NewDatabase(t))
	store, err := outbox.NewStore(context.Background(), db, outbox.StoreConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []outbox.Message{{ID: ""}, {ID: "x", Exchange: strings.Repeat("e", 256)}} {
		err := store.Add(context.Background(), db, m)
		if !errors.Is(err, outbox.ErrInvalidMessage) {
			t.Fatalf("Add(%q): %v, want ErrInvalidMessage", m.ID, err)
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("Add(%q) error over several lines: %q", m.ID, err.Error())
		}
		if strings.Count(err.Error(), "invalid message") != 1 {
			t.Errorf("Add(%q) error repeats itself: %q", m.ID, err.Error())
		}
	}
}

// The relay's Pending is refreshed when it has settled a batch, not only
// every StatsInterval: seven rows published read pending=0 without waiting
// an hour.
func TestRelayPendingRefreshedAfterBatch(t *testing.T) {
	url := testenv.RequireAMQP(t)
	q := testenv.Queue(t, nil)
	store, add := sqliteStore(t)
	ctx := context.Background()
	for _, id := range []string{"p-1", "p-2", "p-3", "p-4", "p-5", "p-6", "p-7"} {
		add(ctx, outbox.Message{ID: id, RoutingKey: q, Body: []byte(id)})
	}
	pub, err := idemq.NewPublisher(idemq.PublisherConfig{URL: url, Dial: testenv.Dial})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	var rec idemq.Counters
	r, err := outbox.NewRelay(outbox.RelayConfig{Store: store, Publisher: pub, StatsInterval: time.Hour, Recorder: &rec})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })
	testenv.Eventually(t, 60*time.Second, "7 published", func() bool { return rec.Get(outbox.CountRelayPublished) == 7 })
	testenv.Eventually(t, 60*time.Second, "pending refreshed to 0", func() bool { return r.Pending() == 0 })
	if n := rec.Get(outbox.GaugePending); n != 0 {
		t.Errorf("pending gauge %d, want 0", n)
	}
}

// After Run returns, Pending tells the rows still pending (here one held
// back by the failed row of its ordering key), not 0.
func TestRelayPendingAtShutdown(t *testing.T) {
	url := testenv.RequireAMQP(t)
	q := testenv.Queue(t, nil)
	store, add := sqliteStore(t)
	ctx := context.Background()
	add(ctx,
		outbox.Message{ID: "k-1", Exchange: testenv.Name(t, "no-such-exchange"), RoutingKey: q, OrderingKey: "k", Body: []byte("1")},
		outbox.Message{ID: "k-2", RoutingKey: q, OrderingKey: "k", Body: []byte("2")})
	pub, err := idemq.NewPublisher(idemq.PublisherConfig{URL: url, Dial: testenv.Dial})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	var rec idemq.Counters
	r, err := outbox.NewRelay(outbox.RelayConfig{Store: store, Publisher: pub, Ordered: true, MaxAttempts: 1, PublishTimeout: 2 * time.Second,
		StatsInterval: time.Hour, Recorder: &rec})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	testenv.Eventually(t, 60*time.Second, "k-1 failed", func() bool { return rec.Get(outbox.CountRelayFailed) == 1 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := r.Pending(); got != 1 {
		t.Errorf("Pending() after Run = %d, want 1 (k-2 is still pending)", got)
	}
	if got := rec.Get(outbox.GaugePending); got != 0 {
		t.Errorf("pending gauge after Run = %d, want 0 (a stopped relay reports no backlog)", got)
	}
}

// With the broker unreachable, a relay told to stop returns within its
// DrainTimeout, not after the whole PublishTimeout, and hands the rows in
// flight back untouched (pending, not failed).
func TestRelayStopsPromptlyWithBrokerUnreachable(t *testing.T) {
	store, add := sqliteStore(t)
	ctx := context.Background()
	add(ctx, outbox.Message{ID: "u-1", RoutingKey: "nowhere", Body: []byte("1")})
	dead := "amqp://guest:guest@127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)) + "/"
	pub, err := idemq.NewPublisher(idemq.PublisherConfig{URL: dead})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	var rec idemq.Counters
	publishing := make(chan struct{}, 1)
	r, err := outbox.NewRelay(outbox.RelayConfig{Store: store, Publisher: notify(pub, publishing), MaxAttempts: 1,
		PublishTimeout: 10 * time.Minute, StatsInterval: time.Hour, Recorder: &rec})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	select {
	case <-publishing:
	case <-time.After(60 * time.Second):
		t.Fatal("the relay did not start publishing")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not return within 60s of its context's end (it waits out the 10 min PublishTimeout)")
	}
	if n := rec.Get(outbox.CountRelayFailed); n != 0 {
		t.Errorf("%d rows marked failed, want 0: a row abandoned at shutdown is handed back", n)
	}
	if got := r.Pending(); got != 1 {
		t.Errorf("Pending() after Run = %d, want 1", got)
	}
}

type notifySender struct {
	s  idemq.Sender
	ch chan<- struct{}
}

func (n notifySender) Publish(ctx context.Context, m idemq.Message) error {
	select {
	case n.ch <- struct{}{}:
	default:
	}
	return n.s.Publish(ctx, m)
}

func notify(s idemq.Sender, ch chan<- struct{}) idemq.Sender { return notifySender{s, ch} }
