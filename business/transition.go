package business

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemq/idemq/sqldb"
)

// ErrNotFound: the row to transition does not exist.
var ErrNotFound = errors.New("business: row not found")

// TransitionError says a row is in neither the expected state nor the
// target one: the transition is refused (a payOrder for a cancelled order).
// It is a business outcome, not a transient failure: wrap it with
// idemq.Permanent in a handler that should dead-letter it.
type TransitionError struct {
	Table   string
	ID      any
	From    string // the state the transition expected
	To      string // the state it wanted
	Current string // the state the row is in
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("business: %s %v: cannot go from %q to %q: it is %q", e.Table, e.ID, e.From, e.To, e.Current)
}

// Machine transitions the state column of one table. Create it with
// [NewMachine]; it is immutable and safe for concurrent use.
type Machine struct {
	table               string
	update, selectState sqldb.Stmt
}

// NewMachine validates and quotes the identifiers for dialect d
// (postgres.Dialect(), mysql.Dialect(), sqlite.Dialect()): table (the
// identifier rule of [sqldb.Dialect.CheckTable]), its key column and its
// state column ([sqldb.CheckColumn]).
func NewMachine(d *sqldb.Dialect, table, idColumn, stateColumn string) (*Machine, error) {
	if err := d.CheckTable(table); err != nil {
		return nil, err
	}
	if err := sqldb.CheckColumn(idColumn); err != nil {
		return nil, err
	}
	if err := sqldb.CheckColumn(stateColumn); err != nil {
		return nil, err
	}
	vars := d.TableVars(table)
	vars["id"], vars["state"] = d.Quote(idColumn), d.Quote(stateColumn)
	update, err := d.Compile("UPDATE {table} SET {state} = @to WHERE {id} = @id AND {state} = @from", vars, "to", "id", "from")
	if err != nil {
		return nil, err
	}
	selectState, err := d.Compile("SELECT {state} FROM {table} WHERE {id} = @id", vars, "id")
	if err != nil {
		return nil, err
	}
	return &Machine{table: table, update: update, selectState: selectState}, nil
}

// Transition sets the state of row id to `to` only if it is `from`
// (UPDATE ... WHERE id = ? AND state = from). When no row changed it reads
// the current state:
//   - already `to`: nil — a redelivered message is an idempotent success;
//   - any other state: a [*TransitionError] naming both states;
//   - no such row: [ErrNotFound].
//
// Run it on q, your transaction handed over the one way (sqldb.StdTx(tx),
// postgres.PgxTx(tx)) — inside the inbox transaction, so the state change
// and the inbox row commit together. Under READ COMMITTED a concurrent transition of the
// same row waits on its lock and then sees the committed state.
func (m *Machine) Transition(ctx context.Context, q sqldb.Querier, id any, from, to string) error {
	n, err := q.Exec(ctx, m.update.SQL, m.update.Args(to, id, from)...)
	if err != nil {
		return fmt.Errorf("business: transition %s %v %q→%q: %w", m.table, id, from, to, err)
	}
	if n > 0 {
		return nil
	}
	var current string
	if err := q.QueryRow(ctx, m.selectState.SQL, m.selectState.Args(id)...).Scan(&current); err != nil {
		if errors.Is(err, sqldb.ErrNoRows) {
			return fmt.Errorf("%w: %s %v", ErrNotFound, m.table, id)
		}
		return fmt.Errorf("business: transition %s %v: read state: %w", m.table, id, err)
	}
	if current == to {
		// Also covers from == to on MySQL, which counts an unchanged row
		// as unaffected.
		return nil
	}
	return &TransitionError{Table: m.table, ID: id, From: from, To: to, Current: current}
}

// Transition is the one-shot form of [Machine.Transition].
func Transition(ctx context.Context, q sqldb.Querier, d *sqldb.Dialect, table, idColumn string, id any, stateColumn, from, to string) error {
	m, err := NewMachine(d, table, idColumn, stateColumn)
	if err != nil {
		return err
	}
	return m.Transition(ctx, q, id, from, to)
}
