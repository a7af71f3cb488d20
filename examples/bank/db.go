// The mode's PostgreSQL database: its creation (and drop), and the queries
// on bank_applied that clock the run's progress and tally its result.

package main

import (
	"context"
	"fmt"
	"net/url"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func modeDB(ctx context.Context, base, name string) (string, func(), error) {
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", nil, fmt.Errorf("postgres: %w", err)
	}
	defer conn.Close(ctx)
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		return "", nil, fmt.Errorf("create database: %w", err)
	}
	u, err := url.Parse(base)
	if err != nil {
		return "", nil, err
	}
	u.Path = "/" + name
	drop := func() {
		c, err := pgx.Connect(context.Background(), base)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		_, _ = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)")
	}
	return u.String(), drop, nil
}

func distinctApplied(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	var n int
	err := pool.QueryRow(ctx, `SELECT count(DISTINCT message_id) FROM bank_applied`).Scan(&n)
	return n, err
}

func appliedCounts(ctx context.Context, pool *pgxpool.Pool) (map[string]int, error) {
	return countsByMessage(ctx, pool, `SELECT message_id, count(*) FROM bank_applied GROUP BY message_id`)
}

// firstAttempts is, per transfer, the lowest attempt (x-idemq-attempt) at
// which it was applied.
func firstAttempts(ctx context.Context, pool *pgxpool.Pool) (map[string]int, error) {
	return countsByMessage(ctx, pool, `SELECT message_id, min(attempt) FROM bank_applied GROUP BY message_id`)
}

// countsByMessage reads the (message_id, integer) rows of query into a map.
func countsByMessage(ctx context.Context, pool *pgxpool.Pool, query string) (map[string]int, error) {
	rows, err := pool.Query(ctx, query)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return nil, err
		}
		out[id] = n
	}
	return out, rows.Err()
}
