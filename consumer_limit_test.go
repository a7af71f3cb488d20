package idemq_test

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/backoff"
	"github.com/idemq/idemq/internal/testenv"
)

// quorumQueue declares a quorum queue named for the test, deleted at
// cleanup, after a policy setting its delivery-limit (0: no policy).
func quorumQueue(t *testing.T, policyLimit int) string {
	t.Helper()
	q := testenv.Name(t, "q")
	if policyLimit > 0 {
		testenv.SetPolicy(t, false, q+"-dl", "^"+regexp.QuoteMeta(q)+"$", `{"delivery-limit":`+strconv.Itoa(policyLimit)+`}`, 100)
	}
	if _, err := testenv.Channel(t).QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.DeleteQueue(q) })
	return q
}

// A management URL that cannot be read at startup is a clear error, never
// a silent fallback: permanent (wrong password, queue unknown to the API)
// ends Run at once; the API not answering is retried within
// StartupAttempts. The password is never shown.
func TestManagementURLUnreadableAtStartup(t *testing.T) {
	mu := testenv.RequireManagement(t)
	q := quorumQueue(t, 0)
	wrong, _ := url.Parse(mu)
	wrong.User = url.UserPassword(wrong.User.Username(), "s3cret-wrong")
	tests := []struct {
		name      string
		mgmt      string
		permanent bool
	}{
		{"wrong password", wrong.String(), true},
		{"nothing listening", "http://guest:s3cret-wrong@127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err, returned := runUntilReturn(t, idemq.ConsumerConfig{URL: testenv.RequireAMQP(t), Queue: q, ManagementURL: tt.mgmt,
				StartupAttempts: 2, ManagementTimeout: 3 * time.Second}, 30*time.Second)
			var se *idemq.StartupError
			if !returned || !errors.As(err, &se) || !errors.Is(err, idemq.ErrStartup) {
				t.Fatalf("Run = %v (returned %v), want a *StartupError", err, returned)
			}
			if se.Permanent != tt.permanent || (!tt.permanent && se.Attempts != 2) {
				t.Fatalf("Run = %#v, want permanent %v", se, tt.permanent)
			}
			if !strings.Contains(err.Error(), "delivery limit") || strings.Contains(err.Error(), "s3cret-wrong") {
				t.Fatalf("error %q: want it to name the delivery limit, never the password", err)
			}
		})
	}
	if _, err := idemq.NewConsumer(idemq.ConsumerConfig{Queue: q, ManagementURL: "amqp://guest:s3cret@h/",
		Pipeline: idemq.Pipeline{Handler: idemq.HandlerFunc(func(context.Context, *idemq.Delivery) error { return nil })}}); err == nil ||
		strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("NewConsumer with an amqp:// management URL: %v, want an error without the password", err)
	}
}

// The consumer reads the queue's delivery limit at startup and again
// after a reconnect (a policy changed in between), logs it at info with
// its source, and hands it over with each delivery.
func TestConsumerReadsTheDeliveryLimitAtEachConnect(t *testing.T) {
	mu := testenv.RequireManagement(t)
	q := quorumQueue(t, 4)
	proxy, amqpURL := testenv.AMQPProxy(t)
	var logs logBuffer
	seen := make(chan int, 16)
	c, err := idemq.NewConsumer(idemq.ConsumerConfig{URL: amqpURL, Dial: testenv.Dial, Queue: q, ManagementURL: mu,
		ManagementRefresh: -1, // only at each connect: the reconnect must read the new limit
		Logger:            slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Reconnect:         backoff.Policy{Min: 10 * time.Millisecond, Max: 100 * time.Millisecond},
		Pipeline: idemq.Pipeline{Handler: idemq.HandlerFunc(func(_ context.Context, d *idemq.Delivery) error {
			seen <- d.QueueDeliveryLimit
			return nil
		})}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-stopped })
	select {
	case <-c.Ready():
	case err := <-stopped:
		t.Fatalf("Run = %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("consumer not ready")
	}
	if l := logs.lines("queue delivery limit", `limit="4 (policy `+q+`-dl)"`, "source=policy"); len(l) != 1 {
		t.Fatalf("want one info line with the limit and its source; log:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), "guest:guest") {
		t.Fatalf("the log shows the management password:\n%s", logs.String())
	}
	testenv.Publish(t, "", q, amqp.Publishing{MessageId: "dl-1"})
	if got := <-seen; got != 4 {
		t.Fatalf("Delivery.QueueDeliveryLimit = %d, want 4", got)
	}

	// The policy changes to 3; once the management API shows it, the
	// connection is cut: the consumer reads 3 when it reconnects.
	testenv.SetPolicy(t, false, q+"-dl", "^"+regexp.QuoteMeta(q)+"$", `{"delivery-limit":3}`, 100)
	testenv.Eventually(t, 30*time.Second, "the API to show the new policy", func() bool {
		return testenv.ManagementQueueField(t, q, "effective_policy_definition") == `{"delivery-limit":3}`
	})
	proxy.Cut()
	testenv.Eventually(t, 30*time.Second, "the new limit logged", func() bool {
		return len(logs.lines("queue delivery limit", `limit="3 (policy `+q+`-dl)"`)) == 1
	})
	testenv.Publish(t, "", q, amqp.Publishing{MessageId: "dl-2"})
	if got := <-seen; got != 3 {
		t.Fatalf("after the reconnect Delivery.QueueDeliveryLimit = %d, want 3", got)
	}
}

// A running consumer reads the limit again every ManagementRefresh: a
// policy lowered while it runs counts without a reconnect.
func TestConsumerRefreshesTheDeliveryLimit(t *testing.T) {
	mu := testenv.RequireManagement(t)
	q := quorumQueue(t, 6)
	var logs logBuffer
	c, err := idemq.NewConsumer(idemq.ConsumerConfig{URL: testenv.RequireAMQP(t), Dial: testenv.Dial, Queue: q, ManagementURL: mu,
		ManagementRefresh: 300 * time.Millisecond,
		Logger:            slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Pipeline:          idemq.Pipeline{Handler: idemq.HandlerFunc(func(context.Context, *idemq.Delivery) error { return nil })}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-stopped })
	select {
	case <-c.Ready():
	case err := <-stopped:
		t.Fatalf("Run = %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("consumer not ready")
	}
	if len(logs.lines("queue delivery limit", `limit="6 (policy `)) != 1 {
		t.Fatalf("want the limit 6 logged once:\n%s", logs.String())
	}
	testenv.SetPolicy(t, false, q+"-dl", "^"+regexp.QuoteMeta(q)+"$", `{"delivery-limit":2}`, 100)
	testenv.Eventually(t, 30*time.Second, "the new limit read without a reconnect", func() bool {
		return len(logs.lines("queue delivery limit", `limit="2 (policy `)) == 1
	})
	if n := c.Counters().Get(idemq.CountReconnects); n != 0 {
		t.Fatalf("%d reconnects: the limit must have been read by the refresh", n)
	}
}

// A consumer timeout the broker shows for the queue (here its
// x-consumer-timeout argument, 8 s) bounds the handlers when it is shorter
// than ConsumerTimeout (default 30 min): a handler that never returns has
// its context cancelled one margin (a quarter of it) before, not at the
// 30 min bound; a warning says so once.
func TestQueueConsumerTimeoutBoundsHandlers(t *testing.T) {
	mu := testenv.RequireManagement(t)
	q := testenv.Name(t, "q")
	if _, err := testenv.Channel(t).QueueDeclare(q, true, false, false, false, amqp.Table{"x-consumer-timeout": int64(8000)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.DeleteQueue(q) })
	var logs logBuffer
	cancelledAfter := make(chan time.Duration, 1)
	c, err := idemq.NewConsumer(idemq.ConsumerConfig{URL: testenv.RequireAMQP(t), Dial: testenv.Dial, Queue: q, ManagementURL: mu,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Pipeline: idemq.Pipeline{Handler: idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
			start := time.Now()
			select {
			case <-ctx.Done():
				select {
				case cancelledAfter <- time.Since(start):
				default:
				}
				return ctx.Err()
			case <-time.After(time.Minute):
				return errors.New("not cancelled within a minute")
			}
		})}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-stopped })
	select {
	case <-c.Ready():
	case err := <-stopped:
		t.Fatalf("Run = %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("consumer not ready")
	}
	if l := logs.lines("shorter consumer timeout", "consumer_timeout=8s", `source="argument x-consumer-timeout"`); len(l) != 1 {
		t.Fatalf("want one warning with the queue's consumer timeout; log:\n%s", logs.String())
	}
	testenv.Publish(t, "", q, amqp.Publishing{MessageId: "ct-1"})
	select {
	case d := <-cancelledAfter:
		if d < 4*time.Second || d > 7500*time.Millisecond {
			t.Fatalf("handler cancelled after %v, want about 6 s (8 s minus a 2 s margin)", d)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("handler not cancelled within 30 s; log:\n%s", logs.String())
	}
}
