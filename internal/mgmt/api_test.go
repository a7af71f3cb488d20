package mgmt

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/internal/testenv"
)

// TestDeliveryLimitFromBroker reads the limit of real quorum queues whose
// limit comes from an argument, a policy and an operator policy (each
// policy matches only its test's queue).
func TestDeliveryLimitFromBroker(t *testing.T) {
	t.Parallel()
	mu := testenv.RequireManagement(t)
	c, err := New(mu, nil)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		arg      int // 0: none
		policy   int
		operator int
		want     Limit
	}{
		{name: "none", want: Limit{Type: "quorum", Source: SourceNone, Default4x: true}},
		{name: "argument below policy", arg: 2, policy: 4, want: Limit{N: 2, Type: "quorum", Source: SourceArgument}},
		{name: "policy below argument", arg: 5, policy: 4, want: Limit{N: 4, Type: "quorum", Source: SourcePolicy}},
		{name: "operator policy lowest", arg: 5, policy: 4, operator: 3, want: Limit{N: 3, Type: "quorum", Source: SourceOperatorPolicy}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			q := testenv.Name(t, "dl")
			pattern := "^" + regexp.QuoteMeta(q) + "$"
			if tt.policy > 0 {
				testenv.SetPolicy(t, false, q+"-p", pattern, `{"delivery-limit":`+itoa(tt.policy)+`}`, 10)
				if tt.want.Source == SourcePolicy {
					tt.want.Name = q + "-p"
				}
			}
			if tt.operator > 0 {
				testenv.SetPolicy(t, true, q+"-o", pattern, `{"delivery-limit":`+itoa(tt.operator)+`}`, 10)
				tt.want.Name = q + "-o"
			}
			args := amqp.Table{"x-queue-type": "quorum"}
			if tt.arg > 0 {
				args["x-delivery-limit"] = int64(tt.arg)
			}
			ch := testenv.Channel(t)
			if _, err := ch.QueueDeclare(q, true, false, false, false, args); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { testenv.DeleteQueue(q) })
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			got, err := c.DeliveryLimit(ctx, "/", q)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Fatalf("DeliveryLimit = %#v, want %#v", got, tt.want)
			}
		})
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestDeliveryLimitErrors: a wrong password and a missing queue are
// permanent errors that name the URL without its password.
func TestDeliveryLimitErrors(t *testing.T) {
	t.Parallel()
	mu := testenv.RequireManagement(t)
	u, _ := url.Parse(mu)
	u.User = url.UserPassword(u.User.Username(), "wr0ng-s3cret")
	bad, err := New(u.String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = bad.DeliveryLimit(ctx, "/", "anything")
	var se *StatusError
	if !errors.As(err, &se) || se.Code != http.StatusUnauthorized || !Permanent(err) {
		t.Fatalf("wrong password: %v, want a permanent HTTP 401", err)
	}
	if strings.Contains(err.Error(), "wr0ng-s3cret") {
		t.Fatalf("error shows the password: %v", err)
	}
	good, _ := New(mu, nil)
	_, err = good.DeliveryLimit(ctx, "/", testenv.Name(t, "missing"))
	if !errors.As(err, &se) || se.Code != http.StatusNotFound || !Permanent(err) {
		t.Fatalf("missing queue: %v, want a permanent HTTP 404", err)
	}
	// Nothing listening: not permanent (the plugin may be starting).
	down, _ := New("http://guest:guest@127.0.0.1:"+itoa(testenv.FreePort(t)), nil)
	if _, err = down.DeliveryLimit(ctx, "/", "q"); err == nil || Permanent(err) {
		t.Fatalf("nothing listening: %v, want a transient error", err)
	}
}
