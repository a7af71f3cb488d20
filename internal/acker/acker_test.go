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
