package gate_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/gate"
	"github.com/idemq/idemq/internal/testenv"
)

// Config.ManagementURL reaches the ingress consumer: with the right URL
// the gate starts (it read the ingress queue's delivery limit), with a
// wrong password it ends Run with a permanent startup error naming the
// delivery limit, never the password.
func TestGateManagementURL(t *testing.T) {
	mu := testenv.RequireManagement(t)
	wrong, _ := url.Parse(mu)
	wrong.User = url.UserPassword(wrong.User.Username(), "s3cret-wrong")
	for _, tt := range []struct {
		name string
		url  string
		ok   bool
	}{
		{"right", mu, true},
		{"wrong password", wrong.String(), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t)
			cfg := r.config()
			cfg.ManagementURL = tt.url
			g, err := gate.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- g.Run(ctx) }()
			defer func() { cancel(); <-done }()
			select {
			case <-g.Ready():
				if !tt.ok {
					t.Fatal("the gate started with a wrong management password")
				}
			case err := <-done:
				done <- err // for the deferred wait
				var se *idemq.StartupError
				if tt.ok || !errors.As(err, &se) || !se.Permanent || !strings.Contains(err.Error(), "delivery limit") ||
					strings.Contains(err.Error(), "s3cret-wrong") {
					t.Fatalf("Run = %v", err)
				}
			case <-time.After(60 * time.Second):
				t.Fatal("the gate neither started nor stopped")
			}
		})
	}
}
