package storetest_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/storetest"
)

// sloppyComplete is the memory store with a planted defect: Complete does
// not check the token (it completes for whoever holds the lease).
type sloppyComplete struct{ *dedup.Memory }

func (s sloppyComplete) Complete(ctx context.Context, key, token string, window time.Duration) error {
	if rec, ok, err := s.Get(ctx, key); err == nil && ok && rec.State == dedup.StateProcessing {
		token = rec.Owner
	}
	return s.Memory.Complete(ctx, key, token, window)
}

// The checker catches the planted defect (and writes the visualisation it
// names), and passes the memory store it was planted in.
func TestLinearizabilityCatchesAPlantedDefect(t *testing.T) {
	good := storetest.CheckLinearizable(t, dedup.NewMemory(dedup.MemoryConfig{}), "memory", storetest.LinParams{})
	if !good.Linearizable || good.Ops != 4*25*8 {
		t.Fatalf("memory store: %+v, want linearizable with 800 calls", good)
	}
	bad := storetest.CheckLinearizable(t, sloppyComplete{dedup.NewMemory(dedup.MemoryConfig{})}, "planted-defect", storetest.LinParams{})
	if bad.Verdict != "Illegal" {
		t.Fatalf("a Complete that ignores the token: verdict %q, want Illegal: %+v", bad.Verdict, bad)
	}
	if _, err := os.Stat(bad.Visualized); err != nil {
		t.Fatalf("visualisation %q: %v", bad.Visualized, err)
	}
	t.Logf("planted defect: %d calls, not linearizable; visualisation %s", bad.Ops, bad.Visualized)
	_ = os.Remove(bad.Visualized)
}

// The expiry rule: a store whose leases never end (the memory store on a
// clock that stands still) refuses the claims of other clients after a
// stall the model knows outlived the lease; the checker catches it. The
// same store on the real clock passes, with claims taken over.
func TestLinearizabilityCatchesLeasesThatNeverEnd(t *testing.T) {
	// A round (16 calls 25 ms apart: 400 ms and more) outlasts a stall
	// plus the lease's end (350 ms), so the others are still on the
	// stalled client's keys when its lease has surely ended.
	p := storetest.LinParams{Rounds: 6, Ops: 16, Keys: 2, Pace: 25 * time.Millisecond,
		Lease: 100 * time.Millisecond, Stall: 250 * time.Millisecond, StallPercent: 50}
	good := storetest.CheckLinearizable(t, dedup.NewMemory(dedup.MemoryConfig{}), "memory-leases", p)
	if !good.Linearizable || good.TakenOver == 0 {
		t.Fatalf("memory store with ending leases: %+v, want linearizable with claims taken over", good)
	}
	frozen := time.Now()
	bad := storetest.CheckLinearizable(t, dedup.NewMemory(dedup.MemoryConfig{Now: func() time.Time { return frozen }}),
		"planted-defect-leases-never-end", p)
	if bad.Verdict != "Illegal" {
		t.Fatalf("leases that never end: verdict %q, want Illegal: %+v", bad.Verdict, bad)
	}
	t.Logf("real clock: %d calls, %d stalls, %d claims taken over, linearizable; frozen clock: %d calls, %d stalls, not linearizable",
		good.Ops, good.Stalls, good.TakenOver, bad.Ops, bad.Stalls)
	_ = os.Remove(bad.Visualized)
}
