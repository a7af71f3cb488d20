package inbox

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/idemq/idemq"
)

type sqlStateErr string

func (e sqlStateErr) Error() string    { return "ERROR: " + string(e) }
func (e sqlStateErr) SQLState() string { return string(e) }

func TestConnectionError(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: &net.AddrError{Err: "x"}}
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"dial refused", fmt.Errorf("begin: %w", refused), true},
		{"ECONNREFUSED", fmt.Errorf("x: %w", syscall.ECONNREFUSED), true},
		{"ECONNRESET", syscall.ECONNRESET, true},
		{"unexpected EOF", fmt.Errorf("commit: %w", io.ErrUnexpectedEOF), true},
		{"bad conn", driver.ErrBadConn, true},
		{"pgx connect", errors.New("failed to connect to `user=postgres`: dial error"), true},
		{"pgx conn closed", fmt.Errorf("inbox: begin: %w", errors.New("conn closed")), true},
		{"mysql invalid connection", fmt.Errorf("x: %w", errors.New("invalid connection")), true},
		{"admin shutdown 57P01", sqlStateErr("57P01"), true},
		{"cannot connect now 57P03", sqlStateErr("57P03"), true},
		{"connection exception 08006", sqlStateErr("08006"), true},
		{"unique violation", sqlStateErr("23505"), false},
		{"syntax error", sqlStateErr("42601"), false},
		{"check violation wrapping EOF text", fmt.Errorf("%w", sqlStateErr("23514")), false},
		{"canceled", fmt.Errorf("x: %w", context.Canceled), false},
		// A query cut by the handler's deadline (pgconn wraps ctx.Err()):
		// a handler timeout, an attempt — not an outage (the consumer
		// timeout fault test caught it classified as one).
		{"deadline", fmt.Errorf("inbox: insert row: timeout: %w", context.DeadlineExceeded), false},
		{"deadline with conn closed", errors.Join(context.DeadlineExceeded, errors.New("conn closed")), false},
		{"handler timeout", fmt.Errorf("x: %w", idemq.ErrHandlerTimeout), false},
		{"plain", errors.New("handler said no"), false},
		{"joined", errors.Join(errors.New("a"), errors.New("conn closed")), true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := ConnectionError(c.err); got != c.want {
				t.Fatalf("ConnectionError(%v) = %v, want %v", c.err, got, c.want)
			}
			got := Classify(c.err)
			if idemq.IsUnavailable(got) != c.want {
				t.Fatalf("Classify(%v) unavailable = %v, want %v", c.err, idemq.IsUnavailable(got), c.want)
			}
			if c.err != nil && !errors.Is(got, c.err) {
				t.Fatalf("Classify lost the cause")
			}
		})
	}
	if p := idemq.Permanent(syscall.ECONNREFUSED); Classify(p) != p {
		t.Fatal("Classify wrapped a permanent error")
	}
}
