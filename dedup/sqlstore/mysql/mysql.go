package mysql

import (
	"context"
	"database/sql"
	"errors"

	"github.com/go-sql-driver/mysql"

	"github.com/idemq/idemq/dedup/sqlstore"
)

// New returns a store on db (opened with the "mysql" driver) and, unless
// cfg.NoMigrate, creates its table. The caller keeps owning db. The DSN
// needs no particular option (parseTime and clientFoundRows are irrelevant:
// expiries are integers and the store does not rely on affected-row counts
// of unchanged rows).
func New(ctx context.Context, db *sql.DB, cfg sqlstore.Config) (*sqlstore.Store, error) {
	if db == nil {
		return nil, errors.New("mysql: nil db")
	}
	return sqlstore.Open(ctx, sqlstore.SQL(db), Dialect(), cfg)
}

const now = `(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)`

// cond: the claim may take the row (evaluated on the row before the update:
// owner is assigned first, and only when cond holds, and then cond still
// holds through expires_at, which is assigned last).
const cond = `(expires_at <= {now} OR (state = 'processing' AND owner = @token))`

// Dialect returns the MySQL/MariaDB dialect.
func Dialect() sqlstore.Dialect {
	return sqlstore.Dialect{
		Name:         "mysql",
		Placeholders: sqlstore.Question,
		Quote:        func(id string) string { return "`" + id + "`" },
		Now:          now,
		Migrate: []string{"CREATE TABLE IF NOT EXISTS {table} (" + `
	{key}      VARBINARY(1024) NOT NULL,
	state      VARCHAR(10) CHARACTER SET ascii NOT NULL,
	owner      VARBINARY(1024) NOT NULL DEFAULT '',
	expires_at BIGINT NOT NULL,
	PRIMARY KEY ({key}),
	KEY {index} (expires_at)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC`},
		Claim: `INSERT INTO {table} ({key}, state, owner, expires_at)
VALUES (@key, 'processing', @token, {now} + @lease)
ON DUPLICATE KEY UPDATE
	owner = IF(` + cond + `, @token, owner),
	state = IF(` + cond + `, 'processing', state),
	expires_at = IF(` + cond + `, {now} + @lease, expires_at)`,
		CompleteLost: `INSERT INTO {table} ({key}, state, owner, expires_at)
VALUES (@key, 'done', '', {now} + @window)
ON DUPLICATE KEY UPDATE
	owner = IF(expires_at <= {now}, '', owner),
	state = IF(expires_at <= {now}, 'done', state),
	expires_at = IF(expires_at <= {now}, {now} + @window, expires_at)`,
		Purge:     `DELETE FROM {table} WHERE expires_at <= {now} LIMIT @batch`,
		Retryable: retryable,
	}
}

// retryable: a deadlock rolls the statement back (ER_LOCK_DEADLOCK).
func retryable(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1213
}
