package idemq

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/breaker"
)

func askBreaker(probe func(context.Context) error, cfg BreakerConfig) *breaker.Breaker {
	cfg.Probes = []func(context.Context) error{probe}
	return newBreaker(cfg, &Counters{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

func TestAskClassifies(t *testing.T) {
	down := errors.New("connection refused")
	plain := errors.New("server error: FATAL: database is not currently accepting connections (SQLSTATE 55000)")
	for _, tt := range []struct {
		name    string
		err     error
		probe   error
		outage  bool
		askable bool
	}{
		{"plain error, probe fails: an outage", plain, down, true, true},
		{"plain error, probe passes: the message's failure", plain, nil, false, true},
		{"handler timeout (a stall), probe fails", &HandlerTimeoutError{Err: context.DeadlineExceeded}, down, true, true},
		{"permanent: never asked", Permanent(plain), down, false, false},
		{"reject: never asked", Reject(ReasonUnparseable, plain), down, false, false},
		{"duplicate: never asked", ErrDuplicate, down, false, false},
		{"deferral: never asked", RequeueInPlace(time.Second, "x", plain), down, false, false},
		{"panic: never asked", &PanicError{Value: "boom"}, down, false, false},
		{"already an outage", Unavailable("db", plain), down, true, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var asked atomic.Int32
			b := askBreaker(func(context.Context) error { asked.Add(1); return tt.probe }, BreakerConfig{})
			got := b.Ask(context.Background(), tt.err)
			if IsUnavailable(got) != tt.outage {
				t.Errorf("ask(%v) = %v: outage %v, want %v", tt.err, got, IsUnavailable(got), tt.outage)
			}
			if (asked.Load() > 0) != tt.askable {
				t.Errorf("probe ran %d times, askable %v", asked.Load(), tt.askable)
			}
			if !errors.Is(got, tt.err) && tt.err != ErrDuplicate {
				t.Errorf("ask lost the cause: %v", got)
			}
		})
	}
}

// A probe that does not answer within AskTimeout says the dependency is
// down (a stall); concurrent failures share one probe run (and its answer
// for AskReuse); a stopping
// consumer's failures are not asked about; AskTimeout < 0 never asks.
func TestAskStallsSharingAndOff(t *testing.T) {
	plain := errors.New("timeout: context deadline exceeded")
	var runs atomic.Int32
	release := make(chan struct{})
	b := askBreaker(func(ctx context.Context) error {
		runs.Add(1)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, BreakerConfig{AskTimeout: 300 * time.Millisecond, AskReuse: time.Minute})
	var wg sync.WaitGroup
	outages := atomic.Int32{}
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if IsUnavailable(b.Ask(context.Background(), plain)) {
				outages.Add(1)
			}
		}()
	}
	wg.Wait()
	if runs.Load() != 1 || outages.Load() != 10 {
		t.Fatalf("probe ran %d times for 10 concurrent failures, %d outages; want 1 and 10", runs.Load(), outages.Load())
	}
	close(release)
	stopped, cancel := context.WithCancel(context.Background())
	cancel()
	before := runs.Load()
	if err := b.Ask(stopped, plain); IsUnavailable(err) || runs.Load() != before {
		t.Fatalf("a stopping consumer's failure was asked about: %v", err)
	}
	off := askBreaker(func(context.Context) error { t.Error("asked with AskTimeout < 0"); return nil }, BreakerConfig{AskTimeout: -1})
	if err := off.Ask(context.Background(), plain); err != plain {
		t.Fatalf("AskTimeout < 0: %v", err)
	}
}

type probedHandler struct{ probed *atomic.Int32 }

func (h probedHandler) Handle(context.Context, *Delivery) error { return nil }
func (h probedHandler) Probe(context.Context) error             { h.probed.Add(1); return nil }

// The probes of the pipeline's layers (Prober) join the breaker's own.
func TestLayerProbesJoinTheBreaker(t *testing.T) {
	var n atomic.Int32
	own := func(context.Context) error { n.Add(10); return nil }
	c, err := NewConsumer(ConsumerConfig{URL: "amqp://guest:guest@127.0.0.1:1/", Queue: "q",
		Pipeline: Pipeline{Handler: probedHandler{&n}}, Breaker: BreakerConfig{Probes: []func(context.Context) error{own}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := len(c.brk.Config().Probes); got != 2 {
		t.Fatalf("%d probes, want the handler's and the configured one", got)
	}
	if err := c.brk.AskProbes(); err != nil || n.Load() != 11 {
		t.Fatalf("probes ran %d (err %v), want both", n.Load(), err)
	}
}

// A probe that ignores its context, or panics, answers "down" at
// AskTimeout: it never holds the failing workers.
func TestAskProbeIgnoringItsContextOrPanicking(t *testing.T) {
	plain := errors.New("plain")
	block := make(chan struct{})
	defer close(block)
	b := askBreaker(func(context.Context) error { <-block; return nil }, BreakerConfig{AskTimeout: 100 * time.Millisecond})
	done := make(chan error, 1)
	go func() { done <- b.Ask(context.Background(), plain) }()
	select {
	case err := <-done:
		if !IsUnavailable(err) {
			t.Fatalf("a probe that never answers: %v, want an outage", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ask held by a probe that ignores its context")
	}
	p := askBreaker(func(context.Context) error { panic("boom") }, BreakerConfig{})
	if err := p.Ask(context.Background(), plain); !IsUnavailable(err) {
		t.Fatalf("a panicking probe: %v, want an outage", err)
	}
}
