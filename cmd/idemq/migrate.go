package main

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/idemq/idemq/dedup/sqlstore"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/sqldb"
)

type migrateFlags struct {
	db, dialect                         string
	dedupTable, inboxTable, outboxTable string
	only                                []string
	target                              int
	output                              string
}

func newMigrateCmd() *cobra.Command {
	var f migrateFlags
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply or show the versioned migrations of the tables idemq owns",
		Long: `migrate manages the schema of the tables idemq owns in a SQL database — the
dedup store's, the inbox's and the outbox's — with numbered migrations per
dialect, recorded in the table idemq_migrations. "migrate up" applies the
pending ones in order under one database-wide lock (PostgreSQL
pg_advisory_xact_lock, MySQL GET_LOCK, SQLite the write lock), so it is safe
while idemq processes start and apply them too (they do unless their
Config.NoMigrate is set). "migrate status" shows what is applied and what is
pending, changing nothing.

--db and --dialect take what "idemq relay" takes (postgres://…, mysql://…,
sqlite://path, …; default $IDEMQ_OUTBOX_DB_URL, $IDEMQ_POSTGRES_URL).`,
	}
	fl := cmd.PersistentFlags()
	fl.StringVar(&f.db, "db", "", "database URL or DSN (default $IDEMQ_OUTBOX_DB_URL, $IDEMQ_POSTGRES_URL)")
	fl.StringVar(&f.dialect, "dialect", "", "postgres, mysql or sqlite (default: from --db)")
	fl.StringVar(&f.dedupTable, "dedup-table", sqlstore.DefaultTable, "the dedup store's table")
	fl.StringVar(&f.inboxTable, "inbox-table", inbox.DefaultTable, "the inbox's table")
	fl.StringVar(&f.outboxTable, "outbox-table", outbox.DefaultTable, "the outbox's table")
	fl.StringSliceVar(&f.only, "only", []string{"dedup", "inbox", "outbox"}, "the components whose tables to migrate")
	fl.StringVarP(&f.output, "output", "o", "text", "output format: text or json")
	up := &cobra.Command{
		Use:   "up",
		Short: "Apply the pending migrations",
		Args:  cobra.NoArgs,
		RunE:  wrapRunE(func(cmd *cobra.Command, _ []string) error { return runMigrate(cmd, f, true) }),
	}
	up.Flags().IntVar(&f.target, "target", 0, "stop at this version of each table (0: the latest)")
	status := &cobra.Command{
		Use:   "status",
		Short: "Show the applied and pending migrations",
		Args:  cobra.NoArgs,
		RunE:  wrapRunE(func(cmd *cobra.Command, _ []string) error { return runMigrate(cmd, f, false) }),
	}
	cmd.AddCommand(up, status)
	return cmd
}

// schemas are the migrations of the selected components' tables.
func (f migrateFlags) schemas() ([]sqldb.Schema, error) {
	var out []sqldb.Schema
	for _, c := range f.only {
		switch strings.TrimSpace(c) {
		case sqlstore.Component:
			out = append(out, sqlstore.Schema(f.dedupTable))
		case inbox.Component:
			out = append(out, inbox.Schema(f.inboxTable))
		case outbox.Component:
			out = append(out, outbox.Schema(f.outboxTable))
		default:
			return nil, fmt.Errorf("--only %q: want dedup, inbox or outbox", c)
		}
	}
	return out, nil
}

// migrationStatus is one table's line of output.
type migrationStatus struct {
	Component string `json:"component"`
	Table     string `json:"table"`
	Version   int    `json:"version"`
	Latest    int    `json:"latest"`
	Applied   []int  `json:"applied"`
	Pending   []int  `json:"pending"`
}

func runMigrate(cmd *cobra.Command, f migrateFlags, up bool) error {
	cio, err := newIO(cmd, f.output)
	if err != nil {
		return err
	}
	schemas, err := f.schemas()
	if err != nil {
		return err
	}
	ctx, _, db, closeDB, err := connect(cmd, f.db, f.dialect)
	if err != nil {
		return err
	}
	defer closeDB()
	var st []sqldb.SchemaStatus
	if up {
		st, err = sqldb.Up(ctx, db, f.target, schemas...)
	} else {
		st, err = sqldb.Status(ctx, db, schemas...)
	}
	if err != nil {
		return err
	}
	out := make([]migrationStatus, len(st))
	for i, s := range st {
		out[i] = migrationStatus{Component: s.Component, Table: s.Table, Version: s.Current(), Latest: schemas[i].Latest(),
			Applied: nonNil(s.Applied), Pending: nonNil(s.Pending)}
	}
	if cio.json {
		return cio.printJSON(out)
	}
	tw := tabwriter.NewWriter(cio.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "COMPONENT\tTABLE\tVERSION\tLATEST\tPENDING")
	for _, s := range out {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\n", s.Component, s.Table, s.Version, s.Latest, ints(s.Pending))
	}
	return tw.Flush()
}

func nonNil(v []int) []int {
	if v == nil {
		return []int{}
	}
	return v
}

func ints(v []int) string {
	if len(v) == 0 {
		return "-"
	}
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ",")
}
