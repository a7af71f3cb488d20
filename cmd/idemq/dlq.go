package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/deadletter"
	"github.com/idemq/idemq/internal/display"
	"github.com/idemq/idemq/topology"
)

const dlqLong = `QUEUE is a work queue: its dead-letter queue is QUEUE.dlq (the topology
package's name). A name that already ends in ".dlq", or --dlq, names the
dead-letter queue itself.

list and show never remove anything: they take messages with basic.get
without acknowledging them and then close the channel, which returns every
one of them to its original position in the queue (a classic queue; the
broker marks them redelivered). While a list runs, the messages it holds are
invisible to other consumers of the dead-letter queue.

Dead letters are at-least-once: a consumer killed between a dead letter's
confirm and its own ack dead-letters the delivery twice. Every view shows
one entry per failure (same work queue, same message ID) with the count of
its duplicates, and a replay republishes one copy and drops the others.

The broker URL is --url, else IDEMQ_AMQP_URL, else the loopback default (guest on 127.0.0.1:5672).`

func newDLQCmd() *cobra.Command {
	var f dlqFlags
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "Inspect, replay and purge dead-letter queues",
		Long:  dlqLong,
	}
	cmd.PersistentFlags().StringVar(&f.url, "url", "", "broker URL (default $"+envAMQPURL+")")
	cmd.PersistentFlags().StringVar(&f.dlq, "dlq", "", "dead-letter queue name (default QUEUE.dlq)")
	cmd.AddCommand(newDLQListCmd(&f, false), newDLQListCmd(&f, true), newDLQGroupsCmd(&f), newDLQReplayCmd(&f), newDLQPurgeCmd(&f))
	return cmd
}

type dlqFlags struct {
	url string
	dlq string
}

// workQueue is the work queue of QUEUE: QUEUE itself, or QUEUE without
// ".dlq" when it names the dead-letter queue.
func (f *dlqFlags) workQueue(arg string) string {
	if q, ok := deadletter.WorkQueue(arg); ok {
		return q
	}
	return arg
}

func (f *dlqFlags) queue(arg string) string {
	switch {
	case f.dlq != "":
		return f.dlq
	case strings.HasSuffix(arg, ".dlq"):
		return arg
	}
	return topology.DLQName(arg)
}

// list reads the dead letters of dlq that opts selects (non-destructive).
func (f *dlqFlags) list(ctx context.Context, dlq string, opts deadletter.ListOptions) (total int, entries []*deadletter.Entry, err error) {
	c, err := deadletter.Open(amqpURL(f.url))
	if err != nil {
		return 0, nil, err
	}
	defer c.Close()
	return c.List(ctx, dlq, opts)
}

// filter selects dead letters by reason and ID (empty: everything).
type filter struct {
	reasons []string
	ids     []string
	groups  []string
}

func (f filter) match(e *deadletter.Entry) bool {
	if len(f.reasons) > 0 && !slices.Contains(f.reasons, e.Reason) {
		return false
	}
	if len(f.ids) > 0 && !slices.Contains(f.ids, e.MessageID) {
		return false
	}
	if len(f.groups) > 0 && !slices.Contains(f.groups, deadletter.GroupKey(e)) {
		return false
	}
	return true
}

func (f *filter) flags(cmd *cobra.Command) {
	cmd.Flags().StringSliceVar(&f.reasons, "reason", nil, "only dead letters with this reason (repeatable; broker reasons are broker:rejected, broker:expired, broker:delivery_limit, …)")
	cmd.Flags().StringSliceVar(&f.ids, "id", nil, "only the dead letter with this message ID (repeatable)")
	cmd.Flags().StringSliceVar(&f.groups, "group", nil, "only the dead letters of this group (repeatable; the KEY column of dlq groups)")
}

func newDLQListCmd(f *dlqFlags, detail bool) *cobra.Command {
	var flt filter
	var limit int
	var output string
	use, short := "list QUEUE", "List dead letters (non-destructive)"
	if detail {
		use, short = "show QUEUE", "Show dead letters in full: headers and body (non-destructive)"
	}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Long:  short + ".\n\n" + dlqSubLong,
		Args:  cobra.ExactArgs(1),
		RunE: wrapRunE(func(cmd *cobra.Command, args []string) error {
			cio, err := newIO(cmd, output)
			if err != nil {
				return err
			}
			dlq := f.queue(args[0])
			total, entries, err := f.list(cmd.Context(), dlq, deadletter.ListOptions{Filter: flt.match, Limit: limit, Detail: detail})
			if err != nil {
				return err
			}
			dups := 0
			for _, e := range entries {
				dups += e.Duplicates
			}
			if cio.json {
				js := map[string]any{"queue": dlq, "total": total, "messages": entries}
				if dups > 0 {
					js["duplicates"] = dups
				}
				return cio.printJSON(js)
			}
			if detail {
				printDetails(cio, dlq, total, dups, entries)
				return nil
			}
			printList(cio, dlq, total, dups, entries)
			return nil
		}),
	}
	flt.flags(cmd)
	def := 100
	if detail {
		def = 1
	}
	cmd.Flags().IntVar(&limit, "limit", def, "at most this many messages (0: all)")
	addOutputFlag(cmd, &output)
	return cmd
}

func newDLQGroupsCmd(f *dlqFlags) *cobra.Command {
	var flt filter
	var output string
	cmd := &cobra.Command{
		Use:   "groups QUEUE",
		Short: "Group dead letters by cause: reason and error text with numbers and IDs masked (non-destructive)",
		Long:  "Group dead letters by cause: reason and error text with numbers and IDs masked (non-destructive).\n\n" + dlqSubLong,
		Args:  cobra.ExactArgs(1),
		RunE: wrapRunE(func(cmd *cobra.Command, args []string) error {
			cio, err := newIO(cmd, output)
			if err != nil {
				return err
			}
			dlq := f.queue(args[0])
			total, entries, err := f.list(cmd.Context(), dlq, deadletter.ListOptions{Filter: flt.match})
			if err != nil {
				return err
			}
			groups := deadletter.GroupEntries(entries)
			if cio.json {
				return cio.printJSON(map[string]any{"queue": dlq, "total": total, "groups": groups})
			}
			cio.printf("%s: %d message(s), %d group(s)\n", dlq, total, len(groups))
			if len(groups) == 0 {
				return nil
			}
			tw := tabwriter.NewWriter(cio.out, 2, 8, 2, ' ', 0)
			fmt.Fprintln(tw, "KEY\tCOUNT\tREASON\tERROR (normalised)")
			for _, g := range groups {
				n := fmt.Sprint(g.Count)
				if g.Duplicates > 0 {
					n += fmt.Sprintf(" (+%d)", g.Duplicates)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", g.Key, n, g.Reason, display.OrDash(display.OneLine(g.Pattern, 80)))
			}
			tw.Flush()
			return nil
		}),
	}
	flt.flags(cmd)
	addOutputFlag(cmd, &output)
	return cmd
}

// printHead prints the first line of list and show.
func printHead(cio *cmdIO, dlq string, total, dups, shown int) {
	cio.printf("%s: %d message(s), %d shown", dlq, total, shown)
	if dups > 0 {
		cio.printf(", %d duplicate(s) collapsed", dups)
	}
	cio.printf("\n")
}

// idWithDups is a message ID with its duplicate count, for tables.
func idWithDups(e *deadletter.Entry) string {
	if e.Duplicates > 0 {
		return fmt.Sprintf("%s (+%d)", display.OrDash(e.MessageID), e.Duplicates)
	}
	return display.OrDash(e.MessageID)
}

func printList(cio *cmdIO, dlq string, total, dups int, entries []*deadletter.Entry) {
	printHead(cio, dlq, total, dups, len(entries))
	if len(entries) == 0 {
		return
	}
	tw := tabwriter.NewWriter(cio.out, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tMESSAGE ID\tREASON\tATTEMPTS\tLAST FAILURE\tERROR")
	for _, e := range entries {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\n", e.Position, idWithDups(e), e.Reason, e.Attempts,
			display.OrDash(display.ShortTime(e.LastFailure, time.RFC3339)), display.OrDash(display.OneLine(e.Error, 60)))
	}
	tw.Flush()
}

func printDetails(cio *cmdIO, dlq string, total, dups int, entries []*deadletter.Entry) {
	printHead(cio, dlq, total, dups, len(entries))
	for _, e := range entries {
		cio.printf("\nmessage %d\n", e.Position)
		row := func(k, v string) {
			if v != "" {
				cio.printf("  %-16s %s\n", k+":", v)
			}
		}
		row("message id", display.OrDash(e.MessageID))
		if e.Duplicates > 0 {
			row("duplicates", fmt.Sprintf("%d more copies of this dead letter in the queue (collapsed; a replay drops them)", e.Duplicates))
		}
		reason := e.Reason
		if e.ErrorClass != "" && e.ErrorClass != e.Reason {
			reason += " (" + e.ErrorClass + ")"
		}
		row("reason", reason)
		row("error", e.Error)
		row("attempts", fmt.Sprint(e.Attempts))
		row("first failure", e.FirstFailure)
		row("last failure", e.LastFailure)
		if e.Routable {
			row("original", fmt.Sprintf("exchange %q, routing key %q", e.OriginalExchange, e.OriginalRoutingKey))
		} else {
			row("original", "unknown")
		}
		row("group", e.Group)
		row("queue", e.Queue)
		row("content type", e.ContentType)
		keys := make([]string, 0, len(e.Headers))
		for k := range e.Headers {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		if len(keys) > 0 {
			cio.printf("  headers:\n")
			for _, k := range keys {
				cio.printf("    %s: %s\n", k, showHeader(e.Headers[k]))
			}
		}
		cio.printf("  body (%d bytes, %s):\n    %s\n", e.BodyBytes, e.BodyEncoding, display.OneLine(e.Body, 2000))
	}
}

func showHeader(v any) string { return deadletter.FormatHeader(v, true) }

func newDLQReplayCmd(f *dlqFlags) *cobra.Command {
	var flt filter
	var limit int
	var rate float64
	var dryRun, toOriginal, allowSynthetic bool
	var exchange, routingKey string
	var output string
	cmd := &cobra.Command{
		Use:   "replay QUEUE",
		Short: "Send dead letters back to the work queue they failed in",
		Long: `Republishes dead letters to the work queue they failed in — QUEUE, through
the default exchange; the queue must exist — with their message ID, body and
headers, and the failure-flow headers removed (so the attempt count starts
again). A dead letter whose headers say it failed in another queue is
refused (left in place).

The exchange and routing key recorded in a message's headers are never
used unless asked for: any producer can set them, and a replay to a fanout
or topic exchange would deliver the message again to every bound queue,
applying it again in other consumer groups. --to-original-route sends each
dead letter to the route in its headers; --exchange/--routing-key send them
all to one place.

Each one is acked from the dead-letter queue only after the broker has
confirmed its republish: an interruption can duplicate a replay (same
message ID: the dedup guard sees one message), never lose a dead letter.
Duplicates of a replayed dead letter (same work queue and message ID) are
dropped and counted. Messages that do not match the filters, or whose
republish failed, stay in the dead-letter queue in their position. Only the
messages present when the replay starts are considered, so a message that
fails again and comes back is not replayed twice.

Dead letters of reason missing-id or invalid-id carry a synthetic UUID the
failure policy gave them; they are left in place (reported as failed) unless
--allow-synthetic-id.

` + dlqSubLong,
		Args: cobra.ExactArgs(1),
		RunE: wrapRunE(func(cmd *cobra.Command, args []string) error {
			cio, err := newIO(cmd, output)
			if err != nil {
				return err
			}
			opts := deadletter.ReplayOptions{
				DLQ: f.queue(args[0]), WorkQueue: f.workQueue(args[0]), Filter: flt.match,
				Limit: limit, Rate: rate, DryRun: dryRun, AllowSyntheticID: allowSynthetic,
			}
			fixed := cmd.Flags().Changed("exchange") || cmd.Flags().Changed("routing-key")
			switch {
			case toOriginal && fixed:
				return errors.New("--to-original-route and --exchange/--routing-key exclude each other")
			case toOriginal:
				opts.Route = deadletter.RouteOriginal
			case fixed:
				if routingKey == "" && exchange == "" {
					return errors.New("--exchange and --routing-key are both empty: name a destination")
				}
				opts.Route, opts.Exchange, opts.RoutingKey = deadletter.RouteFixed, exchange, routingKey
			}
			if rate < 0 {
				return errors.New("--rate must be >= 0")
			}
			u := amqpURL(f.url)
			c, err := deadletter.Open(u)
			if err != nil {
				return err
			}
			defer c.Close()
			total, err := c.Count(opts.DLQ)
			if err != nil {
				return err
			}
			if !dryRun {
				pub, err := idemq.NewPublisher(idemq.PublisherConfig{URL: u, MaxAttempts: 5, Logger: cio.log})
				if err != nil {
					return err
				}
				defer pub.Close()
				opts.Publisher = pub
			}
			var bar *progressbar.ProgressBar
			barMax := total
			if limit > 0 && limit < barMax {
				barMax = limit
			}
			if !cio.json && (cio.tty || barMax > 100) {
				bar = progressbar.NewOptions(barMax, progressbar.OptionSetWriter(cio.err),
					progressbar.OptionSetDescription("replaying "+opts.DLQ), progressbar.OptionShowCount(),
					progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionClearOnFinish())
				opts.Progress = func() { _ = bar.Add(1) }
			}
			res, err := c.Replay(cmd.Context(), opts)
			if bar != nil {
				_ = bar.Finish()
			}
			if cio.json {
				if jerr := cio.printJSON(res); jerr != nil {
					return jerr
				}
			} else {
				printReplay(cio, res)
			}
			if errors.Is(err, deadletter.ErrNotReplayed) {
				return fmt.Errorf("%d dead letter(s) could not be replayed (left in %s)", len(res.Failed), opts.DLQ)
			}
			return err
		}),
	}
	flt.flags(cmd)
	cmd.Flags().IntVar(&limit, "limit", 0, "replay at most this many (0: all)")
	cmd.Flags().Float64Var(&rate, "rate", 0, "at most this many messages per second (0: no limit)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "show what would be replayed; change nothing")
	cmd.Flags().BoolVar(&allowSynthetic, "allow-synthetic-id", false, "also replay dead letters of reason missing-id/invalid-id, under the synthetic ID they were given")
	cmd.Flags().BoolVar(&toOriginal, "to-original-route", false, "send each dead letter to the exchange and routing key in its headers (a fanout/topic exchange reaches every bound queue)")
	cmd.Flags().StringVar(&exchange, "exchange", "", "send every dead letter to this exchange (with --routing-key)")
	cmd.Flags().StringVar(&routingKey, "routing-key", "", "send every dead letter with this routing key (with --exchange, default the default exchange)")
	addOutputFlag(cmd, &output)
	return cmd
}

func printReplay(cio *cmdIO, res deadletter.ReplayResult) {
	verb, drop := "replayed", "dropped duplicate"
	if res.DryRun {
		verb, drop = "would replay", "would drop duplicate"
	}
	for _, it := range res.Replayed {
		cio.printf("%s %s (%s) -> exchange %q, routing key %q\n", verb, display.OrDash(it.MessageID), it.Reason, it.Exchange, it.RoutingKey)
	}
	for _, it := range res.Duplicates {
		cio.printf("%s %s (%s)\n", drop, display.OrDash(it.MessageID), it.Reason)
	}
	for _, it := range res.Failed {
		cio.printf("failed %s (%s): %s\n", display.OrDash(it.MessageID), it.Reason, it.Error)
	}
	cio.printf("%s %d, duplicates dropped %d, skipped %d (filters), failed %d", verb, len(res.Replayed), len(res.Duplicates), res.Skipped, len(res.Failed))
	if res.DuplicatesLeft > 0 {
		cio.printf(" (and %d duplicate(s) of them left)", res.DuplicatesLeft)
	}
	cio.printf("\n")
}

func newDLQPurgeCmd(f *dlqFlags) *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "purge QUEUE",
		Short: "Delete every message of a dead-letter queue (asks first unless --yes)",
		Long:  "Delete every message of a dead-letter queue (asks first unless --yes).\n\n" + dlqSubLong,
		Args:  cobra.ExactArgs(1),
		RunE: wrapRunE(func(cmd *cobra.Command, args []string) error {
			cio, err := newIO(cmd, "text")
			if err != nil {
				return err
			}
			dlq := f.queue(args[0])
			c, err := deadletter.Open(amqpURL(f.url))
			if err != nil {
				return err
			}
			defer c.Close()
			n, err := c.Count(dlq)
			if err != nil {
				return err
			}
			if !yes {
				fmt.Fprintf(cio.err, "Purge %d message(s) from %s? This cannot be undone. [y/N] ", n, dlq)
				line, _ := bufio.NewReader(cio.in).ReadString('\n')
				switch strings.ToLower(strings.TrimSpace(line)) {
				case "y", "yes":
				default:
					return fmt.Errorf("purge of %s not confirmed; nothing deleted", dlq)
				}
			}
			purged, err := c.Purge(dlq)
			if err != nil {
				return err
			}
			cio.printf("purged %d message(s) from %s\n", purged, dlq)
			return nil
		}),
	}
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	return cmd
}

// dlqSubLong ends the help of each dlq subcommand; the long explanation is
// the dlq command's own (idemq dlq --help), not repeated in each.
const dlqSubLong = `QUEUE is a work queue (its dead-letter queue is QUEUE.dlq); a name ending
in ".dlq", or --dlq, names the dead-letter queue itself. How dead letters are
read, collapsed and replayed: idemq dlq --help.`
