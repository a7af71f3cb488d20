package breaker_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/backoff"
	"github.com/idemq/idemq/internal/breaker"
)

// testBreaker is a breaker wired to idemq's error classes and counters as
// the consumer wires it, with idemq.BreakerConfig's defaults.
func testBreaker(cfg breaker.Config) (*breaker.Breaker, *idemq.Counters) {
	var c idemq.Counters
	cfg.Backoff = backoff.Policy{Min: 5 * time.Millisecond, Max: 20 * time.Millisecond}
	cfg.Threshold = max(cfg.Threshold, 1)
	cfg.ProbeTimeout = 5 * time.Second
	cfg.IsOutage = idemq.IsUnavailable
	cfg.Opened = func() { c.Add(idemq.CountDependencyOutages, 1) }
	cfg.Closed = func(outage time.Duration) { c.Add(idemq.CountPausedMillis, outage.Milliseconds()) }
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	return breaker.New(cfg), &c
}

// waitGate polls the gate until it lets deliveries through (or not).
func waitGate(t *testing.T, b *breaker.Breaker, in chan amqp.Delivery, open bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, wake := b.Gate(context.Background(), in)
		if (got != nil) == open {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("gate open=%v never came", open)
		}
		select {
		case <-wake:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

var errDown = idemq.Unavailable("database", errors.New("connection refused"))

func TestBreakerThresholdAndProbe(t *testing.T) {
	var up atomic.Bool
	b, c := testBreaker(breaker.Config{Threshold: 2, Probes: []func(context.Context) error{
		func(context.Context) error {
			if up.Load() {
				return nil
			}
			return errDown
		},
	}})
	in := make(chan amqp.Delivery)
	b.Report(errDown)
	b.Report(nil) // a success in between resets the count
	b.Report(errDown)
	if b.Paused() {
		t.Fatal("paused below the threshold")
	}
	b.Report(errors.New("constraint violation")) // not unavailable: neutral
	b.Report(errDown)
	if !b.Paused() {
		t.Fatal("not paused after 2 consecutive unavailable outcomes")
	}
	if got, _ := b.Gate(context.Background(), in); got != nil {
		t.Fatal("gate lets deliveries through while open")
	}
	b.Report(errDown) // in-flight ones reporting again: still one outage
	up.Store(true)
	waitGate(t, b, in, true)
	if b.Paused() {
		t.Fatal("still paused after the probe succeeded")
	}
	if n := c.Get(idemq.CountDependencyOutages); n != 1 {
		t.Fatalf("dependency_outages = %d, want 1", n)
	}
	if c.Get(idemq.CountPausedMillis) < 0 {
		t.Fatal("paused_ms negative")
	}
}

func TestBreakerHalfOpenTrial(t *testing.T) {
	b, c := testBreaker(breaker.Config{})
	in := make(chan amqp.Delivery)
	b.Report(errDown)
	if !b.Paused() {
		t.Fatal("not paused")
	}
	for round := 0; round < 3; round++ {
		waitGate(t, b, in, true) // half-open: one trial
		b.Dispatched()
		if got, _ := b.Gate(context.Background(), in); got != nil {
			t.Fatal("a second delivery let through while the trial is out")
		}
		b.Report(errDown) // the trial failed: open again
		if got, _ := b.Gate(context.Background(), in); got != nil {
			t.Fatal("gate open right after a failed trial")
		}
	}
	waitGate(t, b, in, true)
	b.Dispatched()
	b.Report(errors.New("bad body")) // says nothing: another trial
	waitGate(t, b, in, true)
	b.Dispatched()
	b.Report(nil)
	if b.Paused() {
		t.Fatal("still paused after a successful trial")
	}
	if n := c.Get(idemq.CountDependencyOutages); n != 1 {
		t.Fatalf("dependency_outages = %d, want 1", n)
	}
}

func TestBreakerDisabled(t *testing.T) {
	b, _ := testBreaker(breaker.Config{Disabled: true})
	in := make(chan amqp.Delivery)
	b.Report(errDown)
	if got, _ := b.Gate(context.Background(), in); got == nil || b.Paused() {
		t.Fatal("a disabled breaker paused")
	}
}
