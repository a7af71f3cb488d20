package acker

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// modelChannel applies AMQP 0-9-1 acknowledgement semantics to a set of
// outstanding tags and records every violation that would make RabbitMQ close
// the channel with PRECONDITION_FAILED.
type modelChannel struct {
	mu          sync.Mutex
	outstanding map[uint64]bool
	acked       map[uint64]int
	nacked      map[uint64]int
	frames      int
	violations  []string
}

func newModel(n int) *modelChannel {
	m := &modelChannel{outstanding: map[uint64]bool{}, acked: map[uint64]int{}, nacked: map[uint64]int{}}
	for t := 1; t <= n; t++ {
		m.outstanding[uint64(t)] = true
	}
	return m
}

func (m *modelChannel) Ack(tag uint64, multiple bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.frames++
	if !m.outstanding[tag] {
		m.violations = append(m.violations, fmt.Sprintf("ack of unknown tag %d (multiple=%v)", tag, multiple))
		return nil
	}
	if multiple {
		for t := range m.outstanding {
			if t <= tag {
				delete(m.outstanding, t)
				m.acked[t]++
			}
		}
		return nil
	}
	delete(m.outstanding, tag)
	m.acked[tag]++
	return nil
}

func (m *modelChannel) Nack(tag uint64, multiple, requeue bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.frames++
	if multiple {
		m.violations = append(m.violations, "nack with multiple=true")
	}
	if !m.outstanding[tag] {
		m.violations = append(m.violations, fmt.Sprintf("nack of unknown tag %d", tag))
		return nil
	}
	delete(m.outstanding, tag)
	m.nacked[tag]++
	return nil
}

// TestRandomCompletionOrders is property-style: many random completion orders
// and ack/nack mixes, each one must settle every tag exactly once, with the
// right kind of frame, and never touch an unknown tag.
func TestRandomCompletionOrders(t *testing.T) {
	for seed := uint64(1); seed <= 300; seed++ {
		rng := rand.New(rand.NewPCG(seed, seed*7919))
		n := 1 + rng.IntN(400)
		m := newModel(n)
		a := New(m, Config{MaxBatch: 1 + rng.IntN(60), FlushInterval: time.Millisecond, StuckAfter: time.Duration(rng.IntN(3)) * time.Millisecond})
		for tag := 1; tag <= n; tag++ {
			if err := a.Register(uint64(tag)); err != nil {
				t.Fatal(err)
			}
		}
		order := rng.Perm(n)
		wantNack := map[uint64]bool{}
		var wg sync.WaitGroup
		workers := 1 + rng.IntN(8)
		next := make(chan int)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					tag := uint64(i + 1)
					if i%11 == 3 {
						if err := a.Nack(tag, i%2 == 0); err != nil {
							t.Errorf("seed %d: nack %d: %v", seed, tag, err)
						}
						continue
					}
					if err := a.Ack(tag); err != nil {
						t.Errorf("seed %d: ack %d: %v", seed, tag, err)
					}
				}
			}()
		}
		for _, i := range order {
			if i%11 == 3 {
				wantNack[uint64(i+1)] = true
			}
			next <- i
		}
		close(next)
		wg.Wait()
		a.Close()

		m.mu.Lock()
		if len(m.violations) > 0 {
			t.Fatalf("seed %d: violations: %v", seed, m.violations)
		}
		if len(m.outstanding) != 0 {
			t.Fatalf("seed %d: %d tags left unacked", seed, len(m.outstanding))
		}
		for tag := uint64(1); tag <= uint64(n); tag++ {
			a, k := m.acked[tag], m.nacked[tag]
			if a+k != 1 {
				t.Fatalf("seed %d: tag %d settled %d times (ack %d, nack %d)", seed, tag, a+k, a, k)
			}
			if wantNack[tag] != (k == 1) {
				t.Fatalf("seed %d: tag %d: nacked=%v, want %v", seed, tag, k == 1, wantNack[tag])
			}
		}
		m.mu.Unlock()
	}
}

func TestNeverAcksAnOutstandingTag(t *testing.T) {
	m := newModel(3)
	a := New(m, Config{MaxBatch: 1, FlushInterval: time.Millisecond, StuckAfter: time.Hour})
	for tag := uint64(1); tag <= 3; tag++ {
		_ = a.Register(tag)
	}
	// Tag 1 is still in a worker's hands; 2 and 3 finish.
	_ = a.Ack(2)
	_ = a.Ack(3)
	deadline := time.Now().Add(50 * time.Millisecond)
	for time.Now().Before(deadline) {
		m.mu.Lock()
		if !m.outstanding[1] {
			m.mu.Unlock()
			t.Fatal("tag 1 was acknowledged while still in flight")
		}
		m.mu.Unlock()
		time.Sleep(time.Millisecond)
	}
	_ = a.Ack(1)
	a.Close()
	if len(m.outstanding) != 0 || m.frames != 1 {
		t.Fatalf("want one multiple-ack for 3 tags, got %d frames, %d outstanding", m.frames, len(m.outstanding))
	}
}

func TestStuckTagsAreAckedIndividually(t *testing.T) {
	m := newModel(3)
	a := New(m, Config{MaxBatch: 50, FlushInterval: time.Millisecond, StuckAfter: 5 * time.Millisecond})
	defer a.Close()
	for tag := uint64(1); tag <= 3; tag++ {
		_ = a.Register(tag)
	}
	_ = a.Ack(2)
	_ = a.Ack(3)
	deadline := time.Now().Add(5 * time.Second)
	for {
		m.mu.Lock()
		done := m.acked[2] == 1 && m.acked[3] == 1
		still := m.outstanding[1]
		m.mu.Unlock()
		if done {
			if !still {
				t.Fatal("tag 1 acked while outstanding")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("tags behind a stuck predecessor were never acknowledged")
		}
		time.Sleep(time.Millisecond)
	}
	_ = a.Ack(1)
}

func TestDoubleDecisionAndClosed(t *testing.T) {
	m := newModel(2)
	a := New(m, Config{})
	_ = a.Register(1)
	_ = a.Register(2)
	if err := a.Ack(1); err != nil {
		t.Fatal(err)
	}
	if err := a.Ack(1); err != ErrUnknownTag {
		t.Fatalf("second ack: %v, want ErrUnknownTag", err)
	}
	if err := a.Register(2); err != ErrUnknownTag {
		t.Fatalf("re-register: %v, want ErrUnknownTag", err)
	}
	a.Abandon()
	if err := a.Ack(2); err != ErrClosed {
		t.Fatalf("ack after Abandon: %v, want ErrClosed", err)
	}
}

// TestMemoryBoundedBehindStuckTag: one tag stays in a worker's hands while
// 200,000 deliveries after it are acked, with the broker keeping at most a
// prefetch window of unacked deliveries on the channel (as RabbitMQ does).
// The acked ones are acknowledged on their own once stuck, and the Acker
// must forget them: what it holds stays bounded by the window, not by how
// many deliveries went past the stuck one. Every tag is settled exactly once,
// the stuck one last.
func TestMemoryBoundedBehindStuckTag(t *testing.T) {
	const (
		window = 200     // the channel's prefetch
		after  = 200_000 // deliveries acked past the stuck tag
	)
	n := after + 1
	m := newModel(n)
	// The test drives the flush timer itself (tick), so the background one
	// never fires.
	a := New(m, Config{MaxBatch: 50, FlushInterval: time.Hour, StuckAfter: time.Millisecond})
	defer a.Abandon()
	if err := a.Register(1); err != nil { // the stuck handler's delivery
		t.Fatal(err)
	}
	maxLen := 0
	next := uint64(2)
	for next <= uint64(n) {
		// The broker sends up to the prefetch window of unacked deliveries.
		m.mu.Lock()
		room := window - len(m.outstanding) + (n - int(next) + 1)
		m.mu.Unlock()
		if room <= 0 {
			t.Fatalf("tag %d: the window is full and nothing settles it (%d tags held)", next, a.Len())
		}
		for ; room > 0 && next <= uint64(n); room, next = room-1, next+1 {
			if err := a.Register(next); err != nil {
				t.Fatal(err)
			}
			if err := a.Ack(next); err != nil {
				t.Fatal(err)
			}
		}
		// Every acked tag is now older than StuckAfter.
		a.tick(time.Now().Add(time.Second))
		if l := a.Len(); l > maxLen {
			maxLen = l
		}
	}
	if maxLen > window+1 {
		t.Fatalf("the acker held up to %d tags behind one stuck tag (window %d): its memory grows with every delivery", maxLen, window)
	}
	m.mu.Lock()
	if !m.outstanding[1] || len(m.outstanding) != 1 {
		t.Fatalf("want only the stuck tag unacked, have %d unacked (tag 1 unacked: %v)", len(m.outstanding), m.outstanding[1])
	}
	m.mu.Unlock()
	if err := a.Ack(1); err != nil {
		t.Fatal(err)
	}
	a.Close()
	if l := a.Len(); l != 0 {
		t.Fatalf("%d tags held after Close", l)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.violations) > 0 {
		t.Fatalf("violations: %v", m.violations[:min(5, len(m.violations))])
	}
	for tag := uint64(1); tag <= uint64(n); tag++ {
		if m.acked[tag] != 1 {
			t.Fatalf("tag %d acked %d times", tag, m.acked[tag])
		}
	}
}

// TestModelPrefetchWindow is a randomized model test of the Acker as the
// consumer drives it: the broker keeps at most a prefetch window of unacked
// deliveries on the channel, workers settle them in random order (some are
// held for a long time, some nacked), and the flush timer fires at random
// moments. After every step: the Acker holds no more tags than the broker
// has unacked (so never more than the window), and nothing violates the
// protocol; at the end every tag is settled exactly once with the right kind
// of frame.
func TestModelPrefetchWindow(t *testing.T) {
	for seed := uint64(1); seed <= 100; seed++ {
		rng := rand.New(rand.NewPCG(seed, seed*104729))
		n := 1 + rng.IntN(1500)
		window := 1 + rng.IntN(100)
		m := newModel(n)
		a := New(m, Config{MaxBatch: 1 + rng.IntN(60), FlushInterval: time.Hour, StuckAfter: time.Duration(rng.IntN(3)) * time.Millisecond})
		var held []uint64 // registered, not yet decided
		wantNack := map[uint64]bool{}
		next := uint64(1)
		unacked := func() int { // unacked on the channel, as the broker sees it
			m.mu.Lock()
			defer m.mu.Unlock()
			return len(m.outstanding) - (n - int(next) + 1)
		}
		for step := 0; next <= uint64(n) || len(held) > 0; step++ {
			switch r := rng.IntN(10); {
			case r < 4 && next <= uint64(n) && unacked() < window:
				if err := a.Register(next); err != nil {
					t.Fatalf("seed %d: register %d: %v", seed, next, err)
				}
				held = append(held, next)
				next++
			case r < 8 && len(held) > 0:
				// Mostly the oldest are the slow ones: pick from the newest
				// half now and then, so some tags stay stuck for long.
				i := rng.IntN(len(held))
				if rng.IntN(4) > 0 {
					i = len(held)/2 + rng.IntN(len(held)-len(held)/2)
				}
				tag := held[i]
				held = append(held[:i], held[i+1:]...)
				if rng.IntN(13) == 0 {
					wantNack[tag] = true
					if err := a.Nack(tag, rng.IntN(2) == 0); err != nil {
						t.Fatalf("seed %d: nack %d: %v", seed, tag, err)
					}
				} else if err := a.Ack(tag); err != nil {
					t.Fatalf("seed %d: ack %d: %v", seed, tag, err)
				}
			case r >= 8:
				a.tick(time.Now().Add(time.Duration(rng.IntN(4)) * time.Millisecond))
			}
			if l, u := a.Len(), unacked(); l > u || u > window {
				t.Fatalf("seed %d step %d: acker holds %d tags, %d unacked on the channel (window %d)", seed, step, l, u, window)
			}
		}
		a.Close()
		if l := a.Len(); l != 0 {
			t.Fatalf("seed %d: %d tags held after Close", seed, l)
		}
		m.mu.Lock()
		if len(m.violations) > 0 {
			t.Fatalf("seed %d: violations: %v", seed, m.violations)
		}
		for tag := uint64(1); tag <= uint64(n); tag++ {
			ak, nk := m.acked[tag], m.nacked[tag]
			if ak+nk != 1 || wantNack[tag] != (nk == 1) {
				t.Fatalf("seed %d: tag %d acked %d nacked %d (want nack %v)", seed, tag, ak, nk, wantNack[tag])
			}
		}
		m.mu.Unlock()
	}
}

// TestInOrderAcksCoalesce keeps the fast path honest: in-order acks with
// nothing stuck go out as one multiple-ack per MaxBatch tags, no individual
// acks, and the Acker holds nothing between batches.
func TestInOrderAcksCoalesce(t *testing.T) {
	const n, batch = 1000, 50
	m := newModel(n)
	a := New(m, Config{MaxBatch: batch, FlushInterval: time.Hour, StuckAfter: time.Hour})
	defer a.Abandon()
	for tag := uint64(1); tag <= n; tag++ {
		if err := a.Register(tag); err != nil {
			t.Fatal(err)
		}
		if err := a.Ack(tag); err != nil {
			t.Fatal(err)
		}
		if l := a.Len(); l != 0 {
			t.Fatalf("tag %d: acker holds %d tags with nothing in flight", tag, l)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.frames != n/batch || len(m.outstanding) != 0 || len(m.violations) != 0 {
		t.Fatalf("%d frames (want %d), %d unacked, violations %v", m.frames, n/batch, len(m.outstanding), m.violations)
	}
}
