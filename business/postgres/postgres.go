// Package postgres holds the business helpers' PostgreSQL parts for pgx: an
// [business.Execer] adapter and duplicate-key detection. It imports pgx
// only.
package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemq/idemq/business"
)

// UniqueViolation is PostgreSQL's SQLSTATE for a duplicate key.
const UniqueViolation = "23505"

// IsDuplicateKey reports whether err is (or wraps) a unique violation:
// a *pgconn.PgError with code 23505. It works for database/sql through
// pgx/v5/stdlib too (the driver returns the same error).
func IsDuplicateKey(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == UniqueViolation
}

// Conn is what [Pgx] adapts: pgx.Tx, *pgx.Conn, *pgxpool.Pool.
type Conn interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Pgx adapts a pgx connection, pool or transaction to [business.Execer].
func Pgx(c Conn) business.Execer { return pgxExecer{c} }

type pgxExecer struct{ c Conn }

func (p pgxExecer) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	tag, err := p.c.Exec(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

func (p pgxExecer) QueryRow(ctx context.Context, q string, args ...any) business.Row {
	return pgxRow{p.c.QueryRow(ctx, q, args...)}
}

type pgxRow struct{ r pgx.Row }

func (r pgxRow) Scan(dest ...any) error {
	err := r.r.Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: %w", business.ErrNoRows, err)
	}
	return err
}
