package main

import (
	"context"
	"log/slog"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/sqldb"
)

// waitFor runs f until it succeeds, as a service starts (idemq.WaitFor):
// whatever PostgreSQL answers — down, starting, refusing connections with
// a server error, full, stalled — is waited out with backoff, logged once
// when the wait begins and once when it ends. Only a definite
// configuration error (sqldb.ConfigError: credentials, an unknown
// database, a malformed URL) still failing after the grace period ends
// it, naming --postgres.
func waitFor(ctx context.Context, log *slog.Logger, what string, f func(context.Context) error) error {
	return idemq.WaitFor(ctx, idemq.WaitConfig{Logger: log},
		idemq.Dependency{Name: what, Check: f, Config: sqldb.ConfigError, Fix: "--postgres (user, password, database)"})
}
