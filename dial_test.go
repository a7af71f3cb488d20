package idemq_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/backoff"
)

// lockedBuffer collects log output written from several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// badURLs are AMQP URLs amqp091-go cannot parse, each with a password its
// parse error would quote.
func badURLs(secret string) []string {
	return []string{
		"amqp://app:" + secret + "@127.0.0.1:notaport/",
		"amqp://app:a/" + secret + "@127.0.0.1:5672/",
		"amqp://app:" + secret + " x@127.0.0.1:5672/",
		"amqq://app:" + secret + "@127.0.0.1:5672/",
		"amqp://app:" + secret + "@127.0.0.1:5672/?heartbeat=x",
	}
}

func showsSecret(s, secret string) bool {
	return strings.Contains(s, secret) || strings.Contains(s, url.QueryEscape(secret))
}

// TestDialErrorsDoNotShowThePassword: a consumer and a publisher dialing a
// malformed URL log and return an error that names the URL redacted, never
// its password (amqp091-go's parse error quotes the whole URL).
func TestDialErrorsDoNotShowThePassword(t *testing.T) {
	const secret = "Pl4nted-S3cret"
	for _, u := range badURLs(secret) {
		t.Run(u, func(t *testing.T) {
			var logs lockedBuffer
			log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))

			c, err := idemq.NewConsumer(idemq.ConsumerConfig{URL: u, Queue: "q", Logger: log,
				Reconnect: backoff.Policy{Min: time.Millisecond, Max: time.Millisecond},
				Pipeline:  idemq.Pipeline{Handler: idemq.HandlerFunc(func(context.Context, *idemq.Delivery) error { return nil })}})
			if err != nil {
				if showsSecret(err.Error(), secret) {
					t.Fatalf("NewConsumer error shows the password: %v", err)
				}
			} else {
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				var runErr error
				go func() { runErr = c.Run(ctx); close(done) }()
				deadline := time.Now().Add(10 * time.Second)
				for strings.Count(logs.String(), "reconnecting") < 2 && time.Now().Before(deadline) {
					select {
					case <-done:
						deadline = time.Now()
					case <-time.After(5 * time.Millisecond):
					}
				}
				cancel()
				<-done
				// A permanent error (invalid URL, access refused) ends Run at
				// startup: its error must not show the password either.
				if runErr != nil && showsSecret(runErr.Error(), secret) {
					t.Fatalf("Run error shows the password: %v", runErr)
				}
				if runErr == nil && !strings.Contains(logs.String(), "reconnecting") {
					t.Fatalf("the consumer neither failed nor logged a failed session:\n%s", logs.String())
				}
			}

			p, err := idemq.NewPublisher(idemq.PublisherConfig{URL: u, Logger: log, MaxAttempts: 2, Retry: backoff.Policy{Min: time.Millisecond, Max: time.Millisecond}})
			if err != nil {
				// Refused at construction (a URL that does not parse):
				// that error must not show it either.
				if showsSecret(err.Error(), secret) {
					t.Fatalf("NewPublisher error shows the password: %v", err)
				}
				return
			}
			defer p.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			perr := p.Publish(ctx, idemq.Message{ID: "m-1", RoutingKey: "q", Body: []byte("x")})
			if perr == nil {
				t.Fatal("publish through a malformed URL succeeded")
			}
			for _, e := range []error{perr, errors.Unwrap(perr)} {
				if e != nil && showsSecret(e.Error(), secret) {
					t.Errorf("publish error shows the password: %v", e)
				}
			}
			if showsSecret(logs.String(), secret) {
				t.Errorf("logs show the password:\n%s", logs.String())
			}
			if !strings.Contains(perr.Error()+logs.String(), "xxxxx") {
				t.Errorf("the error does not name the (redacted) URL: %v", perr)
			}
		})
	}
}
