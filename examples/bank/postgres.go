// The demo's private PostgreSQL (bank demo --db-outages): a server of
// internal/privatepg (shared with internal/testenv), and the outage the
// demo injects on it.

package main

import (
	"context"
	"syscall"
	"time"

	"github.com/idemq/idemq/internal/privatepg"
)

// privatePostgres is a PostgreSQL server the demo owns (its own port and
// data folder), so the dependency-outage phase can stop it and start it
// again without touching the shared server.
type privatePostgres struct{ srv *privatepg.Server }

// startPrivatePostgres initialises a cluster in a fresh folder and starts
// it: fsync on and room for every consumer's pool.
func startPrivatePostgres(ctx context.Context) (*privatePostgres, error) {
	srv, err := privatepg.Start(ctx, privatepg.Config{
		TempPrefix:     "bank-demo-pg-",
		MaxConnections: 200,
		Fsync:          true,
		StartTimeout:   2 * time.Minute,
	})
	if err != nil {
		return nil, err
	}
	return &privatePostgres{srv: srv}, nil
}

// url is the server's postgres database.
func (p *privatePostgres) url() string { return p.srv.URL() }

// The shapes of a database outage (--db-outage-shapes).
const (
	shapeStop   = "stop"   // pg_ctl stop -m immediate: connections cut, refused
	shapeStall  = "stall"  // SIGSTOP of every server process: accepted, never answered
	shapeRefuse = "refuse" // ALLOW_CONNECTIONS false, sessions ended: a server error (55000)
)

// outage makes the server unavailable in shape for d, calls started once
// it is, and makes it available again.
func (p *privatePostgres) outage(ctx context.Context, shape string, d time.Duration, started func()) error {
	var undo func(context.Context) error
	switch shape {
	case shapeStall:
		if err := p.srv.Signal(syscall.SIGSTOP); err != nil {
			return err
		}
		undo = func(context.Context) error { return p.srv.Signal(syscall.SIGCONT) }
	case shapeRefuse:
		if err := p.srv.AllowConnections(ctx, false); err != nil {
			return err
		}
		undo = func(ctx context.Context) error { return p.srv.AllowConnections(ctx, true) }
	default:
		if err := p.srv.Stop(ctx); err != nil {
			return err
		}
		undo = p.srv.Start
	}
	started()
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
	return undo(context.WithoutCancel(ctx))
}

// remove stops the server for good and deletes its folder.
func (p *privatePostgres) remove() { p.srv.Remove() }
