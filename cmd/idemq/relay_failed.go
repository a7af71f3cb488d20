package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/idemq/idemq/outbox"
)

// relayRowFlags locate the outbox table the row commands work on.
type relayRowFlags struct{ db, dialect, table string }

func (f *relayRowFlags) add(c *cobra.Command) *cobra.Command {
	fl := c.Flags()
	fl.StringVar(&f.db, "db", "", "database URL or DSN, as for relay")
	fl.StringVar(&f.dialect, "dialect", "", "postgres, mysql or sqlite (default: from --db)")
	fl.StringVar(&f.table, "table", outbox.DefaultTable, "outbox table")
	return c
}

// newOutboxCmd is `idemq outbox list|show|retry|skip|blocked`: the rows of
// the outbox table, and the operator's actions on failed ones (over
// outbox.SQLStore.Rows and outbox.FailedRows).
func newOutboxCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "outbox",
		Short: "List outbox rows; retry or skip failed ones",
	}
	var f relayRowFlags
	var state string
	list := f.add(&cobra.Command{
		Use:   "list",
		Short: "List outbox rows (id, state, attempts, message ID, ordering key, last error)",
		Args:  cobra.NoArgs,
		RunE: wrapRunE(func(cmd *cobra.Command, _ []string) error {
			return withOutbox(cmd, f, func(ctx context.Context, s *outbox.SQLStore) error {
				rows, err := s.Rows(ctx)
				if err != nil {
					return err
				}
				n := 0
				for _, r := range rows {
					if state != "" && string(r.State) != state {
						continue
					}
					n++
					fmt.Fprintf(cmd.OutOrStdout(), "row %d\t%s\tattempts %d\tmessage_id %q\tordering_key %q\tlast_error %q\n",
						r.ID, r.State, r.Attempts, r.MessageID, r.OrderingKey, r.LastError)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%d row(s)\n", n)
				return nil
			})
		}),
	})
	list.Flags().StringVar(&state, "state", "", "only rows in this state: pending, sent or failed")
	show := f.add(&cobra.Command{
		Use:   "show ROW-ID",
		Short: "Show one outbox row",
		Args:  cobra.ExactArgs(1),
		RunE: wrapRunE(func(cmd *cobra.Command, args []string) error {
			id, err := rowID(args[0])
			if err != nil {
				return err
			}
			return withOutbox(cmd, f, func(ctx context.Context, s *outbox.SQLStore) error {
				rows, err := s.Rows(ctx)
				if err != nil {
					return err
				}
				for _, r := range rows {
					if r.ID == id {
						fmt.Fprintf(cmd.OutOrStdout(), "row:          %d\nstate:        %s\nattempts:     %d\nmessage id:   %s\nordering key: %s\nlast error:   %s\n",
							r.ID, r.State, r.Attempts, r.MessageID, r.OrderingKey, r.LastError)
						return nil
					}
				}
				return fmt.Errorf("row %d: not in %s", id, s.Table())
			})
		}),
	})
	blocked, retry, skip := failedRowCmds(&f, "retry", "skip")
	cmd.AddCommand(list, show, f.add(blocked), f.add(retry), f.add(skip))
	return cmd
}

// newRelayFailedCmds are `idemq relay blocked|retry-failed|skip-failed`,
// the same commands as `idemq outbox blocked|retry|skip`.
func newRelayFailedCmds() []*cobra.Command {
	var f relayRowFlags
	blocked, retry, skip := failedRowCmds(&f, "retry-failed", "skip-failed")
	return []*cobra.Command{f.add(blocked), f.add(retry), f.add(skip)}
}

// failedRowCmds builds the commands on failed rows, under the given names
// for retry and skip. With an ordered relay a failed row holds back the
// later rows of its ordering key until it is retried or skipped.
func failedRowCmds(f *relayRowFlags, retryName, skipName string) (blocked, retry, skip *cobra.Command) {
	blocked = &cobra.Command{
		Use:   "blocked",
		Short: "List failed outbox rows that hold back later rows of their ordering key",
		Args:  cobra.NoArgs,
		RunE: wrapRunE(func(cmd *cobra.Command, _ []string) error {
			return withOutbox(cmd, *f, func(ctx context.Context, s *outbox.SQLStore) error {
				rows, err := s.Blocked(ctx)
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
	}
	action := func(name, short, done string, fn func(outbox.FailedRows, context.Context, int64) error) *cobra.Command {
		return &cobra.Command{
			Use:   name + " ROW-ID",
			Short: short,
			Args:  cobra.ExactArgs(1),
			RunE: wrapRunE(func(cmd *cobra.Command, args []string) error {
				id, err := rowID(args[0])
				if err != nil {
					return err
				}
				return withOutbox(cmd, *f, func(ctx context.Context, s *outbox.SQLStore) error {
					if err := fn(s, ctx, id); err != nil {
						if errors.Is(err, outbox.ErrNotFailed) {
							return fmt.Errorf("row %d of %s: %w (see idemq outbox list --state failed)", id, s.Table(), err)
						}
						return err
					}
					fmt.Fprintf(cmd.OutOrStdout(), done+"\n", id)
					return nil
				})
			}),
		}
	}
	retry = action(retryName, "Make a failed outbox row pending again (fresh attempts): published, then the rows it held back",
		"row %d is pending again", outbox.FailedRows.RetryFailed)
	skip = action(skipName, "Release the ordering key of a failed outbox row: it stays failed and unpublished, the later rows of its key go out",
		"row %d skipped: its ordering key no longer waits for it", outbox.FailedRows.SkipFailed)
	return blocked, retry, skip
}

func rowID(arg string) (int64, error) {
	id, err := strconv.ParseInt(arg, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("ROW-ID %q: not a row number (see idemq outbox list)", arg)
	}
	return id, nil
}

func withOutbox(cmd *cobra.Command, f relayRowFlags, fn func(context.Context, *outbox.SQLStore) error) error {
	ctx, d, db, closeDB, err := connect(cmd, f.db, f.dialect)
	if err != nil {
		return err
	}
	defer closeDB()
	store, err := openStore(ctx, d, db, f.table, true, false) // operator tools change no schema
	if err != nil {
		return err
	}
	return fn(ctx, store)
}
