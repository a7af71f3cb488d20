//go:build tools

// Package tools pins the modules the project's packages share, so that
// parallel work on separate packages never races on go.mod. It is never
// compiled (build tag "tools").
package tools

import (
	_ "github.com/bits-and-blooms/bloom/v3"
	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/redis/go-redis/v9"
	_ "github.com/schollz/progressbar/v3"
	_ "github.com/spf13/cobra"
	_ "go.opentelemetry.io/otel"
	_ "go.opentelemetry.io/otel/trace"
	_ "gopkg.in/yaml.v3"
	_ "modernc.org/sqlite"
)
