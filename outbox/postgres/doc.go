// Package postgres is the PostgreSQL dialect of the outbox: Add inside a
// database/sql transaction (pgx/v5/stdlib) or a pgx.Tx, and a store the relay
// drives, woken at once by LISTEN/NOTIFY (Add issues pg_notify in the same
// transaction, delivered on commit), with polling as the fallback.
package postgres
