package backoff

import (
	"context"
	"testing"
	"time"
)

func TestDelayIsCappedAndGrows(t *testing.T) {
	p := Policy{Min: 10 * time.Millisecond, Max: 80 * time.Millisecond, NoJitter: true}
	want := []time.Duration{10, 20, 40, 80, 80, 80}
	for i, w := range want {
		if got := p.Delay(i); got != w*time.Millisecond {
			t.Errorf("Delay(%d) = %v, want %v", i, got, w*time.Millisecond)
		}
	}
	j := Policy{Min: 10 * time.Millisecond, Max: 80 * time.Millisecond}
	for i := 0; i < 100; i++ {
		d := j.Delay(i % 6)
		if d < 5*time.Millisecond || d > 80*time.Millisecond {
			t.Fatalf("jittered delay %v out of [5ms, 80ms]", d)
		}
	}
}

func TestSleepHonoursContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Sleep(ctx, time.Hour); err == nil {
		t.Fatal("Sleep on a cancelled context returned nil")
	}
}
