package sqldb

import (
	"context"
	"errors"
	"fmt"
	"sort"
)

// VersionTable is the table that records the applied migrations of every
// table idemq owns in a database (in the connection's default schema).
const VersionTable = "idemq_migrations"

// LockName names the advisory lock migrations serialise on ([Dialect.Lock]).
const LockName = "idemq-migrate"

// Migration is one numbered step of a table's schema.
type Migration struct {
	// Version numbers the migrations of a [Schema] from 1, without gaps.
	Version int
	// Name says what it does.
	Name string
	// Up are the statements per dialect name, run in order. They are
	// templates: {table} is the quoted table, {idx:SUFFIX} the quoted
	// name of an index derived from it ([Dialect.Derived]), {now} and {ts}
	// the database's clock in milliseconds and as a timestamp. Each must be
	// idempotent (IF NOT EXISTS, or an error [Dialect.Exists] ignores):
	// MySQL commits DDL at once, so a migration cut short runs again.
	Up map[string][]string
}

// Schema is the migrations of one table idemq owns.
type Schema struct {
	// Component is what owns the table: "dedup", "inbox", "outbox".
	Component string
	// Table is the table name ([Dialect.CheckTable]).
	Table string
	// Migrations in version order.
	Migrations []Migration
}

// Latest is the highest version of s.
func (s Schema) Latest() int {
	if len(s.Migrations) == 0 {
		return 0
	}
	return s.Migrations[len(s.Migrations)-1].Version
}

// Index returns the statements, per dialect, of a migration that creates
// the index {idx:suffix} on columns of the table: CREATE INDEX IF NOT
// EXISTS, and on MySQL (which has no IF NOT EXISTS there) a plain CREATE
// INDEX whose "already exists" error [Dialect.Exists] ignores.
func Index(suffix, columns string) map[string][]string {
	stmt := " {idx:" + suffix + "} ON {table} (" + columns + ")"
	return map[string][]string{
		Postgres: {"CREATE INDEX IF NOT EXISTS" + stmt},
		MySQL:    {"CREATE INDEX" + stmt},
		SQLite:   {"CREATE INDEX IF NOT EXISTS" + stmt},
	}
}

// SchemaStatus is where one table's schema stands.
type SchemaStatus struct {
	Component string
	Table     string
	Applied   []int // versions applied, ascending
	Pending   []int // versions not applied yet, ascending
}

// Current is the highest applied version (0: none).
func (s SchemaStatus) Current() int {
	if len(s.Applied) == 0 {
		return 0
	}
	return s.Applied[len(s.Applied)-1]
}

// ErrMigration wraps every migration failure.
var ErrMigration = errors.New("sqldb: migration failed")

func (d *Dialect) versionTableSQL() string {
	text, bigint := "TEXT", "BIGINT"
	switch d.Name {
	case MySQL:
		text = "VARCHAR(190)" // a key column: within InnoDB's prefix limit in utf8mb4
	case SQLite:
		bigint = "INTEGER"
	}
	return "CREATE TABLE IF NOT EXISTS " + d.Quote(VersionTable) + " (" +
		"component " + text + " NOT NULL, " +
		"table_name " + text + " NOT NULL, " +
		"version INTEGER NOT NULL, " +
		"name " + text + " NOT NULL, " +
		"applied_at " + bigint + " NOT NULL, " +
		"PRIMARY KEY (component, table_name, version))"
}

// Up applies the pending migrations of every schema, in version order,
// and returns the status after. A target > 0 stops each schema at that
// version (tests build an older database with it). It runs in one
// transaction under the migration lock, so concurrent calls from several
// processes serialise and each migration is applied once; a transient
// error (a deadlock, a busy SQLite) starts it over.
func Up(ctx context.Context, db DB, target int, schemas ...Schema) ([]SchemaStatus, error) {
	d := db.Dialect()
	for _, s := range schemas {
		if err := check(d, s); err != nil {
			return nil, err
		}
	}
	var out []SchemaStatus
	err := d.Retry(ctx, 20, func() error {
		var err error
		out, err = up(ctx, db, target, schemas)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrMigration, d.Name, err)
	}
	return out, nil
}

func check(d *Dialect, s Schema) error {
	if err := d.CheckTable(s.Table); err != nil {
		return err
	}
	for i, m := range s.Migrations {
		if m.Version != i+1 {
			return fmt.Errorf("%w: %s: migration %d has version %d", ErrMigration, s.Component, i+1, m.Version)
		}
		if _, ok := m.Up[d.Name]; !ok {
			return fmt.Errorf("%w: %s migration %d has no %s statements", ErrMigration, s.Component, m.Version, d.Name)
		}
	}
	return nil
}

func up(ctx context.Context, db DB, target int, schemas []Schema) (_ []SchemaStatus, err error) {
	d := db.Dialect()
	tx, err := db.Begin(ctx, TxOptions{ReadCommitted: d.Name == MySQL})
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	var unlock func(context.Context)
	defer func() {
		if err != nil {
			if unlock != nil {
				unlock(context.WithoutCancel(ctx))
			}
			_ = Rollback(ctx, tx)
		}
	}()
	if d.Lock != nil {
		if unlock, err = d.Lock(ctx, tx, LockName); err != nil {
			return nil, fmt.Errorf("lock: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, d.versionTableSQL()); err != nil && (d.Exists == nil || !d.Exists(err)) {
		return nil, fmt.Errorf("create %s: %w", VersionTable, err)
	}
	if d.Lock == nil {
		// No advisory lock (SQLite): the transaction's first write takes
		// the database's write lock, which serialises migrations.
		if _, err := tx.Exec(ctx, "DELETE FROM "+d.Quote(VersionTable)+" WHERE 1 = 0"); err != nil {
			return nil, fmt.Errorf("lock: %w", err)
		}
	}
	var out []SchemaStatus
	for _, s := range schemas {
		applied, err := applied(ctx, d, tx, s)
		if err != nil {
			return nil, err
		}
		st := SchemaStatus{Component: s.Component, Table: s.Table}
		for _, m := range s.Migrations {
			if applied[m.Version] {
				st.Applied = append(st.Applied, m.Version)
				continue
			}
			if target > 0 && m.Version > target {
				st.Pending = append(st.Pending, m.Version)
				continue
			}
			if err := apply(ctx, d, tx, s, m); err != nil {
				return nil, err
			}
			st.Applied = append(st.Applied, m.Version)
		}
		out = append(out, st)
	}
	if unlock != nil {
		unlock(ctx) // before the commit hands the connection back
		unlock = nil
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	return out, nil
}

func applied(ctx context.Context, d *Dialect, q Querier, s Schema) (map[int]bool, error) {
	st, err := d.Compile("SELECT version FROM {table} WHERE component = @component AND table_name = @table_name",
		d.TableVars(VersionTable), "component", "table_name")
	if err != nil {
		return nil, err
	}
	rows, err := q.Query(ctx, st.SQL, st.Args(s.Component, s.Table)...)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", VersionTable, err)
	}
	defer rows.Close()
	out := map[int]bool{}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("read %s: %w", VersionTable, err)
		}
		out[v] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", VersionTable, err)
	}
	return out, nil
}

func apply(ctx context.Context, d *Dialect, q Querier, s Schema, m Migration) error {
	vars := d.TableVars(s.Table)
	for _, tmpl := range m.Up[d.Name] {
		st, err := d.Compile(tmpl, vars)
		if err != nil {
			return fmt.Errorf("%s %s migration %d: %w", s.Component, s.Table, m.Version, err)
		}
		if _, err := q.Exec(ctx, st.SQL); err != nil && (d.Exists == nil || !d.Exists(err)) {
			return fmt.Errorf("%s %s migration %d (%s): %w", s.Component, s.Table, m.Version, m.Name, err)
		}
	}
	st, err := d.Compile("INSERT INTO {table} (component, table_name, version, name, applied_at) VALUES (@component, @table_name, @version, @name, {now})",
		d.TableVars(VersionTable), "component", "table_name", "version", "name")
	if err != nil {
		return err
	}
	if _, err := q.Exec(ctx, st.SQL, st.Args(s.Component, s.Table, m.Version, m.Name)...); err != nil {
		return fmt.Errorf("record %s %s migration %d: %w", s.Component, s.Table, m.Version, err)
	}
	return nil
}

// Status reports, for every schema, which migrations are applied and which
// are pending. It changes nothing (a database without the version table
// has every migration pending).
func Status(ctx context.Context, db DB, schemas ...Schema) ([]SchemaStatus, error) {
	d := db.Dialect()
	var exists bool
	var err error
	switch d.Name {
	case Postgres:
		err = db.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", VersionTable).Scan(&exists)
	case MySQL:
		err = db.QueryRow(ctx, "SELECT COUNT(*) > 0 FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?", VersionTable).Scan(&exists)
	default:
		err = db.QueryRow(ctx, "SELECT COUNT(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = ?", VersionTable).Scan(&exists)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s: status: %w", ErrMigration, d.Name, err)
	}
	var out []SchemaStatus
	for _, s := range schemas {
		if err := check(d, s); err != nil {
			return nil, err
		}
		have := map[int]bool{}
		if exists {
			if have, err = applied(ctx, d, db, s); err != nil {
				return nil, fmt.Errorf("%w: %s: status: %w", ErrMigration, d.Name, err)
			}
		}
		st := SchemaStatus{Component: s.Component, Table: s.Table}
		for _, m := range s.Migrations {
			if have[m.Version] {
				st.Applied = append(st.Applied, m.Version)
			} else {
				st.Pending = append(st.Pending, m.Version)
			}
		}
		sort.Ints(st.Applied)
		out = append(out, st)
	}
	return out, nil
}
