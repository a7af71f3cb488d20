package acker

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestRequeuerLaterAndFlush(t *testing.T) {
	m := newModel(3)
	a := New(m, Config{})
	defer a.Abandon()
	for tag := uint64(1); tag <= 3; tag++ {
		if err := a.Register(tag); err != nil {
			t.Fatal(err)
		}
	}
	var n atomic.Int32
	r := NewRequeuer(a, func() { n.Add(1) })
	r.Later(1, 0)         // at once
	r.Later(2, time.Hour) // waits: given back by Flush
	r.Later(3, time.Millisecond)
	deadline := time.Now().Add(10 * time.Second)
	for n.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n.Load() != 2 || r.Pending() != 1 {
		t.Fatalf("requeued %d, pending %d; want 2 and 1", n.Load(), r.Pending())
	}
	r.Flush()
	if n.Load() != 3 || r.Pending() != 0 {
		t.Fatalf("after Flush: requeued %d, pending %d; want 3 and 0", n.Load(), r.Pending())
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.violations) != 0 || m.nacked[1] != 1 || m.nacked[2] != 1 || m.nacked[3] != 1 {
		t.Fatalf("violations %v, nacked %v", m.violations, m.nacked)
	}
}
