package gate_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/gate"
)

func TestConfigValidate(t *testing.T) {
	ok := gate.Config{Ingress: "in", Routes: []gate.Route{{Exchange: "x"}}}
	cases := []struct {
		name string
		edit func(*gate.Config)
		want string // "" = valid
	}{
		{"minimal", func(*gate.Config) {}, ""},
		{"default exchange with key", func(c *gate.Config) { c.Routes = []gate.Route{{RoutingKey: "out"}} }, ""},
		{"no ingress", func(c *gate.Config) { c.Ingress = "" }, "Ingress is required"},
		{"no routes", func(c *gate.Config) { c.Routes = nil }, "at least one route"},
		{"default exchange without key", func(c *gate.Config) { c.Routes = []gate.Route{{}} }, "needs a routing key"},
		{"loop", func(c *gate.Config) { c.Routes = []gate.Route{{RoutingKey: "in"}} }, "loop"},
		{"dlq is ingress", func(c *gate.Config) { c.DeadLetterQueue = "in" }, "loop"},
		{"no dlq", func(c *gate.Config) { c.DeadLetterQueue = "-" }, ""},
		{"long exchange", func(c *gate.Config) { c.Routes = []gate.Route{{Exchange: strings.Repeat("x", 256)}} }, "at most 255"},
		{"control char", func(c *gate.Config) { c.Ingress = "in\n" }, "control character"},
		{"window below two leases", func(c *gate.Config) { c.Window, c.Lease = time.Minute, time.Minute }, "twice Lease"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			c.Routes = append([]gate.Route(nil), ok.Routes...)
			tc.edit(&c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, gate.ErrInvalidConfig)):
				t.Fatalf("Validate: %v, want %q", err, tc.want)
			}
			if _, err2 := gate.New(c); (err2 == nil) != (err == nil) {
				t.Fatalf("New: %v, Validate: %v", err2, err)
			}
		})
	}
}

func TestLoadRoutes(t *testing.T) {
	cases := []struct {
		name, yaml string
		want       []gate.Route
		err        string
	}{
		{"two", "routes:\n  - exchange: orders\n    routing_key: orders.created\n  - exchange: audit\n",
			[]gate.Route{{Exchange: "orders", RoutingKey: "orders.created"}, {Exchange: "audit"}}, ""},
		{"default exchange", "routes:\n  - routing_key: out\n", []gate.Route{{RoutingKey: "out"}}, ""},
		{"empty", "", nil, "empty file"},
		{"none", "routes: []\n", nil, "no routes"},
		{"unknown field", "routes:\n  - exchange: x\n    key: y\n", nil, "field key not found"},
		{"two documents", "routes:\n  - exchange: x\n---\nroutes:\n  - exchange: y\n", nil, "more than one"},
		{"default exchange without key", "routes:\n  - exchange: \"\"\n", nil, "needs a routing_key"},
		{"control char", "routes:\n  - exchange: \"a\\nb\"\n", nil, "control character"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := gate.LoadRoutes(strings.NewReader(tc.yaml))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v", got)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("got %v, want %v", got, tc.want)
				}
			}
		})
	}
}

// Whatever a routes file holds, LoadRoutes never panics, and what it
// accepts a gate accepts.
func FuzzLoadRoutes(f *testing.F) {
	f.Add("routes:\n  - exchange: orders\n    routing_key: k\n")
	f.Add("routes:\n  - routing_key: out\n")
	f.Add("routes: [{exchange: \"\\x00\"}]")
	f.Add("routes:\n  - exchange: &a x\n  - exchange: *a\n")
	f.Fuzz(func(t *testing.T, s string) {
		routes, err := gate.LoadRoutes(strings.NewReader(s))
		if err != nil {
			return
		}
		cfg := gate.Config{Ingress: "gate-fuzz-ingress", Routes: routes}
		for _, r := range routes {
			if r.Exchange == "" && r.RoutingKey == cfg.Ingress {
				return // a loop: refused by Validate, as it should be
			}
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("LoadRoutes accepted %q but Validate refuses: %v", s, err)
		}
	})
}
