package idemq

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"testing"
	"time"
)

// The deadline costs one allocation per delivery for a handler that never
// waits on its context (it was five: a timer context, its timer, its cause
// and the wrapper asking the parent).
func TestHandlerDeadlineAllocations(t *testing.T) {
	c := &Consumer{cfg: ConsumerConfig{HandlerTimeout: time.Minute}.withDefaults(), log: slog.New(slog.DiscardHandler)}
	h := c.deadline(HandlerFunc(func(ctx context.Context, d *Delivery) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		_, _ = ctx.Deadline()
		return nil
	}))
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := &Delivery{ReceivedAt: time.Now()}
	// AllocsPerRun counts the whole process's allocations: the fewest of
	// three runs, so that goroutines left by other tests do not count.
	allocs := math.Inf(1)
	for range 3 {
		allocs = min(allocs, testing.AllocsPerRun(1000, func() {
			if err := h.Handle(parent, d); err != nil {
				t.Fatal(err)
			}
		}))
	}
	if allocs > 1 {
		t.Fatalf("%.1f allocations per delivery for the handler deadline, want ≤ 1", allocs)
	}
}

// The handler deadline around a handler that does not wait on its
// context, with 4 goroutines per core sharing the parent (as a consumer's do).
func BenchmarkHandlerDeadline(b *testing.B) {
	c := &Consumer{cfg: ConsumerConfig{}.withDefaults(), log: slog.New(slog.DiscardHandler)}
	h := c.deadline(HandlerFunc(func(ctx context.Context, d *Delivery) error { return ctx.Err() }))
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.ReportAllocs()
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		d := &Delivery{ReceivedAt: time.Now()}
		for pb.Next() {
			if err := h.Handle(parent, d); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// A handler that fails before its deadline fails with its own error, not
// a timeout: the failure policy dead-letters a poison message instead of
// requeueing it as cut at the consumer timeout. (The lazy context first
// read its Err after ending it, and every failure became a timeout.)
func TestHandlerFailureIsNotATimeout(t *testing.T) {
	errPlain := errors.New("plain failure")
	for _, cfg := range []ConsumerConfig{
		{},                          // the ConsumerTimeout bound only (the default)
		{HandlerTimeout: time.Hour}, // a HandlerTimeout of its own
	} {
		c := &Consumer{cfg: cfg.withDefaults(), log: slog.New(slog.DiscardHandler)}
		h := c.deadline(HandlerFunc(func(ctx context.Context, d *Delivery) error { return errPlain }))
		rec := &Counters{}
		err := h.Handle(WithRecorder(context.Background(), rec), &Delivery{ReceivedAt: time.Now()})
		var hte *HandlerTimeoutError
		if err != errPlain || errors.As(err, &hte) || errors.Is(err, ErrHandlerTimeout) {
			t.Fatalf("HandlerTimeout %v: a failed handler returned %v, want its own error unchanged", cfg.HandlerTimeout, err)
		}
		if n := rec.Get(CountHandlerTimeouts); n != 0 {
			t.Fatalf("HandlerTimeout %v: %d handler timeouts counted for a plain failure", cfg.HandlerTimeout, n)
		}
	}
}
