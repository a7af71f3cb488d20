package idemq

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/backoff"
)

func testBreaker(cfg BreakerConfig) (*breaker, *Counters) {
	var c Counters
	cfg.Backoff = backoff.Policy{Min: 5 * time.Millisecond, Max: 20 * time.Millisecond}
	return newBreaker(cfg, &c, slog.New(slog.NewTextHandler(io.Discard, nil))), &c
}

// waitGate polls the gate until it lets deliveries through (or not).
func waitGate(t *testing.T, b *breaker, in chan amqp.Delivery, open bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, wake := b.gate(context.Background(), in)
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

var errDown = Unavailable("database", errors.New("connection refused"))

func TestBreakerThresholdAndProbe(t *testing.T) {
	var up atomic.Bool
	b, c := testBreaker(BreakerConfig{Threshold: 2, Probes: []func(context.Context) error{
		func(context.Context) error {
			if up.Load() {
				return nil
			}
			return errDown
		},
	}})
	in := make(chan amqp.Delivery)
	b.report(errDown)
	b.report(nil) // a success in between resets the count
	b.report(errDown)
	if b.paused() {
		t.Fatal("paused below the threshold")
	}
	b.report(errors.New("constraint violation")) // not unavailable: neutral
	b.report(errDown)
	if !b.paused() {
		t.Fatal("not paused after 2 consecutive unavailable outcomes")
	}
	if got, _ := b.gate(context.Background(), in); got != nil {
		t.Fatal("gate lets deliveries through while open")
	}
	b.report(errDown) // in-flight ones reporting again: still one outage
	up.Store(true)
	waitGate(t, b, in, true)
	if b.paused() {
		t.Fatal("still paused after the probe succeeded")
	}
	if n := c.Get(CountDependencyOutages); n != 1 {
		t.Fatalf("dependency_outages = %d, want 1", n)
	}
	if c.Get(CountPausedMillis) < 0 {
		t.Fatal("paused_ms negative")
	}
}

func TestBreakerHalfOpenTrial(t *testing.T) {
	b, c := testBreaker(BreakerConfig{})
	in := make(chan amqp.Delivery)
	b.report(errDown)
	if !b.paused() {
		t.Fatal("not paused")
	}
	for round := 0; round < 3; round++ {
		waitGate(t, b, in, true) // half-open: one trial
		b.dispatched()
		if got, _ := b.gate(context.Background(), in); got != nil {
			t.Fatal("a second delivery let through while the trial is out")
		}
		b.report(errDown) // the trial failed: open again
		if got, _ := b.gate(context.Background(), in); got != nil {
			t.Fatal("gate open right after a failed trial")
		}
	}
	waitGate(t, b, in, true)
	b.dispatched()
	b.report(errors.New("bad body")) // says nothing: another trial
	waitGate(t, b, in, true)
	b.dispatched()
	b.report(nil)
	if b.paused() {
		t.Fatal("still paused after a successful trial")
	}
	if n := c.Get(CountDependencyOutages); n != 1 {
		t.Fatalf("dependency_outages = %d, want 1", n)
	}
}

func TestBreakerDisabled(t *testing.T) {
	b, _ := testBreaker(BreakerConfig{Disabled: true})
	in := make(chan amqp.Delivery)
	b.report(errDown)
	if got, _ := b.gate(context.Background(), in); got == nil || b.paused() {
		t.Fatal("a disabled breaker paused")
	}
}
