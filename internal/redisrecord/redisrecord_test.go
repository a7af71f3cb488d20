package redisrecord

import (
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
)

func TestMillisRoundsUpToAtLeastOne(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int64
	}{{0, 1}, {-time.Second, 1}, {time.Nanosecond, 1}, {time.Millisecond, 1}, {time.Millisecond + 1, 2}, {time.Second, 1000}} {
		if got := Millis(c.d); got != c.want {
			t.Errorf("Millis(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}

func TestRecordValues(t *testing.T) {
	if v := Processing("tok"); v != "p:tok" {
		t.Fatalf("Processing = %q", v)
	}
	if owner, ok := Owner(Processing("tok")); !ok || owner != "tok" {
		t.Fatalf("Owner(processing) = %q, %v", owner, ok)
	}
	for _, v := range []string{Done, "", "x:tok"} {
		if _, ok := Owner(v); ok {
			t.Fatalf("Owner(%q) ok", v)
		}
	}
}

func TestClaim(t *testing.T) {
	for _, c := range []struct {
		vals []int64
		want dedup.Claim
		ok   bool
	}{
		{[]int64{1, 0}, dedup.Claim{Result: dedup.Acquired}, true},
		{[]int64{2, 1500}, dedup.Claim{Result: dedup.InFlight, LeaseLeft: 1500 * time.Millisecond}, true},
		{[]int64{2, -2}, dedup.Claim{Result: dedup.InFlight}, true},
		{[]int64{3, 0}, dedup.Claim{Result: dedup.Done}, true},
		{[]int64{4, 0}, dedup.Claim{}, false},
		{[]int64{1}, dedup.Claim{}, false},
		{nil, dedup.Claim{}, false},
	} {
		got, ok := Claim(c.vals)
		if got != c.want || ok != c.ok {
			t.Errorf("Claim(%v) = %+v, %v; want %+v, %v", c.vals, got, ok, c.want, c.ok)
		}
	}
}
