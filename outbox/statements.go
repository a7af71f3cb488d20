package outbox

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/idemq/idemq/sqldb"
)

// statements is the SQL a SQLStore runs, compiled once per store.
type statements struct {
	// insert writes one row: @id, @exchange, @routing_key, @content_type,
	// @headers, @body, @ordering_key.
	insert sqldb.Stmt
	// notify wakes the listeners of @channel at commit; nil: none.
	notify *sqldb.Stmt
	// claim, indexed by ordered (0, 1).
	claim [2]claimStmt
	// claimLease leases the rows a claim read (@owner, @lease, the ids)
	// where the claim is a SELECT; nil where it is one UPDATE … RETURNING.
	claimLease *idList
	// markSent marks sent (or deletes, StoreConfig.DeleteSent) the rows
	// of the ids.
	markSent *idList

	retry       sqldb.Stmt // @delay, @last_error, @id, @owner
	fail        sqldb.Stmt // @reason, @id, @owner
	purge       sqldb.Stmt // @age (ms, negative), @limit
	stats       sqldb.Stmt
	count       sqldb.Stmt
	blocked     sqldb.Stmt
	retryFailed sqldb.Stmt // @id
	failedRow   sqldb.Stmt // @id
	skipFailed  sqldb.Stmt // @note, @id, @key
	rows        sqldb.Stmt
}

// claimStmt is one claim: its settings (a statement run first in its
// transaction, "" none) and the statement returning the claimed rows:
// UPDATE … RETURNING (@owner, @lease, @limit), or SELECT … (@limit)
// followed by statements.claimLease.
type claimStmt struct {
	settings string
	rows     sqldb.Stmt
}

// idList is a statement over a list of row ids: one array parameter where
// the dialect has arrays (one statement text for every batch size: a
// single prepared statement, less to parse), else one parameter per id.
type idList struct {
	array *sqldb.Stmt
	list  *sqldb.List
}

// newIDList compiles tmpl(in), in being the condition on id that matches
// the list, with params before the list's own.
func newIDList(d *sqldb.Dialect, vars map[string]string, tmpl func(in string) string, params ...string) (*idList, error) {
	if d.Arrays {
		st, err := d.Compile(tmpl("= ANY(@ids)"), vars, append(slices.Clip(params), "ids")...)
		return &idList{array: &st}, err
	}
	l := &idList{list: sqldb.NewList(func(n int) (sqldb.Stmt, error) {
		in, names := sqldb.Repeat("@id", n)
		return d.Compile(tmpl("IN ("+in+")"), vars, append(slices.Clip(params), names...)...)
	})}
	_, err := l.list.Stmt(1) // the template's errors, at once
	return l, err
}

// bind returns the statement and its arguments for ids, vals being the
// values of the parameters before the list.
func (l *idList) bind(ids []int64, vals ...any) (string, []any, error) {
	if l.array != nil {
		return l.array.SQL, l.array.Args(append(vals, ids)...), nil
	}
	st, err := l.list.Stmt(len(ids))
	if err != nil {
		return "", nil, err
	}
	for _, id := range ids {
		vals = append(vals, id)
	}
	return st.SQL, st.Args(vals...), nil
}

func compile(d *sqldb.Dialect, cfg StoreConfig) (statements, error) {
	vars := d.TableVars(cfg.Table)
	var s statements
	var errs []error
	c := func(tmpl string, params ...string) sqldb.Stmt {
		st, err := d.Compile(tmpl, vars, params...)
		errs = append(errs, err)
		return st
	}
	jsonIn, jsonOut := d.JSONIn, d.JSONOut
	if jsonIn == nil {
		jsonIn = func(e string) string { return e }
	}
	if jsonOut == nil {
		jsonOut = func(e string) string { return e }
	}
	s.insert = c("INSERT INTO {table} (message_id, exchange, routing_key, content_type, headers, body, ordering_key)"+
		" VALUES (@id, @exchange, @routing_key, @content_type, "+jsonIn("@headers")+", @body, @ordering_key)",
		"id", "exchange", "routing_key", "content_type", "headers", "body", "ordering_key")
	if d.Notify != nil {
		st := c(d.Notify("@channel"), "channel")
		s.notify = &st
	}
	// async is a relation that turns off the wait for the WAL flush of the
	// statement's own (implicit) transaction, joined into the marks'
	// FROM or USING clause ("" when SyncBookkeeping or the dialect cannot:
	// the one that can, PostgreSQL, has UPDATE … FROM and DELETE … USING).
	async := ""
	if d.AsyncCommit != "" && !cfg.SyncBookkeeping {
		async = "(SELECT " + d.AsyncCommit + ") AS idemq_async"
	}

	cols := "id, message_id, exchange, routing_key, content_type, " + jsonOut("headers") + ", body, ordering_key, attempts"
	lease := "owner = @owner, locked_until = " + d.NowPlusMillis("@lease") + ", attempts = attempts + 1"
	for i, ordered := range []bool{false, true} {
		where := claimWhere(ordered)
		if d.Arrays && d.Returning {
			// The claim's best plan walks the pending index in id order and
			// stops after limit rows. With statistics older than the backlog
			// (a burst, a relay that was down: autovacuum analyzes a minute
			// or more later; a table that keeps its sent rows says "almost
			// nothing pending"), the planner expects a few pending rows and
			// picks a bitmap scan of all of them and a sort instead: every
			// claim then reads the whole backlog, so draining it costs its
			// square. Bitmap scans off, the index walk is what is left for
			// the pending rows.
			var settings []string
			if d.NoBitmapScan != "" {
				settings = append(settings, d.NoBitmapScan)
			}
			if async != "" && !ordered {
				// A lease lost in a database crash could let another relay
				// publish a later row of the key while this one still
				// publishes the earlier: ordered claims stay synchronous.
				settings = append(settings, d.AsyncCommit)
			}
			if len(settings) > 0 {
				s.claim[i].settings = "SELECT " + strings.Join(settings, ", ")
			}
			s.claim[i].rows = c("UPDATE {table} SET "+lease+" WHERE id = ANY(ARRAY(SELECT c.id FROM {table} c WHERE "+where+
				" ORDER BY c.id LIMIT @limit{skip_locked})) RETURNING "+cols, "owner", "lease", "limit")
			continue
		}
		s.claim[i].rows = c("SELECT "+cols+" FROM {table} c WHERE "+where+" ORDER BY c.id LIMIT @limit{skip_locked}", "limit")
	}
	var err error
	if !d.Arrays || !d.Returning {
		s.claimLease, err = newIDList(d, vars, func(in string) string { return "UPDATE {table} SET " + lease + " WHERE id " + in }, "owner", "lease")
		errs = append(errs, err)
	}
	if cfg.DeleteSent {
		using := ""
		if async != "" {
			using = " USING " + async
		}
		s.markSent, err = newIDList(d, vars, func(in string) string {
			return "DELETE FROM {table}" + using + " WHERE state = 'pending' AND id " + in
		})
	} else {
		from := ""
		if async != "" {
			from = " FROM " + async
		}
		s.markSent, err = newIDList(d, vars, func(in string) string {
			return "UPDATE {table} SET state = 'sent', sent_at = {ts}, owner = NULL, locked_until = NULL, last_error = NULL" + from +
				" WHERE state = 'pending' AND id " + in
		})
	}
	errs = append(errs, err)

	s.retry = c("UPDATE {table} SET owner = NULL, locked_until = NULL, available_at = "+d.NowPlusMillis("@delay")+
		", last_error = @last_error WHERE id = @id AND state = 'pending' AND owner = @owner", "delay", "last_error", "id", "owner")
	s.fail = c("UPDATE {table} SET state = 'failed', owner = NULL, locked_until = NULL, last_error = @reason"+
		" WHERE id = @id AND state = 'pending' AND owner = @owner", "reason", "id", "owner")
	s.purge = c(d.LimitedDelete(sqldb.LimitedDelete{
		Table:   "{table}",
		Key:     "id",
		Where:   "state = 'sent' AND sent_at < " + d.NowPlusMillis("@age"),
		OrderBy: "id",
		Limit:   "@limit",
	}), "age", "limit")
	s.stats = c("SELECT COUNT(*), MIN(created_at) IS NOT NULL, COALESCE(" + d.AgeSeconds("MIN(created_at)") + ", 0) FROM {table} WHERE state = 'pending'")
	s.count = c("SELECT state, COUNT(*) FROM {table} GROUP BY state")
	s.blocked = c("SELECT f.id, f.message_id, f.ordering_key, COALESCE(f.last_error, ''), COUNT(p.id) FROM {table} f" +
		" JOIN {table} p ON p.ordering_key = f.ordering_key AND p.state = 'pending' AND p.id > f.id" +
		" WHERE f.state = 'failed' AND f.ordering_key IS NOT NULL" +
		" GROUP BY f.id, f.message_id, f.ordering_key, f.last_error ORDER BY f.id")
	s.retryFailed = c("UPDATE {table} SET state = 'pending', attempts = 0, owner = NULL, locked_until = NULL, available_at = {ts}"+
		" WHERE id = @id AND state = 'failed'", "id")
	s.failedRow = c("SELECT ordering_key, last_error FROM {table} WHERE id = @id AND state = 'failed'", "id")
	s.skipFailed = c("UPDATE {table} SET ordering_key = NULL, last_error = @note WHERE id = @id AND state = 'failed' AND ordering_key = @key",
		"note", "id", "key")
	s.rows = c("SELECT id, message_id, COALESCE(ordering_key, ''), state, attempts, COALESCE(last_error, '') FROM {table} ORDER BY id")
	if err := errors.Join(errs...); err != nil {
		return statements{}, fmt.Errorf("outbox: %w", err)
	}
	return s, nil
}

// claimWhere is the condition of the rows a claim takes (c), in a
// template.
func claimWhere(ordered bool) string {
	w := "c.state = 'pending' AND c.available_at <= {ts} AND (c.locked_until IS NULL OR c.locked_until < {ts})"
	if ordered {
		// An earlier pending row of the key, or an earlier failed one (an
		// operator retries or skips it: see [FailedRows]), holds c back.
		// Two NOT EXISTS, one per state, so each can use a partial index.
		w += " AND (c.ordering_key IS NULL OR (NOT EXISTS (SELECT 1 FROM {table} p WHERE p.ordering_key = c.ordering_key AND p.state = 'pending' AND p.id < c.id)" +
			" AND NOT EXISTS (SELECT 1 FROM {table} f WHERE f.ordering_key = c.ordering_key AND f.state = 'failed' AND f.id < c.id)))"
	}
	return w
}
