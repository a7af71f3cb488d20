// The demo's private PostgreSQL (bank demo --db-outages): a server of
// internal/privatepg (shared with internal/testenv), and the outage the
// demo injects on it.

package main

import (
	"context"
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

// outage stops the server at once (pg_ctl stop -m immediate: every
// connection is cut, as in a crash), calls started, keeps it down for d,
// and starts it again.
func (p *privatePostgres) outage(ctx context.Context, d time.Duration, started func()) error {
	if err := p.srv.Stop(ctx); err != nil {
		return err
	}
	started()
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
	return p.srv.Start(context.WithoutCancel(ctx))
}

// remove stops the server for good and deletes its folder.
func (p *privatePostgres) remove() { p.srv.Remove() }
