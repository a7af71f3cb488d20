package sqlstore

import (
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strconv"
	"strings"
)

// Placeholders is how a dialect writes bind parameters.
type Placeholders int

const (
	// Question: ? for every parameter, in order (MySQL, SQLite).
	Question Placeholders = iota
	// Dollar: $1, $2, … numbered, a repeated parameter reusing its number
	// (PostgreSQL).
	Dollar
)

// Dialect is the SQL one database speaks. The dialect packages fill it in;
// applications do not need it.
//
// Statements are templates: {table}, {index} and {key} are replaced by the
// quoted table, index and key-column names, {now} by [Dialect.Now] and
// {lock} by a 63-bit integer derived from the table name (for advisory
// locks). Parameters are named: @key, @token, @lease and @window (both in
// milliseconds) and @batch.
type Dialect struct {
	// Name for errors and logs: "postgres", "mysql", "sqlite".
	Name string
	// Placeholders is the bind-parameter style.
	Placeholders Placeholders
	// Quote quotes an identifier (already validated as [A-Za-z_][A-Za-z0-9_]*).
	Quote func(ident string) string
	// Now is an SQL expression for the database's current time in Unix
	// milliseconds (a BIGINT), constant within one statement.
	Now string
	// Migrate are the statements that create the table and its index, run
	// in order; each must be idempotent and safe to run concurrently.
	Migrate []string
	// Claim upserts processing(@token) for @lease ms, taking the row only
	// when it is absent, expired (expires_at <= now) or processing(@token).
	Claim string
	// ClaimReturnsRow: Claim returns one row (acquired, state, owner,
	// expires_at - now), acquired being 1 when the statement took the row
	// and 0 when the row is the one it did not take (a snapshot that may be
	// stale); or no row, and the store reads the row. Otherwise Claim is
	// executed and the store always reads the row afterwards.
	ClaimReturnsRow bool
	// CompleteLost records done for @window ms unless a live record is
	// there (expires_at > now): the lost-lease path of Complete.
	CompleteLost string
	// Purge deletes at most @batch expired rows.
	Purge string
	// Retryable reports a transient error (deadlock, serialization failure)
	// after which the statement, having had no effect, may run again. Nil:
	// none is.
	Retryable func(error) bool
}

// DefaultTable is the table name when [Config.Table] is empty.
const DefaultTable = "idemq_dedup"

// ErrInvalidTable is returned for a table name that is not a plain SQL
// identifier.
var ErrInvalidTable = errors.New("sqlstore: invalid table name")

// The index name adds "_expires_idx" (12 bytes); identifiers stay within 63
// bytes (PostgreSQL's limit; MySQL's is 64).
var tableRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,50}$`)

// CheckTable validates a table name: a plain identifier of at most 51 bytes
// (letters, digits, underscore). Use the connection's default schema or
// search_path to place it in a schema.
func CheckTable(name string) error {
	if !tableRE.MatchString(name) {
		return fmt.Errorf("%w: %q (want [A-Za-z_][A-Za-z0-9_]*, at most 51 bytes)", ErrInvalidTable, name)
	}
	return nil
}

// argument indices of the named parameters.
const (
	argKey = iota
	argToken
	argLease
	argWindow
	argBatch
	numArgs
)

var argNames = map[string]int{"key": argKey, "token": argToken, "lease": argLease, "window": argWindow, "batch": argBatch}

// stmt is a compiled statement: the dialect's SQL and which named argument
// goes into each bind position.
type stmt struct {
	query string
	args  []int
}

// bind returns the arguments of s in bind order.
func (s stmt) bind(a [numArgs]any) []any {
	out := make([]any, len(s.args))
	for i, n := range s.args {
		out[i] = a[n]
	}
	return out
}

// compile expands a template for dialect d and table.
func (d Dialect) compile(tmpl, table string) (stmt, error) {
	h := fnv.New64a()
	_, _ = h.Write([]byte("idemq-dedup:" + table))
	q := strings.NewReplacer(
		"{table}", d.Quote(table),
		"{index}", d.Quote(table+"_expires_idx"),
		"{key}", d.Quote("key"),
		"{now}", d.Now,
		"{lock}", strconv.FormatInt(int64(h.Sum64()>>1), 10),
	).Replace(tmpl)
	var b strings.Builder
	var s stmt
	numbers := map[int]int{} // named arg -> $n (Dollar)
	for i := 0; i < len(q); i++ {
		c := q[i]
		if c != '@' {
			b.WriteByte(c)
			continue
		}
		j := i + 1
		for j < len(q) && q[j] >= 'a' && q[j] <= 'z' {
			j++
		}
		n, ok := argNames[q[i+1:j]]
		if !ok {
			return stmt{}, fmt.Errorf("sqlstore: %s template: unknown parameter %q", d.Name, q[i:j])
		}
		switch d.Placeholders {
		case Dollar:
			num, seen := numbers[n]
			if !seen {
				s.args = append(s.args, n)
				num = len(s.args)
				numbers[n] = num
			}
			b.WriteString("$" + strconv.Itoa(num))
		default:
			s.args = append(s.args, n)
			b.WriteByte('?')
		}
		i = j - 1
	}
	s.query = b.String()
	return s, nil
}

// statements is the SQL one Store runs, compiled once.
type statements struct {
	migrate      []stmt
	claim        stmt
	read         stmt
	completeOwn  stmt
	completeLost stmt
	release      stmt
	extend       stmt
	owned        stmt
	get          stmt
	forget       stmt
	forgetIdle   stmt
	purge        stmt
	stats        stmt
}

// Dialect-neutral statements (standard SQL over the templates).
const (
	readSQL        = `SELECT state, owner, expires_at - {now} FROM {table} WHERE {key} = @key`
	completeOwnSQL = `UPDATE {table} SET state = 'done', owner = '', expires_at = {now} + @window` +
		` WHERE {key} = @key AND state = 'processing' AND owner = @token AND expires_at > {now}`
	releaseSQL = `DELETE FROM {table} WHERE {key} = @key AND state = 'processing' AND owner = @token AND expires_at > {now}`
	extendSQL  = `UPDATE {table} SET expires_at = {now} + @lease` +
		` WHERE {key} = @key AND state = 'processing' AND owner = @token AND expires_at > {now}`
	ownedSQL  = `SELECT COUNT(*) FROM {table} WHERE {key} = @key AND state = 'processing' AND owner = @token AND expires_at > {now}`
	getSQL    = `SELECT state, owner, expires_at FROM {table} WHERE {key} = @key AND expires_at > {now}`
	forgetSQL = `DELETE FROM {table} WHERE {key} = @key`
	// forgetIdleSQL deletes the row unless it is a live lease.
	forgetIdleSQL = `DELETE FROM {table} WHERE {key} = @key AND NOT (state = 'processing' AND expires_at > {now})`
	statsSQL      = `SELECT` +
		` COALESCE(SUM(CASE WHEN expires_at > {now} AND state = 'processing' THEN 1 ELSE 0 END), 0),` +
		` COALESCE(SUM(CASE WHEN expires_at > {now} AND state = 'done' THEN 1 ELSE 0 END), 0),` +
		` COALESCE(SUM(CASE WHEN expires_at <= {now} THEN 1 ELSE 0 END), 0)` +
		` FROM {table}`
)

func (d Dialect) statements(table string) (statements, error) {
	if d.Name == "" || d.Quote == nil || d.Now == "" || d.Claim == "" || d.CompleteLost == "" || d.Purge == "" || len(d.Migrate) == 0 {
		return statements{}, errors.New("sqlstore: incomplete dialect")
	}
	var s statements
	var err error
	c := func(tmpl string) stmt {
		if err != nil {
			return stmt{}
		}
		var st stmt
		st, err = d.compile(tmpl, table)
		return st
	}
	for _, m := range d.Migrate {
		s.migrate = append(s.migrate, c(m))
	}
	s.claim = c(d.Claim)
	s.read = c(readSQL)
	s.completeOwn = c(completeOwnSQL)
	s.completeLost = c(d.CompleteLost)
	s.release = c(releaseSQL)
	s.extend = c(extendSQL)
	s.owned = c(ownedSQL)
	s.get = c(getSQL)
	s.forget = c(forgetSQL)
	s.forgetIdle = c(forgetIdleSQL)
	s.purge = c(d.Purge)
	s.stats = c(statsSQL)
	return s, err
}
