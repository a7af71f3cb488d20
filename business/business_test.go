package business_test

import (
	"errors"
	"testing"

	"github.com/idemq/idemq/business"
)

func TestQuote(t *testing.T) {
	for _, tc := range []struct {
		d    business.Dialect
		in   string
		want string
		err  bool
	}{
		{business.Postgres, "orders", `"orders"`, false},
		{business.Postgres, "shop.orders", `"shop"."orders"`, false},
		{business.MySQL, "orders", "`orders`", false},
		{business.SQLite, "o_1", `"o_1"`, false},
		{business.Postgres, "1x", "", true},
		{business.MySQL, "a`b", "", true},
		{business.SQLite, "", "", true},
	} {
		got, err := tc.d.Quote(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("%v.Quote(%q) = %q, %v", tc.d, tc.in, got, err)
		}
		if err != nil && !errors.Is(err, business.ErrInvalidIdentifier) {
			t.Errorf("error %v does not wrap ErrInvalidIdentifier", err)
		}
	}
}

func TestTransitionErrorMessage(t *testing.T) {
	e := &business.TransitionError{Table: "orders", ID: 7, From: "new", To: "paid", Current: "cancelled"}
	if got, want := e.Error(), `business: orders 7: cannot go from "new" to "paid": it is "cancelled"`; got != want {
		t.Fatalf("%s, want %s", got, want)
	}
}
