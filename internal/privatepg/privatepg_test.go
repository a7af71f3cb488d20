package privatepg

import (
	"errors"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"zero value", Config{}, true},
		{"set", Config{TempPrefix: "x-", MaxConnections: 200, Fsync: true, StartTimeout: time.Minute}, true},
		{"negative connections", Config{MaxConnections: -1}, false},
		{"negative timeout", Config{StartTimeout: -time.Second}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.ok != (err == nil) {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Validate() = %v, not ErrInvalidConfig", err)
			}
		})
	}
}
