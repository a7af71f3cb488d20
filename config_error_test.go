package idemq_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/dedup/sqlstore"
	"github.com/idemq/idemq/gate"
	"github.com/idemq/idemq/metrics"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/retry"
)

// Every configuration idemq refuses matches idemq.ErrInvalidConfig, and
// its own package's ErrInvalidConfig where it has one.
func TestConfigErrorsMatchOneSentinel(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		pkg  error // the package's sentinel (nil: the root's)
	}{
		{"consumer without a queue", idemq.ConsumerConfig{}.Validate(), nil},
		{"consumer with a negative handler timeout", idemq.ConsumerConfig{Queue: "q", HandlerTimeout: -1,
			Pipeline: idemq.Pipeline{Handler: idemq.HandlerFunc(nil)}}.Validate(), nil},
		{"pipeline without a handler", idemq.Pipeline{}.Validate(), idemq.ErrNoHandler},
		{"retry with a zero delay", retry.Config{Delays: []time.Duration{0}}.Validate(), retry.ErrInvalidConfig},
		{"guard without a store", dedup.Config{}.Validate(), dedup.ErrInvalidConfig},
		{"relay without a store", outbox.RelayConfig{}.Validate(), outbox.ErrInvalidConfig},
		{"gate without an ingress", gate.Config{}.Validate(), gate.ErrInvalidConfig},
		{"redisstore with negative waits", redisstore.Config{WaitReplicas: -1}.Validate(), redisstore.ErrInvalidConfig},
		{"sqlstore with a negative purge", sqlstore.Config{PurgeBatch: -1}.Validate(), sqlstore.ErrInvalidConfig},
		{"metrics with a bad namespace", metrics.Config{Namespace: "no spaces"}.Validate(), metrics.ErrInvalidConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(tc.err, idemq.ErrInvalidConfig) {
				t.Errorf("%v: not an idemq.ErrInvalidConfig", tc.err)
			}
			if tc.pkg != nil && !errors.Is(tc.err, tc.pkg) {
				t.Errorf("%v: not its package's sentinel %v", tc.err, tc.pkg)
			}
		})
	}
}
