package idemq_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/backoff"
	"github.com/idemq/idemq/internal/testenv"
)

// runUntilReturn runs a consumer whose Run is expected to end on its own,
// and returns its error (nil also when it ran until the deadline).
func runUntilReturn(t *testing.T, cfg idemq.ConsumerConfig, within time.Duration) (error, bool) {
	t.Helper()
	cfg.Logger = quietLogger()
	cfg.Reconnect = backoff.Policy{Min: 10 * time.Millisecond, Max: 50 * time.Millisecond}
	cfg.Pipeline.Handler = idemq.HandlerFunc(func(context.Context, *idemq.Delivery) error { return nil })
	cfg.Dial = testenv.Dial
	c, err := idemq.NewConsumer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	err = c.Run(ctx)
	if c.Consuming() {
		t.Error("Consuming() true after Run returned")
	}
	return err, ctx.Err() == nil
}

func wrongUserURL(t *testing.T) string {
	u, err := url.Parse(testenv.RequireAMQP(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(testenv.Name(t, "no-such-user"), "wrong")
	return u.String()
}

// Permanent errors end Run at startup with an error that says so, instead
// of retrying for ever and returning nil at shutdown.
func TestRunFailsFastOnPermanentStartupErrors(t *testing.T) {
	amqpURL := testenv.RequireAMQP(t)
	tests := []struct {
		name     string
		cfg      idemq.ConsumerConfig
		wantCode int // an *amqp.Error code in the chain; 0: none
		wantIs   error
	}{
		{"access refused (user does not exist)", idemq.ConsumerConfig{URL: wrongUserURL(t), Queue: testenv.Queue(t, nil), LoginGrace: -1}, amqp.AccessRefused, nil},
		{"queue not found", idemq.ConsumerConfig{URL: amqpURL, Queue: testenv.Name(t, "missing-queue")}, amqp.NotFound, nil},
		{"invalid URL", idemq.ConsumerConfig{URL: "amqp://guest:pass/word@[::1", Queue: "q"}, 0, idemq.ErrInvalidURL},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.wantCode == amqp.AccessRefused {
				testenv.RequireRealBroker(t, "needs a refused login; the fake accepts any credentials")
			}
			err, ended := runUntilReturn(t, tt.cfg, 60*time.Second)
			if !ended {
				t.Fatalf("Run still retrying after 60s (returned %v)", err)
			}
			if !errors.Is(err, idemq.ErrStartup) {
				t.Fatalf("Run = %v, want an error matching ErrStartup", err)
			}
			var se *idemq.StartupError
			if !errors.As(err, &se) || !se.Permanent || se.Attempts != 1 {
				t.Fatalf("Run = %#v, want a permanent *StartupError after 1 attempt", err)
			}
			if tt.wantCode != 0 {
				var ae *amqp.Error
				if !errors.As(err, &ae) || ae.Code != tt.wantCode {
					t.Fatalf("Run = %v, want AMQP code %d in the chain", err, tt.wantCode)
				}
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Fatalf("Run = %v, want errors.Is %v", err, tt.wantIs)
			}
			if s := err.Error(); strings.Contains(s, ":wrong@") || strings.Contains(s, "pass/word") {
				t.Fatalf("error leaks the password: %s", s)
			}
		})
	}
}

// A refused login is retried for LoginGrace before it counts as permanent:
// a booting RabbitMQ node refuses logins (its user database not loaded
// yet) exactly as it refuses a wrong password. Here the consumer's
// password is accepted only from a moment after Run started, as after a
// broker restart, and the consumer subscribes; a user that never exists
// still ends Run, after the grace, as a permanent 403.
func TestLoginRefusedIsRetriedForLoginGrace(t *testing.T) {
	testenv.RequireRealBroker(t, "needs a refused login; the fake accepts any credentials")
	amqpURL := testenv.RequireAMQP(t)

	t.Run("login accepted during the grace", func(t *testing.T) {
		u, err := url.Parse(amqpURL)
		if err != nil {
			t.Fatal(err)
		}
		user := testenv.Name(t, "late-user")
		u.User = url.UserPassword(user, "late-pass")
		t.Cleanup(func() { _, _ = testenv.Rabbitmqctl("delete_user", user) })
		// The user and its permissions exist from the start with another
		// password: the consumer's login is refused (403) until the
		// password changes, and never meets a half-made user.
		for _, args := range [][]string{{"add_user", user, "not-yet"}, {"set_permissions", user, ".*", ".*", ".*"}} {
			if out, err := testenv.Rabbitmqctl(args...); err != nil {
				t.Fatalf("rabbitmqctl %v: %v: %s", args, err, out)
			}
		}
		q := testenv.Queue(t, nil)
		c, err := idemq.NewConsumer(idemq.ConsumerConfig{
			URL: u.String(), Queue: q, Logger: quietLogger(), Dial: testenv.Dial,
			// Longer than the default: rabbitmqctl alone takes several
			// seconds on a loaded machine, and the grace must outlast it.
			LoginGrace: 2 * time.Minute,
			Reconnect:  backoff.Policy{Min: 50 * time.Millisecond, Max: 200 * time.Millisecond},
			Pipeline:   idemq.Pipeline{Handler: idemq.HandlerFunc(func(context.Context, *idemq.Delivery) error { return nil })},
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		// The first login is refused; only then is the password changed,
		// well within the grace.
		testenv.Eventually(t, 90*time.Second, "a refused login counted as a reconnect", func() bool {
			select {
			case err := <-done:
				t.Fatalf("Run returned %v while the login was refused; want retries for LoginGrace", err)
			default:
			}
			return c.Counters().Get(idemq.CountReconnects) > 0
		})
		if out, err := testenv.Rabbitmqctl("change_password", user, "late-pass"); err != nil {
			t.Fatalf("rabbitmqctl change_password: %v: %s", err, out)
		}
		select {
		case <-c.Ready():
		case err := <-done:
			t.Fatalf("Run returned %v; want it to subscribe once the login is accepted", err)
		case <-ctx.Done():
			t.Fatal("no subscription within 3 min")
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run = %v after a clean stop", err)
		}
	})

	t.Run("user never exists", func(t *testing.T) {
		const grace = 5 * time.Second // a refused login takes the broker about 3 s to answer
		start := time.Now()
		err, ended := runUntilReturn(t, idemq.ConsumerConfig{URL: wrongUserURL(t), Queue: testenv.Queue(t, nil), LoginGrace: grace}, 60*time.Second)
		if !ended {
			t.Fatalf("Run still retrying after 60s (returned %v)", err)
		}
		var se *idemq.StartupError
		if !errors.As(err, &se) || !se.Permanent {
			t.Fatalf("Run = %v, want a permanent *StartupError", err)
		}
		// Without the grace the first refusal (about 3 s) ended Run.
		if took := time.Since(start); took < grace {
			t.Fatalf("permanent after %v and %d attempts; want retries for at least LoginGrace %v", took, se.Attempts, grace)
		}
		var ae *amqp.Error
		if !errors.As(err, &ae) || ae.Code != amqp.AccessRefused {
			t.Fatalf("Run = %v, want AMQP code 403 in the chain", err)
		}
	})
}

// A transient error (nothing listening) is retried, StartupAttempts times
// when set; unset, Run retries until its context ends and returns nil.
func TestRunStartupAttempts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close() // nothing listens there now: connection refused
	dead := "amqp://guest:guest@127.0.0.1:" + strconv.Itoa(port) + "/"

	err, ended := runUntilReturn(t, idemq.ConsumerConfig{URL: dead, Queue: "q", StartupAttempts: 3}, 60*time.Second)
	var se *idemq.StartupError
	if !ended || !errors.As(err, &se) || se.Permanent || se.Attempts != 3 {
		t.Fatalf("Run = %v (ended %v), want a non-permanent *StartupError after 3 attempts", err, ended)
	}

	err, ended = runUntilReturn(t, idemq.ConsumerConfig{URL: dead, Queue: "q"}, 2*time.Second)
	if ended || err != nil {
		t.Fatalf("Run without StartupAttempts = %v (ended early %v), want retries until the context ends, then nil", err, ended)
	}
}

// Consuming follows the subscription: true while consuming, false after
// Run returned.
func TestConsumingReportsSubscription(t *testing.T) {
	q := testenv.Queue(t, nil)
	c, stop := runConsumer(t, idemq.ConsumerConfig{Queue: q}, idemq.HandlerFunc(func(context.Context, *idemq.Delivery) error { return nil }))
	testenv.Eventually(t, 30*time.Second, "Consuming() true", c.Consuming)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if c.Consuming() {
		t.Fatal("Consuming() true after Run returned")
	}
}
