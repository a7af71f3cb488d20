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
	"unicode/utf8"

	"encoding/base64"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/retry"
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
	cmd.AddCommand(newDLQListCmd(&f, false), newDLQListCmd(&f, true), newDLQReplayCmd(&f), newDLQPurgeCmd(&f))
	return cmd
}

type dlqFlags struct {
	url string
	dlq string
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

// filter selects dead letters by reason and ID (empty: everything).
type filter struct {
	reasons []string
	ids     []string
}

func (f filter) match(e *dlqEntry) bool {
	if len(f.reasons) > 0 && !slices.Contains(f.reasons, e.Reason) {
		return false
	}
	if len(f.ids) > 0 && !slices.Contains(f.ids, e.MessageID) {
		return false
	}
	return true
}

func (f *filter) flags(cmd *cobra.Command) {
	cmd.Flags().StringSliceVar(&f.reasons, "reason", nil, "only dead letters with this reason (repeatable; broker reasons are broker:rejected, broker:expired, broker:delivery_limit, …)")
	cmd.Flags().StringSliceVar(&f.ids, "id", nil, "only the dead letter with this message ID (repeatable)")
}

// dlqEntry is a dead letter as the commands print it.
type dlqEntry struct {
	Position           int            `json:"position"`
	MessageID          string         `json:"message_id"`
	Reason             string         `json:"reason"`
	ErrorClass         string         `json:"error_class,omitempty"`
	Error              string         `json:"error,omitempty"`
	Attempts           int64          `json:"attempts"`
	FirstFailure       string         `json:"first_failure,omitempty"`
	LastFailure        string         `json:"last_failure,omitempty"`
	OriginalExchange   string         `json:"original_exchange"`
	OriginalRoutingKey string         `json:"original_routing_key"`
	Group              string         `json:"group,omitempty"`
	Queue              string         `json:"queue,omitempty"`
	ContentType        string         `json:"content_type,omitempty"`
	BodyBytes          int            `json:"body_bytes"`
	Body               string         `json:"body,omitempty"`
	BodyEncoding       string         `json:"body_encoding,omitempty"`
	Headers            map[string]any `json:"headers,omitempty"`
	Deaths             []retry.Death  `json:"x_death,omitempty"`

	routable bool
}

func hstr(h amqp.Table, k string) (string, bool) {
	switch v := h[k].(type) {
	case string:
		return v, true
	case []byte:
		return string(v), true
	}
	return "", false
}

// entryOf reads the idemq headers of a dead letter, falling back to the
// broker's x-death for what the broker dead-lettered by itself.
func entryOf(pos int, d *amqp.Delivery, detail bool) *dlqEntry {
	h := d.Headers
	e := &dlqEntry{Position: pos, MessageID: d.MessageId, ContentType: d.ContentType, BodyBytes: len(d.Body)}
	deaths := retry.ParseXDeath(h[retry.HeaderDeath])
	e.Reason, _ = hstr(h, retry.HeaderReason)
	if e.Reason == "" {
		e.Reason = "unknown"
		if len(deaths) > 0 && deaths[0].Reason != "" {
			e.Reason = "broker:" + deaths[0].Reason
		}
	}
	e.ErrorClass, _ = hstr(h, retry.HeaderErrorClass)
	e.Error, _ = hstr(h, retry.HeaderError)
	if n, ok := retry.Int(h[retry.HeaderAttempts]); ok {
		e.Attempts = n
	}
	e.FirstFailure, _ = hstr(h, retry.HeaderFirstFailure)
	e.LastFailure, _ = hstr(h, retry.HeaderLastFailure)
	e.Group, _ = hstr(h, retry.HeaderGroup)
	e.Queue, _ = hstr(h, retry.HeaderQueue)
	ex, okEx := hstr(h, retry.HeaderOriginalExchange)
	rk, okRK := hstr(h, retry.HeaderOriginalRoutingKey)
	if okEx && okRK {
		e.OriginalExchange, e.OriginalRoutingKey, e.routable = ex, rk, true
	} else if len(deaths) > 0 {
		// The broker dead-lettered it: the oldest x-death entry is last.
		first := deaths[len(deaths)-1]
		if len(first.RoutingKeys) > 0 {
			e.OriginalExchange, e.OriginalRoutingKey, e.routable = first.Exchange, first.RoutingKeys[0], true
		}
		if e.Queue == "" {
			e.Queue = first.Queue
		}
	}
	if detail {
		if utf8.Valid(d.Body) {
			e.Body, e.BodyEncoding = string(d.Body), "utf8"
		} else {
			e.Body, e.BodyEncoding = base64.StdEncoding.EncodeToString(d.Body), "base64"
		}
		e.Headers = map[string]any{}
		for k, v := range h {
			e.Headers[k] = v
		}
		delete(e.Headers, idemq.PublishSeqHeader) // the publisher's per-channel bookkeeping, not the message's
		e.Deaths = deaths
	}
	return e
}

// dlqConn is a connection and a channel on the dead-letter queue.
type dlqConn struct {
	conn *amqp.Connection
	ch   *amqp.Channel
	url  string
}

func openDLQ(rawURL string) (*dlqConn, error) {
	conn, err := amqp.Dial(rawURL)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", redactURL(rawURL), err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("open channel: %w", err)
	}
	return &dlqConn{conn: conn, ch: ch, url: rawURL}, nil
}

func (c *dlqConn) close() { _ = c.conn.Close() }

func (c *dlqConn) count(queue string) (int, error) {
	q, err := c.ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("dead-letter queue %q: %w", queue, err)
	}
	return q.Messages, nil
}

// peek takes up to the queue's current count of messages without acking
// them, calling visit for each; visit returns false to stop. The caller
// closes the channel to give the unacked ones back.
func (c *dlqConn) peek(ctx context.Context, queue string, visit func(pos int, d *amqp.Delivery) (bool, error)) (int, error) {
	total, err := c.count(queue)
	if err != nil {
		return 0, err
	}
	for pos := 1; pos <= total; pos++ {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		d, ok, err := c.ch.Get(queue, false)
		if err != nil {
			return total, fmt.Errorf("get from %q: %w", queue, err)
		}
		if !ok {
			break
		}
		more, err := visit(pos, &d)
		if err != nil {
			return total, err
		}
		if !more {
			break
		}
	}
	return total, nil
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
		Long:  dlqLong,
		Args:  cobra.ExactArgs(1),
		RunE: wrapRunE(func(cmd *cobra.Command, args []string) error {
			cio, err := newIO(cmd, output)
			if err != nil {
				return err
			}
			dlq := f.queue(args[0])
			c, err := openDLQ(amqpURL(f.url))
			if err != nil {
				return err
			}
			defer c.close()
			var entries []*dlqEntry
			total, err := c.peek(cmd.Context(), dlq, func(pos int, d *amqp.Delivery) (bool, error) {
				e := entryOf(pos, d, detail)
				if flt.match(e) {
					entries = append(entries, e)
				}
				return limit <= 0 || len(entries) < limit, nil
			})
			if err != nil {
				return err
			}
			if entries == nil {
				entries = []*dlqEntry{}
			}
			if cio.json {
				return cio.printJSON(map[string]any{"queue": dlq, "total": total, "messages": entries})
			}
			if detail {
				printDetails(cio, dlq, total, entries)
				return nil
			}
			printList(cio, dlq, total, entries)
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

func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) > max {
		r := []rune(s)
		s = string(r[:max-1]) + "…"
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func printList(cio *cmdIO, dlq string, total int, entries []*dlqEntry) {
	cio.printf("%s: %d message(s), %d shown\n", dlq, total, len(entries))
	if len(entries) == 0 {
		return
	}
	tw := tabwriter.NewWriter(cio.out, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tMESSAGE ID\tREASON\tATTEMPTS\tLAST FAILURE\tERROR")
	for _, e := range entries {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\n", e.Position, orDash(e.MessageID), e.Reason, e.Attempts,
			orDash(shortTime(e.LastFailure)), orDash(oneLine(e.Error, 60)))
	}
	tw.Flush()
}

// shortTime prints a header timestamp to the second (fixed width, for tables).
func shortTime(s string) string {
	t, err := time.Parse(retry.TimeFormat, s)
	if err != nil {
		return s
	}
	return t.UTC().Format(time.RFC3339)
}

func printDetails(cio *cmdIO, dlq string, total int, entries []*dlqEntry) {
	cio.printf("%s: %d message(s), %d shown\n", dlq, total, len(entries))
	for _, e := range entries {
		cio.printf("\nmessage %d\n", e.Position)
		row := func(k, v string) {
			if v != "" {
				cio.printf("  %-16s %s\n", k+":", v)
			}
		}
		row("message id", orDash(e.MessageID))
		reason := e.Reason
		if e.ErrorClass != "" && e.ErrorClass != e.Reason {
			reason += " (" + e.ErrorClass + ")"
		}
		row("reason", reason)
		row("error", e.Error)
		row("attempts", fmt.Sprint(e.Attempts))
		row("first failure", e.FirstFailure)
		row("last failure", e.LastFailure)
		if e.routable {
			row("original", fmt.Sprintf("exchange %q, routing key %q", e.OriginalExchange, e.OriginalRoutingKey))
		} else {
			row("original", "unknown (cannot be replayed)")
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
		cio.printf("  body (%d bytes, %s):\n    %s\n", e.BodyBytes, e.BodyEncoding, oneLine(e.Body, 2000))
	}
}

func showHeader(v any) string {
	switch x := v.(type) {
	case string:
		return fmt.Sprintf("%q", x)
	case []byte:
		return fmt.Sprintf("%q", x)
	case time.Time:
		return x.UTC().Format(time.RFC3339)
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = showHeader(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case amqp.Table:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = k + "=" + showHeader(x[k])
		}
		return "{" + strings.Join(parts, " ") + "}"
	}
	return fmt.Sprint(v)
}

// replayResult is the outcome of `dlq replay`.
type replayResult struct {
	Queue    string         `json:"queue"`
	DryRun   bool           `json:"dry_run"`
	Replayed []replayedItem `json:"replayed"`
	Skipped  int            `json:"skipped"`
	Failed   []replayedItem `json:"failed"`
}

type replayedItem struct {
	MessageID  string `json:"message_id"`
	Reason     string `json:"reason"`
	Exchange   string `json:"exchange"`
	RoutingKey string `json:"routing_key"`
	Error      string `json:"error,omitempty"`
}

// replayMessage is the republished copy: same ID, body and properties, the
// failure-flow headers (x-idemq-*, x-death, x-delivery-count) removed — so
// the attempt count starts again — and x-idemq-replayed-at added.
func replayMessage(d *amqp.Delivery, e *dlqEntry, now time.Time) idemq.Message {
	h := amqp.Table{}
	for k, v := range d.Headers {
		if strings.HasPrefix(k, "x-idemq-") || k == retry.HeaderDeath || k == retry.HeaderDeliveryCount ||
			strings.HasPrefix(k, "x-first-death-") || strings.HasPrefix(k, "x-last-death-") {
			continue
		}
		h[k] = v
	}
	h[retry.HeaderReplayedAt] = now.UTC().Format(retry.TimeFormat)
	return idemq.Message{
		ID: d.MessageId, Exchange: e.OriginalExchange, RoutingKey: e.OriginalRoutingKey, Body: d.Body,
		ContentType: d.ContentType, ContentEncoding: d.ContentEncoding, Headers: h,
		CorrelationID: d.CorrelationId, ReplyTo: d.ReplyTo, Type: d.Type, AppID: d.AppId,
		Priority: d.Priority, Timestamp: d.Timestamp, Transient: d.DeliveryMode == amqp.Transient,
	}
}

func newDLQReplayCmd(f *dlqFlags) *cobra.Command {
	var flt filter
	var limit int
	var rate float64
	var dryRun bool
	var output string
	cmd := &cobra.Command{
		Use:   "replay QUEUE",
		Short: "Send dead letters back to their original exchange and routing key",
		Long: `Republishes dead letters to the exchange and routing key they were first
published to, with their message ID, body and headers, and the failure-flow
headers removed (so the attempt count starts again). Each one is acked from
the dead-letter queue only after the broker has confirmed its republish: an
interruption can duplicate a replay (same message ID: the dedup guard sees
one message), never lose a dead letter. Messages that do not match the
filters, or whose republish failed, stay in the dead-letter queue in their
position. Only the messages present when the replay starts are considered,
so a message that fails again and comes back is not replayed twice.

` + dlqLong,
		Args: cobra.ExactArgs(1),
		RunE: wrapRunE(func(cmd *cobra.Command, args []string) error {
			cio, err := newIO(cmd, output)
			if err != nil {
				return err
			}
			if rate < 0 {
				return errors.New("--rate must be >= 0")
			}
			ctx := cmd.Context()
			dlq := f.queue(args[0])
			u := amqpURL(f.url)
			c, err := openDLQ(u)
			if err != nil {
				return err
			}
			defer c.close()
			total, err := c.count(dlq)
			if err != nil {
				return err
			}
			var pub *idemq.Publisher
			if !dryRun {
				pub = idemq.NewPublisher(idemq.PublisherConfig{URL: u, MaxAttempts: 5, Logger: cio.log})
				defer pub.Close()
			}
			var bar *progressbar.ProgressBar
			barMax := total
			if limit > 0 && limit < barMax {
				barMax = limit
			}
			if !cio.json && (cio.tty || barMax > 100) {
				bar = progressbar.NewOptions(barMax, progressbar.OptionSetWriter(cio.err),
					progressbar.OptionSetDescription("replaying "+dlq), progressbar.OptionShowCount(),
					progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionClearOnFinish())
			}
			res := replayResult{Queue: dlq, DryRun: dryRun, Replayed: []replayedItem{}, Failed: []replayedItem{}}
			start := time.Now()
			var interval time.Duration
			if rate > 0 {
				interval = time.Duration(float64(time.Second) / rate)
			}
			_, err = c.peek(ctx, dlq, func(pos int, d *amqp.Delivery) (bool, error) {
				e := entryOf(pos, d, false)
				if !flt.match(e) {
					res.Skipped++
					return true, nil
				}
				item := replayedItem{MessageID: d.MessageId, Reason: e.Reason, Exchange: e.OriginalExchange, RoutingKey: e.OriginalRoutingKey}
				if !e.routable {
					item.Error = "no original exchange/routing key in its headers"
					res.Failed = append(res.Failed, item)
					return true, nil
				}
				if dryRun {
					res.Replayed = append(res.Replayed, item)
					return limit <= 0 || len(res.Replayed) < limit, nil
				}
				if interval > 0 {
					next := start.Add(time.Duration(len(res.Replayed)) * interval)
					if wait := time.Until(next); wait > 0 {
						t := time.NewTimer(wait)
						select {
						case <-t.C:
						case <-ctx.Done():
							t.Stop()
							return false, ctx.Err()
						}
					}
				}
				pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				err := pub.Publish(pctx, replayMessage(d, e, time.Now()))
				cancel()
				if err != nil {
					item.Error = err.Error()
					res.Failed = append(res.Failed, item)
					return ctx.Err() == nil, nil
				}
				if err := d.Ack(false); err != nil {
					return false, fmt.Errorf("message %q was republished but its ack from %s failed (it stays there; a second replay would duplicate it): %w", d.MessageId, dlq, err)
				}
				res.Replayed = append(res.Replayed, item)
				if bar != nil {
					_ = bar.Add(1)
				}
				return limit <= 0 || len(res.Replayed) < limit, nil
			})
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
			if err != nil {
				return err
			}
			if len(res.Failed) > 0 {
				return fmt.Errorf("%d dead letter(s) could not be replayed (left in %s)", len(res.Failed), dlq)
			}
			return nil
		}),
	}
	flt.flags(cmd)
	cmd.Flags().IntVar(&limit, "limit", 0, "replay at most this many (0: all)")
	cmd.Flags().Float64Var(&rate, "rate", 0, "at most this many messages per second (0: no limit)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "show what would be replayed; change nothing")
	addOutputFlag(cmd, &output)
	return cmd
}

func printReplay(cio *cmdIO, res replayResult) {
	verb := "replayed"
	if res.DryRun {
		verb = "would replay"
	}
	for _, it := range res.Replayed {
		cio.printf("%s %s (%s) -> exchange %q, routing key %q\n", verb, orDash(it.MessageID), it.Reason, it.Exchange, it.RoutingKey)
	}
	for _, it := range res.Failed {
		cio.printf("failed %s (%s): %s\n", orDash(it.MessageID), it.Reason, it.Error)
	}
	cio.printf("%s %d, skipped %d (filters), failed %d\n", verb, len(res.Replayed), res.Skipped, len(res.Failed))
}

func newDLQPurgeCmd(f *dlqFlags) *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "purge QUEUE",
		Short: "Delete every message of a dead-letter queue (asks first unless --yes)",
		Long:  dlqLong,
		Args:  cobra.ExactArgs(1),
		RunE: wrapRunE(func(cmd *cobra.Command, args []string) error {
			cio, err := newIO(cmd, "text")
			if err != nil {
				return err
			}
			dlq := f.queue(args[0])
			c, err := openDLQ(amqpURL(f.url))
			if err != nil {
				return err
			}
			defer c.close()
			n, err := c.count(dlq)
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
			purged, err := c.ch.QueuePurge(dlq, false)
			if err != nil {
				return fmt.Errorf("purge %s: %w", dlq, err)
			}
			cio.printf("purged %d message(s) from %s\n", purged, dlq)
			return nil
		}),
	}
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	return cmd
}
