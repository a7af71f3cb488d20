// Package privatepg runs a PostgreSQL server of the caller's own: a fresh
// cluster (initdb, trust auth, user postgres) in its own folder on its own
// loopback port, which the caller may stop at once (an outage, as clients
// see a crash) and start again with its data, without touching any shared
// server. Run as root, the server runs as the postgres user (runuser), as
// scripts/services.sh does; otherwise as the current user.
//
// It does not import testing: internal/testenv wraps it for tests
// (testenv.StartPrivatePostgres) and examples/bank uses it for its
// dependency-outage phase (bank demo --db-outages).
package privatepg
