package main

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

func TestEveryCallsUntilStopped(t *testing.T) {
	var n atomic.Int64
	stop := every(context.Background(), time.Millisecond, func() { n.Add(1) })
	deadline := time.Now().Add(5 * time.Second)
	for n.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	stop() // returns once no call runs and none will
	after := n.Load()
	if after < 3 {
		t.Fatalf("%d calls in 5s, want at least 3", after)
	}
	time.Sleep(50 * time.Millisecond)
	if got := n.Load(); got != after {
		t.Fatalf("%d calls after stop, want none", got-after)
	}
}

func TestEveryWithoutIntervalNeverCalls(t *testing.T) {
	stop := every(context.Background(), 0, func() { t.Error("called") })
	time.Sleep(10 * time.Millisecond)
	stop()
}
