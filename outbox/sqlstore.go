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
	db  sqldb.DB
	d   *sqldb.Dialect
	cfg StoreConfig
	st  statements
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
	if err := d.CheckTable(cfg.Table); err != nil {
		return nil, err
	}
	if cfg.Channel == "" {
		cfg.Channel = strings.ReplaceAll(cfg.Table, ".", "_")
	}
	if len(cfg.Channel) > 63 {
		cfg.Channel = cfg.Channel[:63]
	}
	st, err := compile(d, cfg)
	if err != nil {
		return nil, err
	}
	s := &SQLStore{db: db, d: d, cfg: cfg, st: st}
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
		if _, err := tx.Exec(ctx, s.st.insert.SQL, s.st.insert.Args(m.ID, m.Exchange, m.RoutingKey, m.ContentType, hv, body, kv)...); err != nil {
			return s.errf("add "+strconv.Quote(m.ID)+" to", err)
		}
	}
	if s.st.notify != nil && len(msgs) > 0 {
		if _, err := tx.Exec(ctx, s.st.notify.SQL, s.st.notify.Args(s.cfg.Channel)...); err != nil {
			return s.errf("notify for", err)
		}
	}
	return nil
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

// claimArray is Claim on a dialect with arrays and RETURNING
// (PostgreSQL): the claim's settings, then one UPDATE … WHERE id =
// ANY(ARRAY(SELECT … FOR UPDATE SKIP LOCKED)) RETURNING, in one
// transaction. The ARRAY(…) makes the select an init plan, so the update
// probes the primary key for exactly the claimed ids instead of possibly
// hash-joining against a scan of the table.
func (s *SQLStore) claimArray(ctx context.Context, owner string, limit int, leaseMS int64, ordered bool) ([]Row, error) {
	c := &s.st.claim[b2i(ordered)]
	tx, err := s.db.Begin(ctx, sqldb.TxOptions{})
	if err != nil {
		return nil, s.errf("claim (begin) from", err)
	}
	defer func() { _ = sqldb.Rollback(ctx, tx) }()
	if c.settings != "" {
		if _, err := tx.Exec(ctx, c.settings); err != nil {
			return nil, s.errf("claim (settings) from", err)
		}
	}
	out, err := s.claimed(ctx, tx, owner, 0, c.rows.SQL, c.rows.Args(owner, leaseMS, limit)...)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, s.errf("claim (commit) from", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
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
	if s.st.claimLease == nil {
		return s.claimArray(ctx, owner, limit, leaseMS, ordered)
	}
	c := &s.st.claim[b2i(ordered)]
	// Where locking reads also lock gaps (MySQL), READ COMMITTED: no gap
	// locks, so concurrent claims and inserts do not deadlock on the
	// pending index.
	tx, err := s.db.Begin(ctx, sqldb.TxOptions{ReadCommitted: s.d.GapLocks})
	if err != nil {
		return nil, s.errf("claim (begin) from", err)
	}
	defer func() { _ = sqldb.Rollback(ctx, tx) }()
	// The UPDATE below increments attempts: the rows read before it are
	// one attempt behind.
	out, err := s.claimed(ctx, tx, owner, 1, c.rows.SQL, c.rows.Args(limit)...)
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
	q, args, err := s.st.claimLease.bind(ids, owner, leaseMS)
	if err != nil {
		return nil, s.errf("claim (lease) in", err)
	}
	if _, err := tx.Exec(ctx, q, args...); err != nil {
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
	q, args, err := s.st.markSent.bind(ids)
	if err == nil {
		_, err = s.db.Exec(ctx, q, args...)
	}
	if err != nil {
		if s.cfg.DeleteSent {
			return s.errf("delete sent from", err)
		}
		return s.errf("mark sent in", err)
	}
	return nil
}

// Retry implements [Store].
func (s *SQLStore) Retry(ctx context.Context, owner string, id int64, delay time.Duration, lastErr string) error {
	if _, err := s.exec(ctx, s.st.retry, delay.Milliseconds(), truncate(lastErr, 2000), id, owner); err != nil {
		return s.errf("retry in", err)
	}
	return nil
}

// Fail implements [Store].
func (s *SQLStore) Fail(ctx context.Context, owner string, id int64, reason string) error {
	if _, err := s.exec(ctx, s.st.fail, truncate(reason, 2000), id, owner); err != nil {
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
	n, err := s.exec(ctx, s.st.purge, -max(olderThan, 0).Milliseconds(), limit)
	if err != nil {
		return 0, s.errf("purge", err)
	}
	return n, nil
}

func (s *SQLStore) exec(ctx context.Context, st sqldb.Stmt, vals ...any) (int64, error) {
	return s.db.Exec(ctx, st.SQL, st.Args(vals...)...)
}

// Stats implements [Store].
func (s *SQLStore) Stats(ctx context.Context) (Stats, error) {
	var st Stats
	var any bool
	var age float64
	if err := s.db.QueryRow(ctx, s.st.stats.SQL).Scan(&st.Pending, &any, &age); err != nil {
		return st, s.errf("stats of", err)
	}
	if any && age > 0 {
		st.Lag = time.Duration(age * float64(time.Second))
	}
	return st, nil
}

// Count implements [Store].
func (s *SQLStore) Count(ctx context.Context) (map[State]int64, error) {
	rows, err := s.db.Query(ctx, s.st.count.SQL)
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
	rows, err := s.db.Query(ctx, s.st.blocked.SQL)
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
	n, err := s.exec(ctx, s.st.retryFailed, id)
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
	q := s.st.failedRow
	if err := s.db.QueryRow(ctx, q.SQL, q.Args(id)...).Scan(&key, &lastErr); errors.Is(err, sqldb.ErrNoRows) {
		return fmt.Errorf("%w: id %d in %s", ErrNotFailed, id, s.cfg.Table)
	} else if err != nil {
		return s.errf("skip failed row in", err)
	}
	if !key.Valid {
		return nil // holds nothing back
	}
	note := truncate(fmt.Sprintf("skipped by an operator, ordering key %q released; %s", key.String, lastErr.String), 2000)
	n, err := s.exec(ctx, s.st.skipFailed, note, id, key.String)
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
	rows, err := s.db.Query(ctx, s.st.rows.SQL)
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
