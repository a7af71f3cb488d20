package failover

import (
	"testing"
)

// A pass over the brokers is shuffled (every URL comes first in some pass)
// and the URL last connected to is tried last.
func TestBrokersOrder(t *testing.T) {
	b := New("amqp://a/", []string{"amqp://b/", "amqp://a/", " ", "amqp://c/"})
	if got := len(b.urls); got != 3 {
		t.Fatalf("urls = %v, want a, b, c once each", b.urls)
	}
	first := map[string]int{}
	for i := 0; i < 600; i++ {
		o := b.order()
		if len(o) != 3 {
			t.Fatalf("order = %v", o)
		}
		first[o[0]]++
	}
	for _, u := range b.urls {
		if first[u] < 100 {
			t.Errorf("%s came first %d times in 600 passes, want about 200 (shuffled): %v", u, first[u], first)
		}
	}
	b.last = "amqp://b/"
	for i := 0; i < 200; i++ {
		if o := b.order(); o[2] != "amqp://b/" {
			t.Fatalf("order = %v, want the last connected URL last", o)
		}
	}
	one := New("amqp://only/", nil)
	one.last = "amqp://only/"
	if o := one.order(); len(o) != 1 || o[0] != "amqp://only/" {
		t.Fatalf("order = %v", o)
	}
}
