package dedup_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/storetest"
)

func TestMemoryConformance(t *testing.T) {
	storetest.Run(t, storetest.Suite{
		New: func(t *testing.T) dedup.Store { return dedup.NewMemory(dedup.MemoryConfig{}) },
		NewClocked: func(t *testing.T, now func() time.Time) dedup.Store {
			return dedup.NewMemory(dedup.MemoryConfig{Now: now})
		},
		Broken: func(t *testing.T) dedup.Store {
			m := dedup.NewMemory(dedup.MemoryConfig{})
			_ = m.Close()
			return m
		},
		Features: storetest.Features{Parallel: true},
	})
}

func TestMemoryIsBounded(t *testing.T) {
	m := dedup.NewMemory(dedup.MemoryConfig{MaxEntries: 100})
	ctx := context.Background()
	for i := 0; i < 1000; i++ {
		k := fmt.Sprintf("k%d", i)
		if _, err := m.Claim(ctx, k, "t", time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := m.Complete(ctx, k, "t", time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if m.Len() != 100 || m.Evictions() != 900 {
		t.Fatalf("len %d evictions %d, want 100 and 900", m.Len(), m.Evictions())
	}
	// The most recent ones are kept.
	if c, _ := m.Claim(ctx, "k999", "x", time.Minute); c.Result != dedup.Done {
		t.Fatalf("most recent key: %v, want done", c.Result)
	}
}

func TestMemoryTTLWithFakeClock(t *testing.T) {
	now := time.Unix(1000, 0)
	m := dedup.NewMemory(dedup.MemoryConfig{Now: func() time.Time { return now }})
	ctx := context.Background()
	_, _ = m.Claim(ctx, "k", "a", time.Second)
	now = now.Add(999 * time.Millisecond)
	if c, _ := m.Claim(ctx, "k", "b", time.Second); c.Result != dedup.InFlight {
		t.Fatalf("before expiry: %v", c.Result)
	}
	now = now.Add(time.Millisecond)
	if c, _ := m.Claim(ctx, "k", "b", time.Second); c.Result != dedup.Acquired {
		t.Fatalf("at expiry: %v", c.Result)
	}
}
