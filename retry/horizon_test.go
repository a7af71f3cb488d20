package retry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/retry"
)

func TestHorizon(t *testing.T) {
	quick := 3 * 2 * 200 * time.Millisecond // MaxAttempts 3 × (QuickAttempts-1) × QuickBackoff.Max, defaults
	for _, tc := range []struct {
		name string
		cfg  retry.Config
		want time.Duration
	}{
		{"two delays, default attempts", retry.Config{Delays: []time.Duration{time.Second, time.Minute}}, time.Second + time.Minute + quick},
		{"last delay repeats", retry.Config{Delays: []time.Duration{time.Second, time.Minute}, MaxAttempts: 5},
			time.Second + 3*time.Minute + 5*2*200*time.Millisecond},
		{"fewer attempts than delays", retry.Config{Delays: []time.Duration{time.Second, time.Minute}, MaxAttempts: 2},
			time.Second + 2*2*200*time.Millisecond},
		{"no delayed retries", retry.Config{Delays: []time.Duration{}, QuickAttempts: 1}, 0},
		{"no quick retries", retry.Config{Delays: []time.Duration{time.Hour}, QuickAttempts: 1}, time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := retry.Horizon(tc.cfg); got != tc.want {
				t.Fatalf("Horizon = %v, want %v", got, tc.want)
			}
			p, err := retry.New(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got := p.RetryHorizon(); got != tc.want {
				t.Fatalf("RetryHorizon = %v, want %v", got, tc.want)
			}
		})
	}
}

// A dedup window shorter than the policy's retry horizon is refused by
// the pipeline (and so by NewConsumer): the last retry would find no
// record and apply its effect again.
func TestPipelineRefusesWindowShorterThanRetryHorizon(t *testing.T) {
	policy, err := retry.New(retry.Config{Sender: &idemqtest.Sender{}, Delays: []time.Duration{time.Minute, time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	h := idemq.HandlerFunc(func(context.Context, *idemq.Delivery) error { return nil })
	for _, tc := range []struct {
		window time.Duration
		ok     bool
	}{{30 * time.Minute, false}, {2 * time.Hour, true}} {
		g, err := dedup.NewGuard(dedup.Config{Store: dedup.NewMemory(dedup.MemoryConfig{}), Window: tc.window})
		if err != nil {
			t.Fatal(err)
		}
		err = idemq.Pipeline{Policy: policy, Guard: g, Handler: h}.Validate()
		var we *idemq.WindowError
		switch {
		case tc.ok && err != nil:
			t.Errorf("window %v: %v", tc.window, err)
		case !tc.ok && (!errors.Is(err, idemq.ErrWindowTooShort) || !errors.As(err, &we) || we.Part != "Guard" || we.Window != tc.window):
			t.Errorf("window %v: err %v, want a WindowError for the Guard", tc.window, err)
		}
	}
	// Without a policy that bounds its retries there is nothing to check.
	g, _ := dedup.NewGuard(dedup.Config{Store: dedup.NewMemory(dedup.MemoryConfig{}), Window: time.Second})
	if err := (idemq.Pipeline{Guard: g, Handler: h}).Validate(); err != nil {
		t.Errorf("base policy: %v", err)
	}
}
