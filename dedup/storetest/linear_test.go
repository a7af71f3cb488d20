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
