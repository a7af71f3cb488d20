package sqldb

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"
	"sync"
)

// Stmt is a statement compiled for one dialect by [Dialect.Compile].
type Stmt struct {
	// SQL is the statement text.
	SQL      string
	args     []int // for each bind position, the index of its parameter
	identity bool  // args is 0, 1, … len(args)-1
}

// Args returns the statement's arguments in bind order, from the values
// of its parameters in the order [Dialect.Compile] was given their names.
func (s Stmt) Args(vals ...any) []any {
	if s.identity && len(vals) == len(s.args) {
		return vals
	}
	out := make([]any, len(s.args))
	for i, n := range s.args {
		out[i] = vals[n]
	}
	return out
}

// Compile expands a statement template, once per dialect:
//
//   - {name} is replaced by vars[name]; without it in vars, {now} is
//     [Dialect.NowMillis], {ts} [Dialect.Now], {skip_locked} " " +
//     [Dialect.SkipLocked] (or nothing), and {idx:SUFFIX} a derived index
//     name when vars come from [Dialect.TableVars];
//   - @name ([a-z_][a-z0-9_]*) is a bind parameter for params' name: a
//     name used twice is bound twice with ?, once with $n, numbered in the
//     order the names first appear.
//
// Every dialect difference is a template built from the [Dialect]'s
// capabilities (its expressions, [Dialect.LimitedDelete], [Repeat]), never
// from its name.
func (d *Dialect) Compile(tmpl string, vars map[string]string, params ...string) (Stmt, error) {
	var b strings.Builder
	s := Stmt{identity: true}
	index := func(name string) int {
		for k, p := range params {
			if p == name {
				return k
			}
		}
		return -1
	}
	if len(params) > 8 {
		m := make(map[string]int, len(params))
		for k, p := range params {
			m[p] = k
		}
		index = func(name string) int {
			if k, ok := m[name]; ok {
				return k
			}
			return -1
		}
	}
	numbers := map[int]int{} // parameter -> $n
	for i := 0; i < len(tmpl); i++ {
		c := tmpl[i]
		switch c {
		case '{':
			j := strings.IndexByte(tmpl[i:], '}')
			if j < 0 {
				return Stmt{}, fmt.Errorf("sqldb: template: unterminated {")
			}
			name := tmpl[i+1 : i+j]
			v, ok := vars[name]
			if base, isIdx := vars["idx:"]; isIdx && !ok && strings.HasPrefix(name, "idx:") {
				v, ok = d.Quote(base+name[len("idx:"):]), true
			}
			if !ok {
				v, ok = d.builtin(name)
			}
			if !ok {
				return Stmt{}, fmt.Errorf("sqldb: template: unknown variable {%s}", name)
			}
			b.WriteString(v)
			i += j
		case '@':
			j := paramEnd(tmpl, i)
			n := index(tmpl[i+1 : j])
			if n < 0 {
				return Stmt{}, fmt.Errorf("sqldb: template: unknown parameter %q", tmpl[i:j])
			}
			if d.Dollar {
				num, seen := numbers[n]
				if !seen {
					s.args = append(s.args, n)
					num = len(s.args)
					numbers[n] = num
				}
				b.WriteString("$" + strconv.Itoa(num))
			} else {
				s.args = append(s.args, n)
				b.WriteByte('?')
			}
			s.identity = s.identity && n == len(s.args)-1
			i = j - 1
		default:
			b.WriteByte(c)
		}
	}
	s.SQL = b.String()
	return s, nil
}

// builtin is the value of the template variable {name} that vars do not
// set.
func (d *Dialect) builtin(name string) (string, bool) {
	switch name {
	case "now":
		return d.NowMillis, true
	case "ts":
		return d.Now, true
	case "skip_locked":
		if d.SkipLocked == "" {
			return "", true
		}
		return " " + d.SkipLocked, true
	}
	return "", false
}

// TableVars returns the template variables of table's statements for
// [Dialect.Compile]: {table} (quoted) and {idx:SUFFIX}, the quoted name
// of an index derived from the table.
func (d *Dialect) TableVars(table string) map[string]string {
	return map[string]string{"table": d.Quote(table), "idx:": table[strings.LastIndex(table, ".")+1:]}
}

// Repeat returns the template of a list of n items: n copies of item
// joined by ", ", each @name of the i-th copy renamed @name<i> (@id0,
// @id1, …), and the names of those parameters in the order they appear,
// for [Dialect.Compile]: Repeat("(@group, @id)", 2) is "(@group0, @id0),
// (@group1, @id1)". A dialect with [Dialect.Arrays] binds a list as one
// array parameter instead.
func Repeat(item string, n int) (string, []string) {
	type param struct{ at, end int } // @name is item[at:end]
	var ps []param
	for i := 0; i < len(item); i++ {
		if item[i] == '@' {
			j := paramEnd(item, i)
			ps = append(ps, param{i, j})
			i = j - 1
		}
	}
	var b strings.Builder
	names := make([]string, 0, n*len(ps))
	for k := 0; k < n; k++ {
		if k > 0 {
			b.WriteString(", ")
		}
		suffix := strconv.Itoa(k)
		last := 0
		for _, p := range ps {
			name := item[p.at+1:p.end] + suffix
			b.WriteString(item[last:p.at])
			b.WriteString("@" + name)
			names = append(names, name)
			last = p.end
		}
		b.WriteString(item[last:])
	}
	return b.String(), names
}

// paramEnd returns the end of the parameter name after the @ at tmpl[i]:
// [a-z_][a-z0-9_]*.
func paramEnd(tmpl string, i int) int {
	j := i + 1
	for j < len(tmpl) && (tmpl[j] >= 'a' && tmpl[j] <= 'z' || tmpl[j] == '_' || j > i+1 && tmpl[j] >= '0' && tmpl[j] <= '9') {
		j++
	}
	return j
}

// maxCachedList is the longest list whose statement a [List] keeps.
const maxCachedList = 512

// List is a statement with a list of parameters ([Repeat]) whose length
// is known only when it runs: compiled once per length, and kept for
// lists of up to 512. Safe for concurrent use.
type List struct {
	compile func(n int) (Stmt, error)
	stmts   sync.Map // int -> Stmt
}

// NewList returns the [List] whose statement for a list of n is
// compile(n) (a [Dialect.Compile] of a template holding [Repeat](…, n)).
func NewList(compile func(n int) (Stmt, error)) *List {
	return &List{compile: compile}
}

// Stmt returns the statement for a list of n.
func (l *List) Stmt(n int) (Stmt, error) {
	if st, ok := l.stmts.Load(n); ok {
		return st.(Stmt), nil
	}
	st, err := l.compile(n)
	if err == nil && n <= maxCachedList {
		l.stmts.Store(n, st)
	}
	return st, err
}

// LimitedDelete is a DELETE of at most Limit rows, written for a dialect
// by [Dialect.LimitedDelete]. Its fields are template text
// ([Dialect.Compile]).
type LimitedDelete struct {
	// Table is the table, typically "{table}".
	Table string
	// Key names a row: a column or a comma-separated list of columns
	// ("id", "group_name, message_id").
	Key string
	// RowID: the table has the dialect's implicit row id
	// ([Dialect.RowID]; not a SQLite WITHOUT ROWID table), which then
	// names the rows instead of Key.
	RowID bool
	// Where is the condition of the rows that may go. It is joined to
	// other conditions with AND: parenthesise an OR.
	Where string
	// OrderBy is the order the rows go in. Default "": any.
	OrderBy string
	// StableOrder, when OrderBy is empty, orders the rows where the
	// dialect deletes them directly with DELETE … LIMIT
	// ([Dialect.DeleteLimit]): MySQL's statement-based replication needs
	// an order to delete the same rows on a replica. Default "": none.
	StableOrder string
	// Limit is the most rows deleted, typically a parameter ("@batch").
	Limit string
	// SkipLocked skips the rows other transactions lock where the dialect
	// picks the rows in a subquery and has [Dialect.SkipLocked]; the rows
	// picked are then checked against Where again. Default false: wait
	// for them.
	SkipLocked bool
}

// LimitedDelete returns the template of del: DELETE … WHERE … [ORDER BY
// …] LIMIT … where the dialect has [Dialect.DeleteLimit], else DELETE …
// WHERE key IN (SELECT key … LIMIT …).
func (d *Dialect) LimitedDelete(del LimitedDelete) string {
	if d.DeleteLimit {
		q := "DELETE FROM " + del.Table + " WHERE " + del.Where
		if order := cmp.Or(del.OrderBy, del.StableOrder); order != "" {
			q += " ORDER BY " + order
		}
		return q + " LIMIT " + del.Limit
	}
	cols := del.Key
	if del.RowID && d.RowID != "" {
		cols = d.RowID
	}
	key := cols
	if strings.Contains(cols, ",") {
		key = "(" + cols + ")"
	}
	q := "DELETE FROM " + del.Table + " WHERE " + key + " IN (SELECT " + cols + " FROM " + del.Table + " WHERE " + del.Where
	if del.OrderBy != "" {
		q += " ORDER BY " + del.OrderBy
	}
	q += " LIMIT " + del.Limit
	if del.SkipLocked && d.SkipLocked != "" {
		return q + " " + d.SkipLocked + ") AND " + del.Where
	}
	return q + ")"
}
