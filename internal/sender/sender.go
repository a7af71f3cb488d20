package sender

import (
	"context"
	"time"

	"github.com/idemq/idemq"
)

// WithTimeout returns a Sender that bounds each publish of s (its confirm
// included) by d.
func WithTimeout(s idemq.Sender, d time.Duration) idemq.Sender { return timeout{s, d} }

type timeout struct {
	s idemq.Sender
	d time.Duration
}

func (t timeout) Publish(ctx context.Context, m idemq.Message) error {
	ctx, cancel := context.WithTimeout(ctx, t.d)
	defer cancel()
	return t.s.Publish(ctx, m)
}
