package sender

import (
	"context"
	"testing"
	"time"

	"github.com/idemq/idemq"
)

type sendFunc func(context.Context, idemq.Message) error

func (f sendFunc) Publish(ctx context.Context, m idemq.Message) error { return f(ctx, m) }

func TestWithTimeoutBoundsEachPublish(t *testing.T) {
	var got idemq.Message
	s := WithTimeout(sendFunc(func(ctx context.Context, m idemq.Message) error {
		got = m
		dl, ok := ctx.Deadline()
		if !ok || time.Until(dl) > time.Minute {
			t.Errorf("deadline %v, %v: want one within a minute", dl, ok)
		}
		<-ctx.Done()
		return ctx.Err()
	}), 10*time.Millisecond)
	if err := s.Publish(context.Background(), idemq.Message{ID: "m1"}); err != context.DeadlineExceeded {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
	if got.ID != "m1" {
		t.Fatalf("message %q not passed on", got.ID)
	}
}
