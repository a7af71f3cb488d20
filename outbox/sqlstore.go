package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// DefaultTable is the outbox table name when none is configured.
const DefaultTable = "idemq_outbox"

var tableRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$`)

// CheckTable validates a table name: a plain identifier, optionally
// schema-qualified ("app.outbox"). It is used unquoted in SQL.
func CheckTable(name string) error {
	if !tableRE.MatchString(name) {
		return fmt.Errorf("%w: %q (want [schema.]identifier)", ErrInvalidTable, name)
	}
	return nil
}

// Dialect is what [SQLStore] needs to know about one SQL dialect. The dialect
// packages fill it in; applications do not need it.
type Dialect struct {
	// Name for errors and logs: "postgres", "mysql", "sqlite".
	Name string
	// Dollar makes placeholders $1, $2, … instead of ?.
	Dollar bool
	// Now is the SQL expression for the current time.
	Now string
	// NowPlusMillis returns an expression for now plus the placeholder ph
	// milliseconds (ph may be negative).
	NowPlusMillis func(ph string) string
	// AgeSeconds returns an expression for the age in seconds of the time
	// expression col (a float).
	AgeSeconds func(col string) string
	// HeadersIn wraps the headers placeholder in INSERT (e.g. a jsonb cast);
	// HeadersOut wraps the column in SELECT. Identity when nil.
	HeadersIn, HeadersOut func(string) string
	// SkipLocked: append FOR UPDATE SKIP LOCKED to the claim's select.
	SkipLocked bool
	// UpdateReturning: claim with one UPDATE … WHERE id = ANY(ARRAY(SELECT
	// … FOR UPDATE SKIP LOCKED)) RETURNING (PostgreSQL); otherwise select
	// then update in one transaction. The ARRAY(…) makes the select an init
	// plan, so the update probes the primary key for exactly the claimed
	// ids instead of possibly hash-joining against a scan of the table.
	UpdateReturning bool
	// IDArray: pass a list of ids as one array parameter (id = ANY(?))
	// instead of one placeholder per id (PostgreSQL). One statement text
	// for every batch size: a single prepared statement, less to parse.
	IDArray bool
	// DeleteLimit: purge with DELETE … ORDER BY id LIMIT n (MySQL) instead
	// of DELETE … WHERE id IN (SELECT … LIMIT n).
	DeleteLimit bool
	// ClaimTx are the options of the claim transaction.
	ClaimTx *sql.TxOptions
	// Migrate creates the table (idempotent, concurrency-safe).
	Migrate func(ctx context.Context, db *sql.DB, table string) error
	// AfterInsert, when set, is one more statement Add runs in the caller's
	// transaction (PostgreSQL: pg_notify), with AfterInsertArgs.
	AfterInsert     string
	AfterInsertArgs []any
}

// SQLStore implements [Store] over database/sql for a [Dialect]. Dialect
// packages embed it.
type SQLStore struct {
	DB      *sql.DB
	Dialect Dialect
	table   string

	insertSQL string
}

// NewSQLStore returns a store on db for table (default [DefaultTable]).
func NewSQLStore(db *sql.DB, d Dialect, table string) (*SQLStore, error) {
	if table == "" {
		table = DefaultTable
	}
	if err := CheckTable(table); err != nil {
		return nil, err
	}
	if d.HeadersIn == nil {
		d.HeadersIn = func(s string) string { return s }
	}
	if d.HeadersOut == nil {
		d.HeadersOut = func(s string) string { return s }
	}
	s := &SQLStore{DB: db, Dialect: d, table: table}
	s.insertSQL = s.rebind(fmt.Sprintf(
		"INSERT INTO %s (message_id, exchange, routing_key, content_type, headers, body, ordering_key) VALUES (?, ?, ?, ?, %s, ?, ?)",
		table, d.HeadersIn("?")))
	return s, nil
}

// Table implements [Store].
func (s *SQLStore) Table() string { return s.table }

// rebind turns ? placeholders into $n for dollar dialects. Queries here
// never contain a literal '?'.
func (s *SQLStore) rebind(q string) string {
	if !s.Dialect.Dollar {
		return q
	}
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func (s *SQLStore) errf(op string, err error) error {
	return fmt.Errorf("outbox(%s): %s %s: %w", s.Dialect.Name, op, s.table, err)
}

// Migrate implements [Store].
func (s *SQLStore) Migrate(ctx context.Context) error {
	if err := s.Dialect.Migrate(ctx, s.DB, s.table); err != nil {
		return s.errf("migrate", err)
	}
	return nil
}

// Add implements [Store].
func (s *SQLStore) Add(ctx context.Context, tx Execer, msgs ...Message) error {
	if tx == nil {
		return fmt.Errorf("outbox: Add needs a transaction")
	}
	for i := range msgs {
		m := &msgs[i]
		if err := m.Validate(); err != nil {
			return fmt.Errorf("outbox: add %q: %w", m.ID, errors.Join(ErrInvalidMessage, err))
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
		if _, err := tx.ExecContext(ctx, s.insertSQL, m.ID, m.Exchange, m.RoutingKey, m.ContentType, hv, body, kv); err != nil {
			return s.errf("add "+strconv.Quote(m.ID)+" to", err)
		}
	}
	if s.Dialect.AfterInsert != "" && len(msgs) > 0 {
		if _, err := tx.ExecContext(ctx, s.Dialect.AfterInsert, s.Dialect.AfterInsertArgs...); err != nil {
			return s.errf("notify for", err)
		}
	}
	return nil
}

func (s *SQLStore) cols() string {
	return "id, message_id, exchange, routing_key, content_type, " + s.Dialect.HeadersOut("headers") + ", body, ordering_key, attempts"
}

func (s *SQLStore) claimWhere(ordered bool) string {
	now := s.Dialect.Now
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
	if s.Dialect.IDArray {
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

// Claim implements [Store].
func (s *SQLStore) Claim(ctx context.Context, owner string, limit int, lease time.Duration, ordered bool) ([]Row, error) {
	if limit <= 0 {
		limit = 1
	}
	leaseMS := lease.Milliseconds()
	if leaseMS < 1 {
		leaseMS = 1
	}
	d := s.Dialect
	lock := ""
	if d.SkipLocked {
		lock = " FOR UPDATE SKIP LOCKED"
	}
	if d.UpdateReturning {
		q := s.rebind(fmt.Sprintf(
			"UPDATE %[1]s SET owner = ?, locked_until = %[2]s, attempts = attempts + 1 WHERE id = ANY(ARRAY(SELECT c.id FROM %[1]s c WHERE %[3]s ORDER BY c.id LIMIT ?%[4]s)) RETURNING %[5]s",
			s.table, d.NowPlusMillis("?"), s.claimWhere(ordered), lock, s.cols()))
		rows, err := s.DB.QueryContext(ctx, q, owner, leaseMS, limit)
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
			out = append(out, r)
		}
		if err := rows.Err(); err != nil {
			return nil, s.errf("claim from", err)
		}
		sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
		return out, nil
	}

	tx, err := s.DB.BeginTx(ctx, d.ClaimTx)
	if err != nil {
		return nil, s.errf("claim (begin) from", err)
	}
	defer tx.Rollback()
	q := s.rebind(fmt.Sprintf("SELECT %s FROM %s c WHERE %s ORDER BY c.id LIMIT ?%s",
		s.cols(), s.table, s.claimWhere(ordered), lock))
	rows, err := tx.QueryContext(ctx, q, limit)
	if err != nil {
		return nil, s.errf("claim from", err)
	}
	var out []Row
	for rows.Next() {
		r, err := scanRow(rows, owner)
		if err != nil {
			rows.Close()
			return nil, s.errf("claim (scan) from", err)
		}
		r.Attempts++
		out = append(out, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, s.errf("claim from", err)
	}
	if len(out) == 0 {
		return nil, tx.Commit()
	}
	ids := make([]int64, len(out))
	for i := range out {
		ids[i] = out[i].ID
	}
	u := s.rebind(fmt.Sprintf("UPDATE %s SET owner = ?, locked_until = %s, attempts = attempts + 1 WHERE id IN (%s)",
		s.table, d.NowPlusMillis("?"), placeholders(len(ids))))
	if _, err := tx.ExecContext(ctx, u, append([]any{owner, leaseMS}, int64Args(ids)...)...); err != nil {
		return nil, s.errf("claim (lease) in", err)
	}
	if err := tx.Commit(); err != nil {
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
	q := s.rebind(fmt.Sprintf("UPDATE %s SET state = 'sent', sent_at = %s, owner = NULL, locked_until = NULL, last_error = NULL WHERE state = 'pending' AND id %s",
		s.table, s.Dialect.Now, in))
	if _, err := s.DB.ExecContext(ctx, q, args...); err != nil {
		return s.errf("mark sent in", err)
	}
	return nil
}

// Retry implements [Store].
func (s *SQLStore) Retry(ctx context.Context, owner string, id int64, delay time.Duration, lastErr string) error {
	q := s.rebind(fmt.Sprintf("UPDATE %s SET owner = NULL, locked_until = NULL, available_at = %s, last_error = ? WHERE id = ? AND state = 'pending' AND owner = ?",
		s.table, s.Dialect.NowPlusMillis("?")))
	if _, err := s.DB.ExecContext(ctx, q, delay.Milliseconds(), truncate(lastErr, 2000), id, owner); err != nil {
		return s.errf("retry in", err)
	}
	return nil
}

// Fail implements [Store].
func (s *SQLStore) Fail(ctx context.Context, owner string, id int64, reason string) error {
	q := s.rebind(fmt.Sprintf("UPDATE %s SET state = 'failed', owner = NULL, locked_until = NULL, last_error = ? WHERE id = ? AND state = 'pending' AND owner = ?", s.table))
	if _, err := s.DB.ExecContext(ctx, q, truncate(reason, 2000), id, owner); err != nil {
		return s.errf("fail in", err)
	}
	return nil
}

// Purge implements [Store].
func (s *SQLStore) Purge(ctx context.Context, retention time.Duration, limit int) (int64, error) {
	if limit <= 0 {
		limit = 1000
	}
	cutoff := s.Dialect.NowPlusMillis("?")
	var q string
	if s.Dialect.DeleteLimit {
		q = fmt.Sprintf("DELETE FROM %s WHERE state = 'sent' AND sent_at < %s ORDER BY id LIMIT ?", s.table, cutoff)
	} else {
		q = fmt.Sprintf("DELETE FROM %[1]s WHERE id IN (SELECT id FROM %[1]s WHERE state = 'sent' AND sent_at < %[2]s ORDER BY id LIMIT ?)", s.table, cutoff)
	}
	res, err := s.DB.ExecContext(ctx, s.rebind(q), -retention.Milliseconds(), limit)
	if err != nil {
		return 0, s.errf("purge", err)
	}
	n, _ := res.RowsAffected()
	return n, nil
}

// Stats implements [Store].
func (s *SQLStore) Stats(ctx context.Context) (Stats, error) {
	q := fmt.Sprintf("SELECT COUNT(*), MIN(created_at) IS NOT NULL, COALESCE(%s, 0) FROM %s WHERE state = 'pending'",
		s.Dialect.AgeSeconds("MIN(created_at)"), s.table)
	var st Stats
	var any bool
	var age float64
	if err := s.DB.QueryRowContext(ctx, q).Scan(&st.Pending, &any, &age); err != nil {
		return st, s.errf("stats of", err)
	}
	if any && age > 0 {
		st.Lag = time.Duration(age * float64(time.Second))
	}
	return st, nil
}

// Count implements [Store].
func (s *SQLStore) Count(ctx context.Context) (map[State]int64, error) {
	rows, err := s.DB.QueryContext(ctx, fmt.Sprintf("SELECT state, COUNT(*) FROM %s GROUP BY state", s.table))
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
	rows, err := s.DB.QueryContext(ctx, q)
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
		s.table, s.Dialect.Now))
	res, err := s.DB.ExecContext(ctx, q, id)
	if err != nil {
		return s.errf("retry failed row in", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return s.errf("retry failed row in", err)
	} else if n == 0 {
		return fmt.Errorf("%w: id %d in %s", ErrNotFailed, id, s.table)
	}
	return nil
}

// SkipFailed implements [FailedRows].
func (s *SQLStore) SkipFailed(ctx context.Context, id int64) error {
	var key, lastErr sql.NullString
	q := s.rebind(fmt.Sprintf("SELECT ordering_key, last_error FROM %s WHERE id = ? AND state = 'failed'", s.table))
	if err := s.DB.QueryRowContext(ctx, q, id).Scan(&key, &lastErr); errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%w: id %d in %s", ErrNotFailed, id, s.table)
	} else if err != nil {
		return s.errf("skip failed row in", err)
	}
	if !key.Valid {
		return nil // holds nothing back
	}
	note := truncate(fmt.Sprintf("skipped by an operator, ordering key %q released; %s", key.String, lastErr.String), 2000)
	u := s.rebind(fmt.Sprintf("UPDATE %s SET ordering_key = NULL, last_error = ? WHERE id = ? AND state = 'failed' AND ordering_key = ?", s.table))
	res, err := s.DB.ExecContext(ctx, u, note, id, key.String)
	if err != nil {
		return s.errf("skip failed row in", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return s.errf("skip failed row in", err)
	} else if n == 0 {
		return fmt.Errorf("%w: id %d in %s (changed meanwhile)", ErrNotFailed, id, s.table)
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
	rows, err := s.DB.QueryContext(ctx, fmt.Sprintf("SELECT id, message_id, COALESCE(ordering_key, ''), state, attempts, COALESCE(last_error, '') FROM %s ORDER BY id", s.table))
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
