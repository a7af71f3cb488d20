// Package sqlite is the SQLite dialect of the outbox (modernc.org/sqlite, no
// cgo). SQLite has no SKIP LOCKED: run one relay per database file. The
// relay polls with backoff.
package sqlite
