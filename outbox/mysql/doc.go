// Package mysql is the MySQL 8 / MariaDB (>= 10.6, for SKIP LOCKED) dialect
// of the outbox, on database/sql with github.com/go-sql-driver/mysql. The
// relay polls with backoff; several relays share a table with FOR UPDATE SKIP
// LOCKED.
package mysql
