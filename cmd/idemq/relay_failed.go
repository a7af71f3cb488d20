package main

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/idemq/idemq/outbox"
)

// relayRowFlags locate the outbox table the failed-row commands work on.
type relayRowFlags struct{ db, dialect, table string }

// newRelayFailedCmds are the operator's commands for failed outbox rows:
// with an ordered relay a failed row holds back the later rows of its
// ordering key until it is retried or skipped. They are thin layers over
// outbox.FailedRows.
func newRelayFailedCmds() []*cobra.Command {
	var f relayRowFlags
	flags := func(c *cobra.Command) *cobra.Command {
		fl := c.Flags()
		fl.StringVar(&f.db, "db", "", "database URL or DSN, as for relay")
		fl.StringVar(&f.dialect, "dialect", "", "postgres, mysql or sqlite (default: from --db)")
		fl.StringVar(&f.table, "table", outbox.DefaultTable, "outbox table")
		return c
	}
	blocked := flags(&cobra.Command{
		Use:   "blocked",
		Short: "List failed outbox rows that hold back later rows of their ordering key",
		Args:  cobra.NoArgs,
		RunE: wrapRunE(func(cmd *cobra.Command, _ []string) error {
			return withFailedRows(cmd, f, func(fr outbox.FailedRows) error {
				rows, err := fr.Blocked(cmd.Context())
				if err != nil {
					return err
				}
				for _, b := range rows {
					fmt.Fprintf(cmd.OutOrStdout(), "row %d\tmessage_id %q\tordering_key %q\twaiting %d\tlast_error %q\n",
						b.FailedID, b.MessageID, b.OrderingKey, b.Waiting, b.LastError)
				}
				if len(rows) == 0 {
					fmt.Fprintln(cmd.OutOrStdout(), "no failed row holds back its ordering key")
				}
				return nil
			})
		}),
	})
	retry := flags(&cobra.Command{
		Use:   "retry-failed ROW-ID",
		Short: "Make a failed outbox row pending again (fresh attempts): published, then the rows it held back",
		Args:  cobra.ExactArgs(1),
		RunE: wrapRunE(func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil {
				return fmt.Errorf("ROW-ID %q: %w", args[0], err)
			}
			return withFailedRows(cmd, f, func(fr outbox.FailedRows) error {
				if err := fr.RetryFailed(cmd.Context(), id); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "row %d is pending again\n", id)
				return nil
			})
		}),
	})
	skip := flags(&cobra.Command{
		Use:   "skip-failed ROW-ID",
		Short: "Release the ordering key of a failed outbox row: it stays failed and unpublished, the later rows of its key go out",
		Args:  cobra.ExactArgs(1),
		RunE: wrapRunE(func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil {
				return fmt.Errorf("ROW-ID %q: %w", args[0], err)
			}
			return withFailedRows(cmd, f, func(fr outbox.FailedRows) error {
				if err := fr.SkipFailed(cmd.Context(), id); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "row %d skipped: its ordering key no longer waits for it\n", id)
				return nil
			})
		}),
	})
	return []*cobra.Command{blocked, retry, skip}
}

func withFailedRows(cmd *cobra.Command, f relayRowFlags, fn func(outbox.FailedRows) error) error {
	ctx, d, db, closeDB, err := connect(cmd, f.db, f.dialect)
	if err != nil {
		return err
	}
	defer closeDB()
	store, err := openStore(ctx, d, db, f.table, true) // operator tools change no schema
	if err != nil {
		return err
	}
	return fn(store)
}
