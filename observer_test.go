package idemq_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/idemq/idemq"
)

func TestDuplicateLayer(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		dup  bool
		want string
	}{
		{"nil", nil, false, ""},
		{"other", errors.New("x"), false, ""},
		{"plain", idemq.ErrDuplicate, true, "unknown"},
		{"guard", idemq.Duplicate(idemq.LayerGuard), true, idemq.LayerGuard},
		{"inbox wrapped", fmt.Errorf("ctx: %w", idemq.Duplicate(idemq.LayerInbox)), true, idemq.LayerInbox},
		{"custom", idemq.Duplicate("cache"), true, "cache"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := idemq.IsDuplicate(c.err); got != c.dup {
				t.Fatalf("IsDuplicate = %v, want %v", got, c.dup)
			}
			if got := idemq.DuplicateLayer(c.err); got != c.want {
				t.Fatalf("DuplicateLayer = %q, want %q", got, c.want)
			}
			if c.dup {
				if d := idemq.Ack(c.err); d.Outcome != idemq.OutcomeDuplicate || d.Reason != c.want {
					t.Fatalf("Ack = %v, want a duplicate with reason %q", d, c.want)
				}
			}
		})
	}
}
