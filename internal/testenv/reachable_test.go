package testenv

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
)

// A service that answers slowly is tried again until it answers; one that
// refuses the connection (nothing listens) fails at the first try, and one
// that never answers fails once the time is up.
func TestReachable(t *testing.T) {
	slow := errors.New(`Exception (501) Reason: "read tcp 127.0.0.1:1->127.0.0.1:5672: i/o timeout"`)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: a dial is refused
	_, refused := net.DialTimeout("tcp", addr, time.Second)
	if !errors.Is(refused, syscall.ECONNREFUSED) {
		t.Fatalf("dial of a closed port: %v, want ECONNREFUSED", refused)
	}
	for _, c := range []struct {
		name     string
		fails    int   // tries that fail before one succeeds (-1: all)
		err      error // what a failing try returns
		within   time.Duration
		wantErr  bool
		maxTries int
	}{
		{name: "slow, then up", fails: 3, err: slow, within: 10 * time.Second, maxTries: 4},
		{name: "refused: no retry", fails: -1, err: refused, within: 10 * time.Second, wantErr: true, maxTries: 1},
		{name: "never answers: bounded", fails: -1, err: slow, within: 500 * time.Millisecond, wantErr: true, maxTries: 5},
	} {
		t.Run(c.name, func(t *testing.T) {
			tries := 0
			start := time.Now()
			err := Reachable(c.within, func() error {
				tries++
				if c.fails < 0 || tries <= c.fails {
					return c.err
				}
				return nil
			})
			if (err != nil) != c.wantErr || (err != nil && !errors.Is(err, c.err)) {
				t.Fatalf("err = %v after %d tries, want error %v", err, tries, c.wantErr)
			}
			if tries > c.maxTries {
				t.Fatalf("%d tries, want at most %d", tries, c.maxTries)
			}
			if took := time.Since(start); took > c.within+time.Second {
				t.Fatalf("took %v, more than %v", took, c.within)
			}
		})
	}
}
