package outbox_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
)

// NewRelay refuses a configuration it cannot run with, naming the field.
func TestNewRelayValidates(t *testing.T) {
	pub, err := idemq.NewPublisher(idemq.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	var store outbox.Store = &outbox.SQLStore{}
	tests := []struct {
		name string
		cfg  outbox.RelayConfig
		want string
	}{
		{"no store", outbox.RelayConfig{Publisher: pub}, "Store is required"},
		{"no publisher", outbox.RelayConfig{Store: store}, "Publisher is required"},
		{"negative batch", outbox.RelayConfig{Store: store, Publisher: pub, BatchSize: -1}, "negative BatchSize"},
		{"publish timeout not below the lease", outbox.RelayConfig{Store: store, Publisher: pub, Lease: time.Second, PublishTimeout: time.Second}, "PublishTimeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := outbox.NewRelay(tt.cfg)
			if err == nil || r != nil || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, outbox.ErrInvalidConfig) {
				t.Fatalf("NewRelay = %v, %v; want an ErrInvalidConfig naming %q", r, err, tt.want)
			}
		})
	}
	if _, err := outbox.NewRelay(outbox.RelayConfig{Store: store, Publisher: pub}); err != nil {
		t.Fatalf("store and publisher only: %v, want the defaults to do", err)
	}
}
