package testenv

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/internal/privatepg"
)

// PrivatePostgres is a PostgreSQL server this test owns: its own data
// folder (initdb'ed for the test) and its own port, so the test can stop
// it (an outage) and start it again without touching the shared server.
// Run as root, the server runs as the postgres user (runuser), as
// scripts/services.sh does; otherwise as the current user. It wraps
// internal/privatepg, which examples/bank shares.
type PrivatePostgres struct {
	t    testing.TB
	srv  *privatepg.Server
	Port int
	Dir  string // the data folder's parent (logs, socket)
}

// StartPrivatePostgres initialises a fresh cluster (initdb, trust auth,
// user postgres) in a temporary folder, starts it on a free port and
// registers its stop and removal at cleanup. A missing initdb fails the
// test in CI and skips it elsewhere.
func StartPrivatePostgres(t testing.TB) *PrivatePostgres {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	srv, err := privatepg.Start(ctx, privatepg.Config{
		TempPrefix:     "idemq-privpg-",
		MaxConnections: 100,
		SharedBuffers:  "16MB",
		StartTimeout:   2 * time.Minute,
	})
	if errors.Is(err, privatepg.ErrNotInstalled) {
		Unavailable(t, "PostgreSQL binaries (initdb)", "PATH", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Remove)
	return &PrivatePostgres{t: t, srv: srv, Port: srv.Port, Dir: srv.Dir}
}

// URL is the server's postgres database.
func (p *PrivatePostgres) URL() string { return p.srv.URL() }

// Start starts the server (on the same port and data) and waits until it
// accepts connections.
func (p *PrivatePostgres) Start() {
	p.t.Helper()
	if err := p.srv.Start(context.Background()); err != nil {
		p.t.Fatal(err)
	}
}

// Stop stops the server at once (pg_ctl stop -m immediate: every
// connection is cut, no shutdown checkpoint — what a crash looks like to
// clients) and returns once it no longer runs.
func (p *PrivatePostgres) Stop() {
	p.t.Helper()
	if err := p.srv.Stop(context.Background()); err != nil {
		p.t.Fatal(err)
	}
}

// CreateDB creates a database on the private server and returns its URL.
func (p *PrivatePostgres) CreateDB(name string) string {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, p.URL())
	if err != nil {
		p.t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		p.t.Fatalf("create database %s: %v", name, err)
	}
	return p.srv.DBURL(name)
}
