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
		{"access refused (user does not exist)", idemq.ConsumerConfig{URL: wrongUserURL(t), Queue: testenv.Queue(t, nil)}, amqp.AccessRefused, nil},
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
