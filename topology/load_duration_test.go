package topology_test

import (
	"strings"
	"testing"

	"github.com/idemq/idemq/topology"
)

// A duration without a unit says how to write one.
func TestLoadDurationWithoutUnit(t *testing.T) {
	for _, y := range []string{"queues:\n  - name: q\n    retry_delays: [200]\n", "queues:\n  - name: q\n    retry_delays: [1s, 5]\n"} {
		_, err := topology.Load(strings.NewReader(y))
		if err == nil || !strings.Contains(err.Error(), "write 200ms") {
			t.Errorf("Load(%q) = %v, want a hint to write 200ms", y, err)
		}
	}
}
