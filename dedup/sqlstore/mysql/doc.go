// Package mysql is the MySQL and MariaDB (InnoDB) dialect of the SQL dedup
// store ([sqlstore.Store]), through github.com/go-sql-driver/mysql. It
// compiles no PostgreSQL or SQLite driver.
//
// Schema (table name configurable, default idemq_dedup):
//
//	CREATE TABLE idemq_dedup (
//		`key`      VARBINARY(1024) NOT NULL PRIMARY KEY,
//		state      VARCHAR(10) CHARACTER SET ascii NOT NULL,
//		owner      VARBINARY(1024) NOT NULL DEFAULT '',
//		expires_at BIGINT NOT NULL,           -- Unix milliseconds, database clock
//		KEY idemq_dedup_expires_idx (expires_at)
//	) ENGINE=InnoDB ROW_FORMAT=DYNAMIC
//
// The key is VARBINARY, not VARCHAR: keys compare byte for byte (the default
// utf8mb4 collations would fold case, ignore trailing spaces and equate
// Unicode variants, merging distinct message IDs), and 1024 bytes fit the
// InnoDB index limit of 3072 bytes under the DYNAMIC row format (a
// utf8mb4 VARCHAR(1024) would count 4096).
//
// The clock is UTC_TIMESTAMP(6) in milliseconds, independent of the
// session's time zone. A claim is INSERT … ON DUPLICATE KEY UPDATE whose
// assignments take the row only when it is expired or ours (ordered so that
// MySQL's left-to-right evaluation and MariaDB's SIMULTANEOUS_ASSIGNMENT give
// the same result), then one SELECT of the row; no transaction is held
// across round trips. Deadlocks (1213) are retried.
package mysql
