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
// same store on the real clock passes, with claims taken over. A history
// is random: whether a stall lands where another client then claims the
// key is chance, so each store gets up to five histories to show it (every
// history of the real clock must be linearizable).
func TestLinearizabilityCatchesLeasesThatNeverEnd(t *testing.T) {
	// A round (10 calls 40 ms apart: 400 ms and more) outlasts a stall plus
	// the lease's end (350 ms); every acquired claim stalls.
	p := storetest.LinParams{Rounds: 4, Ops: 10, Keys: 3, Pace: 40 * time.Millisecond,
		Lease: 100 * time.Millisecond, Stall: 250 * time.Millisecond, StallPercent: 100}
	var good storetest.LinResult
	for try := 1; try <= 5 && good.TakenOver == 0; try++ {
		good = storetest.CheckLinearizable(t, dedup.NewMemory(dedup.MemoryConfig{}), "memory-leases", p)
		if !good.Linearizable {
			t.Fatalf("memory store with ending leases: %+v, want linearizable; see %s", good, good.Visualized)
		}
	}
	if good.TakenOver == 0 {
		t.Fatalf("memory store with ending leases: no claim taken over in 5 histories: %+v", good)
	}
	frozen := time.Now()
	var bad storetest.LinResult
	for try := 1; try <= 5 && bad.Verdict != "Illegal"; try++ {
		bad = storetest.CheckLinearizable(t, dedup.NewMemory(dedup.MemoryConfig{Now: func() time.Time { return frozen }}),
			"planted-defect-leases-never-end", p)
	}
	if bad.Verdict != "Illegal" {
		t.Fatalf("leases that never end: verdict %q in 5 histories, want Illegal: %+v", bad.Verdict, bad)
	}
	t.Logf("real clock: %d calls, %d stalls, %d claims taken over, linearizable; frozen clock: %d calls, %d stalls, not linearizable",
		good.Ops, good.Stalls, good.TakenOver, bad.Ops, bad.Stalls)
	_ = os.Remove(bad.Visualized)
}
