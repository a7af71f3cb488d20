package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/idemq/idemq/sqldb"
)

// DefaultTable is the outbox table name when none is configured.
const DefaultTable = "idemq_outbox"

// Component names the outbox table in the migrations table.
const Component = "outbox"

// StoreConfig configures a [SQLStore]. The zero value is usable.
type StoreConfig struct {
	// Table is the outbox table ([sqldb.Dialect.CheckTable]). Default
	// [DefaultTable].
	Table string
	// NoMigrate: [NewStore] does not apply the table's migrations (the
	// schema is managed elsewhere, e.g. by `idemq migrate up`). Default
	// false: it applies the pending ones.
	NoMigrate bool
	// Channel is the PostgreSQL NOTIFY channel Add signals on and Listen
	// listens to. Default: the table name with dots replaced by
	// underscores (at most 63 bytes).
	Channel string
	// Listen, when set, makes the store a [Waker]: it listens on Channel
	// and wakes the relay as soon as a row commits (PostgreSQL:
	// postgres.Listener(url)). Default nil: the relay polls.
	Listen func(ctx context.Context, channel string, wake func()) error
	// SyncBookkeeping (PostgreSQL) makes the relay's claims and marks wait
	// for their WAL flush like any commit. Default false: the claim of an
	// unordered relay and every mark commit with synchronous_commit = off
	// for that statement's transaction only, so they do not queue behind
	// an fsync (nor add one to the disk the broker fsyncs to). A database
	// crash can then lose the last few hundred milliseconds of them: those
	// rows are published again with the same message ID — at-least-once,
	// as after a relay killed between the confirm and the mark. Rows that
	// Add writes commit with your transaction's own setting; claims of an
	// Ordered relay, Retry and Fail are always synchronous.
	SyncBookkeeping bool
	// DeleteSent makes MarkSent delete a row once its confirm arrived
	// instead of keeping it as sent for the relay's Retention. Default
	// false. It is the cheapest bookkeeping: on PostgreSQL about a third
	// less database CPU per relayed row than marking it, and nothing left
	// for the purge (docs/BENCHMARKS.md). The table then holds only the
	// pending and failed rows: `idemq outbox` and the console show no sent
	// ones, and [SQLStore.Count] reports none.
	DeleteSent bool
}

// SQLStore implements [Store], [FailedRows] and [Waker] over idemq's SQL
// layer: PostgreSQL (FOR UPDATE SKIP LOCKED, one UPDATE … RETURNING per
// claim, NOTIFY on Add), MySQL 8 / MariaDB >= 10.6 (SKIP LOCKED, claims
// in READ COMMITTED), SQLite (one relay).
type SQLStore struct {
	db    sqldb.DB
	d     *sqldb.Dialect
	cfg   StoreConfig
	table string // quoted

	insertSQL, notifySQL string
	// async is the relation that turns synchronous_commit off for the
	// statement's transaction, for a mark's FROM or USING clause (""
	// when SyncBookkeeping or not PostgreSQL).
	async string
}

// NewStore returns the outbox store on db (postgres.Pgx(pool),
// postgres.Std(db), mysql.Std(db), sqlite.Std(db)) and applies the table's
// pending migrations unless cfg.NoMigrate. The caller keeps owning db.
func NewStore(ctx context.Context, db sqldb.DB, cfg StoreConfig) (*SQLStore, error) {
	if db == nil {
		return nil, errors.New("outbox: nil DB")
	}
	d := db.Dialect()
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	qt, err := d.QuoteTable(cfg.Table)
	if err != nil {
		return nil, err
	}
	if cfg.Channel == "" {
		cfg.Channel = strings.ReplaceAll(cfg.Table, ".", "_")
	}
	if len(cfg.Channel) > 63 {
		cfg.Channel = cfg.Channel[:63]
	}
	s := &SQLStore{db: db, d: d, cfg: cfg, table: qt}
	hdr := "?"
	if d.Name == sqldb.Postgres {
		hdr = "?::jsonb"
		s.notifySQL = "SELECT pg_notify($1, '')"
		if !cfg.SyncBookkeeping {
			// set_config(…, true) lasts until the end of the statement's
			// own (implicit) transaction, whose commit then skips the
			// WAL flush wait.
			s.async = "(SELECT set_config('synchronous_commit', 'off', true)) AS idemq_async"
		}
	}
	s.insertSQL = d.Rebind(fmt.Sprintf(
		"INSERT INTO %s (message_id, exchange, routing_key, content_type, headers, body, ordering_key) VALUES (?, ?, ?, ?, %s, ?, ?)", qt, hdr))
	if !cfg.NoMigrate {
		if err := s.Migrate(ctx); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Schema returns the migrations of the outbox table named table, for
// [sqldb.Up] and `idemq migrate`: version 1 creates the table, version 2
// the indexes of the claim (pending rows, ordering keys, failed rows that
// hold back their key) and of the purge (sent rows).
func Schema(table string) sqldb.Schema {
	return sqldb.Schema{Component: Component, Table: table, Migrations: []sqldb.Migration{
		{Version: 1, Name: "create table", Up: map[string][]string{
			sqldb.Postgres: {`CREATE TABLE IF NOT EXISTS {table} (
	id           BIGSERIAL PRIMARY KEY,
	message_id   TEXT NOT NULL,
	exchange     TEXT NOT NULL DEFAULT '',
	routing_key  TEXT NOT NULL DEFAULT '',
	content_type TEXT NOT NULL DEFAULT '',
	headers      JSONB,
	body         BYTEA NOT NULL,
	ordering_key TEXT,
	state        TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent', 'failed')),
	attempts     INTEGER NOT NULL DEFAULT 0,
	last_error   TEXT,
	owner        TEXT,
	locked_until TIMESTAMPTZ,
	available_at TIMESTAMPTZ NOT NULL DEFAULT now(),
	created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
	sent_at      TIMESTAMPTZ
)`},
			sqldb.MySQL: {`CREATE TABLE IF NOT EXISTS {table} (
	id           BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
	message_id   VARCHAR(255) NOT NULL,
	exchange     VARCHAR(255) NOT NULL DEFAULT '',
	routing_key  VARCHAR(255) NOT NULL DEFAULT '',
	content_type VARCHAR(255) NOT NULL DEFAULT '',
	headers      LONGTEXT NULL,
	body         LONGBLOB NOT NULL,
	ordering_key VARCHAR(255) NULL,
	state        VARCHAR(16) NOT NULL DEFAULT 'pending',
	attempts     INT NOT NULL DEFAULT 0,
	last_error   TEXT NULL,
	owner        VARCHAR(255) NULL,
	locked_until DATETIME(6) NULL,
	available_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
	created_at   DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
	sent_at      DATETIME(6) NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`},
			sqldb.SQLite: {`CREATE TABLE IF NOT EXISTS {table} (
	id           INTEGER PRIMARY KEY AUTOINCREMENT,
	message_id   TEXT NOT NULL,
	exchange     TEXT NOT NULL DEFAULT '',
	routing_key  TEXT NOT NULL DEFAULT '',
	content_type TEXT NOT NULL DEFAULT '',
	headers      TEXT,
	body         BLOB NOT NULL,
	ordering_key TEXT,
	state        TEXT NOT NULL DEFAULT 'pending',
	attempts     INTEGER NOT NULL DEFAULT 0,
	last_error   TEXT,
	owner        TEXT,
	locked_until TEXT,
	available_at TEXT NOT NULL DEFAULT ({ts}),
	created_at   TEXT NOT NULL DEFAULT ({ts}),
	sent_at      TEXT
)`},
		}},
		{Version: 2, Name: "claim and purge indexes", Up: map[string][]string{
			sqldb.Postgres: partialIndexes,
			sqldb.MySQL: {
				`CREATE INDEX {idx:_state} ON {table} (state, id)`,
				`CREATE INDEX {idx:_key} ON {table} (ordering_key, state, id)`,
				`CREATE INDEX {idx:_sent} ON {table} (state, sent_at)`,
			},
			sqldb.SQLite: partialIndexes,
		}},
		// A claim updates owner, lease and attempts, none of them indexed:
		// with room left on the row's page PostgreSQL makes it a heap-only
		// tuple update (no new index entries, the old version pruned on
		// the page). Inserts fill pages to half, so the claim of each row
		// finds that room. The relay's PostgreSQL CPU per row fell by
		// ~40% (claim and mark alone; docs/BENCHMARKS.md). Pages filled
		// before the migration keep their rows.
		{Version: 3, Name: "room on each page for the claim's update", Up: map[string][]string{
			sqldb.Postgres: {`ALTER TABLE {table} SET (fillfactor = 50)`},
			sqldb.MySQL:    {}, // InnoDB updates in place (undo log)
			sqldb.SQLite:   {},
		}},
	}}
}

var partialIndexes = []string{
	`CREATE INDEX IF NOT EXISTS {idx:_pending} ON {table} (id) WHERE state = 'pending'`,
	`CREATE INDEX IF NOT EXISTS {idx:_key} ON {table} (ordering_key, id) WHERE state = 'pending' AND ordering_key IS NOT NULL`,
	`CREATE INDEX IF NOT EXISTS {idx:_sent} ON {table} (sent_at) WHERE state = 'sent'`,
	// Failed rows hold back their ordering key (ordered claims).
	`CREATE INDEX IF NOT EXISTS {idx:_failed_key} ON {table} (ordering_key, id) WHERE state = 'failed' AND ordering_key IS NOT NULL`,
}

// Channel is the NOTIFY channel Add signals on (PostgreSQL).
func (s *SQLStore) Channel() string { return s.cfg.Channel }

// Listen implements [Waker] with StoreConfig.Listen; without it, it
// returns at once and the relay polls.
func (s *SQLStore) Listen(ctx context.Context, wake func()) error {
	if s.cfg.Listen == nil {
		return nil
	}
	return s.cfg.Listen(ctx, s.cfg.Channel, wake)
}

// Table implements [Store].
func (s *SQLStore) Table() string { return s.cfg.Table }

// DB is the store's database.
func (s *SQLStore) DB() sqldb.DB { return s.db }

func (s *SQLStore) rebind(q string) string { return s.d.Rebind(q) }

func (s *SQLStore) errf(op string, err error) error {
	return fmt.Errorf("outbox(%s): %s %s: %w", s.d.Name, op, s.cfg.Table, err)
}

// Migrate applies the table's pending migrations ([Schema]); safe to run
// from several processes at once.
func (s *SQLStore) Migrate(ctx context.Context) error {
	if _, err := sqldb.Up(ctx, s.db, 0, Schema(s.cfg.Table)); err != nil {
		return s.errf("migrate", err)
	}
	return nil
}

// Add implements [Store].
func (s *SQLStore) Add(ctx context.Context, tx sqldb.Querier, msgs ...Message) error {
	if tx == nil {
		return fmt.Errorf("outbox: Add needs a transaction")
	}
	for i := range msgs {
		m := &msgs[i]
		if err := m.Validate(); err != nil {
			if errors.Is(err, ErrInvalidMessage) {
				return fmt.Errorf("outbox: add %q: %w", m.ID, err)
			}
			return fmt.Errorf("outbox: add %q: %w: %w", m.ID, ErrInvalidMessage, err)
		}
		h, err := EncodeHeaders(m.Headers)
		if err != nil {
			return fmt.Errorf("outbox: add %q: %w", m.ID, err)
		}
		var hv, kv any
		if h != "" {
			hv = h
		}
		if m.OrderingKey != "" {
			kv = m.OrderingKey
		}
		body := m.Body
		if body == nil {
			body = []byte{}
		}
		if _, err := tx.Exec(ctx, s.insertSQL, m.ID, m.Exchange, m.RoutingKey, m.ContentType, hv, body, kv); err != nil {
			return s.errf("add "+strconv.Quote(m.ID)+" to", err)
		}
	}
	if s.notifySQL != "" && len(msgs) > 0 {
		if _, err := tx.Exec(ctx, s.notifySQL, s.cfg.Channel); err != nil {
			return s.errf("notify for", err)
		}
	}
	return nil
}

func (s *SQLStore) cols() string {
	hdr := "headers"
	if s.d.Name == sqldb.Postgres {
		hdr = "headers::text"
	}
	return "id, message_id, exchange, routing_key, content_type, " + hdr + ", body, ordering_key, attempts"
}

func (s *SQLStore) claimWhere(ordered bool) string {
	now := s.d.Now
	w := fmt.Sprintf("c.state = 'pending' AND c.available_at <= %s AND (c.locked_until IS NULL OR c.locked_until < %s)", now, now)
	if ordered {
		// An earlier pending row of the key, or an earlier failed one (an
		// operator retries or skips it: see [FailedRows]), holds c back.
		// Two NOT EXISTS, one per state, so each can use a partial index.
		w += fmt.Sprintf(" AND (c.ordering_key IS NULL OR (NOT EXISTS (SELECT 1 FROM %[1]s p WHERE p.ordering_key = c.ordering_key AND p.state = 'pending' AND p.id < c.id)"+
			" AND NOT EXISTS (SELECT 1 FROM %[1]s f WHERE f.ordering_key = c.ordering_key AND f.state = 'failed' AND f.id < c.id)))", s.table)
	}
	return w
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

func int64Args(ids []int64) []any {
	a := make([]any, len(ids))
	for i, id := range ids {
		a[i] = id
	}
	return a
}

// idList returns the condition on id ("IN (?, …)" or "= ANY(?)") matching
// ids, and its arguments.
func (s *SQLStore) idList(ids []int64) (string, []any) {
	if s.d.Name == sqldb.Postgres {
		// One array parameter: one statement text for every batch size
		// (a single prepared statement, less to parse).
		return "= ANY(?)", []any{ids}
	}
	return "IN (" + placeholders(len(ids)) + ")", int64Args(ids)
}

type scanner interface{ Scan(...any) error }

func scanRow(sc scanner, owner string) (Row, error) {
	var r Row
	var hdr, key sql.NullString
	if err := sc.Scan(&r.ID, &r.Message.ID, &r.Message.Exchange, &r.Message.RoutingKey, &r.Message.ContentType, &hdr, &r.Message.Body, &key, &r.Attempts); err != nil {
		return r, err
	}
	r.Message.OrderingKey = key.String
	r.Owner = owner
	if hdr.Valid {
		h, err := DecodeHeaders(hdr.String)
		if err != nil {
			r.HeadersErr = err
		} else {
			r.Message.Headers = h
		}
	}
	return r, nil
}

// claimSettings are the planner settings of a PostgreSQL claim's
// transaction. The claim's best plan walks the pending index in id order
// and stops after limit rows. With statistics older than the backlog (a
// burst, a relay that was down: autovacuum analyzes a minute or more
// later; a table that keeps its sent rows says "almost nothing pending"),
// the planner expects a few pending rows and picks a bitmap scan of all
// of them and a sort instead: every claim then reads the whole backlog,
// so draining it costs its square. Bitmap scans off, the index walk is
// what is left for the pending rows.
const claimSettings = "SELECT set_config('enable_bitmapscan', 'off', true)"

// claimPostgres is Claim on PostgreSQL: the settings, then one UPDATE …
// WHERE id = ANY(ARRAY(SELECT … FOR UPDATE SKIP LOCKED)) RETURNING, in one
// transaction. The ARRAY(…) makes the select an init plan, so the update
// probes the primary key for exactly the claimed ids instead of possibly
// hash-joining against a scan of the table.
func (s *SQLStore) claimPostgres(ctx context.Context, owner string, limit int, leaseMS int64, ordered bool) ([]Row, error) {
	settings := claimSettings
	if s.async != "" && !ordered {
		// A lease lost in a database crash could let another relay
		// publish a later row of the key while this one still publishes
		// the earlier: ordered claims stay synchronous.
		settings += ", set_config('synchronous_commit', 'off', true)"
	}
	tx, err := s.db.Begin(ctx, sqldb.TxOptions{})
	if err != nil {
		return nil, s.errf("claim (begin) from", err)
	}
	defer func() { _ = sqldb.Rollback(ctx, tx) }()
	if _, err := tx.Exec(ctx, settings); err != nil {
		return nil, s.errf("claim (settings) from", err)
	}
	q := s.rebind(fmt.Sprintf(
		"UPDATE %[1]s SET owner = ?, locked_until = %[2]s, attempts = attempts + 1 WHERE id = ANY(ARRAY(SELECT c.id FROM %[1]s c WHERE %[3]s ORDER BY c.id LIMIT ? FOR UPDATE SKIP LOCKED)) RETURNING %[4]s",
		s.table, s.d.NowPlusMillis("?"), s.claimWhere(ordered), s.cols()))
	out, err := s.claimed(ctx, tx, owner, 0, q, owner, leaseMS, limit)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, s.errf("claim (commit) from", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// claimed runs a claim's query in tx and reads its rows, adding bump to
// each row's attempts.
func (s *SQLStore) claimed(ctx context.Context, tx sqldb.Tx, owner string, bump int, q string, args ...any) ([]Row, error) {
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		return nil, s.errf("claim from", err)
	}
	defer rows.Close()
	var out []Row
	for rows.Next() {
		r, err := scanRow(rows, owner)
		if err != nil {
			return nil, s.errf("claim (scan) from", err)
		}
		r.Attempts += bump
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, s.errf("claim from", err)
	}
	return out, nil
}

// Claim implements [Store].
func (s *SQLStore) Claim(ctx context.Context, owner string, limit int, lease time.Duration, ordered bool) ([]Row, error) {
	if limit <= 0 {
		limit = 1
	}
	leaseMS := lease.Milliseconds()
	if leaseMS < 1 {
		leaseMS = 1
	}
	d := s.d
	lock := ""
	if d.Name != sqldb.SQLite {
		lock = " FOR UPDATE SKIP LOCKED"
	}
	if d.Name == sqldb.Postgres {
		return s.claimPostgres(ctx, owner, limit, leaseMS, ordered)
	}

	// MySQL in READ COMMITTED: no gap locks, so concurrent claims and
	// inserts do not deadlock on the pending index.
	tx, err := s.db.Begin(ctx, sqldb.TxOptions{ReadCommitted: d.Name == sqldb.MySQL})
	if err != nil {
		return nil, s.errf("claim (begin) from", err)
	}
	defer func() { _ = sqldb.Rollback(ctx, tx) }()
	q := s.rebind(fmt.Sprintf("SELECT %s FROM %s c WHERE %s ORDER BY c.id LIMIT ?%s",
		s.cols(), s.table, s.claimWhere(ordered), lock))
	// The UPDATE below increments attempts: the rows read before it are
	// one attempt behind.
	out, err := s.claimed(ctx, tx, owner, 1, q, limit)
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, tx.Commit(ctx)
	}
	ids := make([]int64, len(out))
	for i := range out {
		ids[i] = out[i].ID
	}
	u := s.rebind(fmt.Sprintf("UPDATE %s SET owner = ?, locked_until = %s, attempts = attempts + 1 WHERE id IN (%s)",
		s.table, d.NowPlusMillis("?"), placeholders(len(ids))))
	if _, err := tx.Exec(ctx, u, append([]any{owner, leaseMS}, int64Args(ids)...)...); err != nil {
		return nil, s.errf("claim (lease) in", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, s.errf("claim (commit) in", err)
	}
	return out, nil
}

// MarkSent implements [Store]. A row is marked whoever holds its lease now:
// it has been published either way.
func (s *SQLStore) MarkSent(ctx context.Context, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	in, args := s.idList(ids)
	if s.cfg.DeleteSent {
		using := ""
		if s.async != "" {
			using = " USING " + s.async
		}
		q := s.rebind(fmt.Sprintf("DELETE FROM %s%s WHERE state = 'pending' AND id %s", s.table, using, in))
		if _, err := s.db.Exec(ctx, q, args...); err != nil {
			return s.errf("delete sent from", err)
		}
		return nil
	}
	from := ""
	if s.async != "" {
		from = " FROM " + s.async
	}
	q := s.rebind(fmt.Sprintf("UPDATE %s SET state = 'sent', sent_at = %s, owner = NULL, locked_until = NULL, last_error = NULL%s WHERE state = 'pending' AND id %s",
		s.table, s.d.Now, from, in))
	if _, err := s.db.Exec(ctx, q, args...); err != nil {
		return s.errf("mark sent in", err)
	}
	return nil
}

// Retry implements [Store].
func (s *SQLStore) Retry(ctx context.Context, owner string, id int64, delay time.Duration, lastErr string) error {
	q := s.rebind(fmt.Sprintf("UPDATE %s SET owner = NULL, locked_until = NULL, available_at = %s, last_error = ? WHERE id = ? AND state = 'pending' AND owner = ?",
		s.table, s.d.NowPlusMillis("?")))
	if _, err := s.db.Exec(ctx, q, delay.Milliseconds(), truncate(lastErr, 2000), id, owner); err != nil {
		return s.errf("retry in", err)
	}
	return nil
}

// Fail implements [Store].
func (s *SQLStore) Fail(ctx context.Context, owner string, id int64, reason string) error {
	q := s.rebind(fmt.Sprintf("UPDATE %s SET state = 'failed', owner = NULL, locked_until = NULL, last_error = ? WHERE id = ? AND state = 'pending' AND owner = ?", s.table))
	if _, err := s.db.Exec(ctx, q, truncate(reason, 2000), id, owner); err != nil {
		return s.errf("fail in", err)
	}
	return nil
}

// Purge implements [Store]: it deletes at most limit (default 1000) rows
// sent more than olderThan ago.
func (s *SQLStore) Purge(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	if limit <= 0 {
		limit = 1000
	}
	cutoff := s.d.NowPlusMillis("?")
	var q string
	if s.d.Name == sqldb.MySQL {
		q = fmt.Sprintf("DELETE FROM %s WHERE state = 'sent' AND sent_at < %s ORDER BY id LIMIT ?", s.table, cutoff)
	} else {
		q = fmt.Sprintf("DELETE FROM %[1]s WHERE id IN (SELECT id FROM %[1]s WHERE state = 'sent' AND sent_at < %[2]s ORDER BY id LIMIT ?)", s.table, cutoff)
	}
	n, err := s.db.Exec(ctx, s.rebind(q), -max(olderThan, 0).Milliseconds(), limit)
	if err != nil {
		return 0, s.errf("purge", err)
	}
	return n, nil
}

// Stats implements [Store].
func (s *SQLStore) Stats(ctx context.Context) (Stats, error) {
	q := fmt.Sprintf("SELECT COUNT(*), MIN(created_at) IS NOT NULL, COALESCE(%s, 0) FROM %s WHERE state = 'pending'",
		s.d.AgeSeconds("MIN(created_at)"), s.table)
	var st Stats
	var any bool
	var age float64
	if err := s.db.QueryRow(ctx, q).Scan(&st.Pending, &any, &age); err != nil {
		return st, s.errf("stats of", err)
	}
	if any && age > 0 {
		st.Lag = time.Duration(age * float64(time.Second))
	}
	return st, nil
}

// Count implements [Store].
func (s *SQLStore) Count(ctx context.Context) (map[State]int64, error) {
	rows, err := s.db.Query(ctx, fmt.Sprintf("SELECT state, COUNT(*) FROM %s GROUP BY state", s.table))
	if err != nil {
		return nil, s.errf("count", err)
	}
	defer rows.Close()
	out := map[State]int64{}
	for rows.Next() {
		var st string
		var n int64
		if err := rows.Scan(&st, &n); err != nil {
			return nil, s.errf("count", err)
		}
		out[State(st)] = n
	}
	return out, rows.Err()
}

var _ FailedRows = (*SQLStore)(nil)

// Blocked implements [FailedRows].
func (s *SQLStore) Blocked(ctx context.Context) ([]BlockedRow, error) {
	q := fmt.Sprintf("SELECT f.id, f.message_id, f.ordering_key, COALESCE(f.last_error, ''), COUNT(p.id) FROM %[1]s f"+
		" JOIN %[1]s p ON p.ordering_key = f.ordering_key AND p.state = 'pending' AND p.id > f.id"+
		" WHERE f.state = 'failed' AND f.ordering_key IS NOT NULL"+
		" GROUP BY f.id, f.message_id, f.ordering_key, f.last_error ORDER BY f.id", s.table)
	rows, err := s.db.Query(ctx, q)
	if err != nil {
		return nil, s.errf("list blocked in", err)
	}
	defer rows.Close()
	var out []BlockedRow
	for rows.Next() {
		var b BlockedRow
		if err := rows.Scan(&b.FailedID, &b.MessageID, &b.OrderingKey, &b.LastError, &b.Waiting); err != nil {
			return nil, s.errf("list blocked in", err)
		}
		out = append(out, b)
	}
	if err := rows.Err(); err != nil {
		return nil, s.errf("list blocked in", err)
	}
	return out, nil
}

// RetryFailed implements [FailedRows].
func (s *SQLStore) RetryFailed(ctx context.Context, id int64) error {
	q := s.rebind(fmt.Sprintf("UPDATE %s SET state = 'pending', attempts = 0, owner = NULL, locked_until = NULL, available_at = %s WHERE id = ? AND state = 'failed'",
		s.table, s.d.Now))
	n, err := s.db.Exec(ctx, q, id)
	if err != nil {
		return s.errf("retry failed row in", err)
	}
	if n == 0 {
		return fmt.Errorf("%w: id %d in %s", ErrNotFailed, id, s.cfg.Table)
	}
	return nil
}

// SkipFailed implements [FailedRows].
func (s *SQLStore) SkipFailed(ctx context.Context, id int64) error {
	var key, lastErr sql.NullString
	q := s.rebind(fmt.Sprintf("SELECT ordering_key, last_error FROM %s WHERE id = ? AND state = 'failed'", s.table))
	if err := s.db.QueryRow(ctx, q, id).Scan(&key, &lastErr); errors.Is(err, sqldb.ErrNoRows) {
		return fmt.Errorf("%w: id %d in %s", ErrNotFailed, id, s.cfg.Table)
	} else if err != nil {
		return s.errf("skip failed row in", err)
	}
	if !key.Valid {
		return nil // holds nothing back
	}
	note := truncate(fmt.Sprintf("skipped by an operator, ordering key %q released; %s", key.String, lastErr.String), 2000)
	u := s.rebind(fmt.Sprintf("UPDATE %s SET ordering_key = NULL, last_error = ? WHERE id = ? AND state = 'failed' AND ordering_key = ?", s.table))
	n, err := s.db.Exec(ctx, u, note, id, key.String)
	if err != nil {
		return s.errf("skip failed row in", err)
	}
	if n == 0 {
		return fmt.Errorf("%w: id %d in %s (changed meanwhile)", ErrNotFailed, id, s.cfg.Table)
	}
	return nil
}

// RowInfo is one row's bookkeeping, for tests and tools.
type RowInfo struct {
	ID          int64
	MessageID   string
	OrderingKey string
	State       State
	Attempts    int
	LastError   string
}

// Rows lists every row's bookkeeping in id order (for tests and tools).
func (s *SQLStore) Rows(ctx context.Context) ([]RowInfo, error) {
	rows, err := s.db.Query(ctx, fmt.Sprintf("SELECT id, message_id, COALESCE(ordering_key, ''), state, attempts, COALESCE(last_error, '') FROM %s ORDER BY id", s.table))
	if err != nil {
		return nil, s.errf("list", err)
	}
	defer rows.Close()
	var out []RowInfo
	for rows.Next() {
		var r RowInfo
		var st string
		if err := rows.Scan(&r.ID, &r.MessageID, &r.OrderingKey, &st, &r.Attempts, &r.LastError); err != nil {
			return nil, s.errf("list", err)
		}
		r.State = State(st)
		out = append(out, r)
	}
	return out, rows.Err()
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	// Cut on a rune boundary.
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}
