package main

import (
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/cobra"

	"github.com/idemq/idemq/topology"
)

func newTopologyCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "topology",
		Short: "Declare exchanges, queues, dead-letter and retry queues",
	}
	cmd.AddCommand(newTopologyApplyCmd(), newTopologyInspectCmd())
	return cmd
}

// appliedObject is one line of `topology apply` output.
type appliedObject struct {
	Kind string `json:"kind"` // exchange, queue, dlq, retry, binding
	Name string `json:"name"`
	Info string `json:"info,omitempty"`
	// Retry queues only: their type and how deliveries get back: route
	// release (the consumers republish each when due, confirmed) or
	// dead-letter, then the strategy (at-least-once: quorum, kept until
	// the work queue confirmed; at-most-once: classic, can drop what
	// expires in a broker restart).
	Type               string `json:"type,omitempty"`
	Route              string `json:"route,omitempty"`
	DeadLetterStrategy string `json:"dead_letter_strategy,omitempty"`
	Overflow           string `json:"overflow,omitempty"`
}

func newTopologyApplyCmd() *cobra.Command {
	var file, urlFlag, output string
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "apply -f FILE",
		Short: "Declare a YAML topology (idempotent)",
		Long: `Declares every exchange, work queue (with its dead-letter queue and retry
queues, named and configured exactly as the retry package expects) and
binding of a YAML file. Declaring again changes nothing. If an object already
exists with other arguments the broker answers PRECONDITION_FAILED: the error
names the object and the argument that differs; nothing after it is declared.

The broker URL is --url, else IDEMQ_AMQP_URL, else the loopback default (guest on 127.0.0.1:5672).`,
		Args: cobra.NoArgs,
		RunE: wrapRunE(func(cmd *cobra.Command, _ []string) error {
			cio, err := newIO(cmd, output)
			if err != nil {
				return err
			}
			top, err := loadTopologyFile(cio, "apply", file)
			if err != nil {
				return err
			}
			objs := describeTopology(top)
			warnings := top.Warnings()
			for _, w := range warnings {
				fmt.Fprintf(cio.err, "warning: %s\n", w)
			}
			if !dryRun {
				u := amqpURL(urlFlag)
				conn, err := amqp.Dial(u)
				if err != nil {
					return fmt.Errorf("connect to %s: %w", redactURL(u), err)
				}
				defer conn.Close()
				ch, err := conn.Channel()
				if err != nil {
					return fmt.Errorf("open channel: %w", err)
				}
				if err := topology.Declare(cmd.Context(), ch, top); err != nil {
					return err
				}
			}
			if cio.json {
				out := map[string]any{"dry_run": dryRun, "objects": objs}
				if len(warnings) > 0 {
					out["warnings"] = warnings
				}
				return cio.printJSON(out)
			}
			verb := "declared"
			if dryRun {
				verb = "would declare"
			}
			for _, o := range objs {
				if o.Info != "" {
					cio.printf("%s %-8s %s (%s)\n", verb, o.Kind, o.Name, o.Info)
				} else {
					cio.printf("%s %-8s %s\n", verb, o.Kind, o.Name)
				}
			}
			return nil
		}),
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "YAML topology file (- for stdin)")
	cmd.Flags().StringVar(&urlFlag, "url", "", "broker URL (default $"+envAMQPURL+")")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print what would be declared, declare nothing")
	addOutputFlag(cmd, &output)
	return cmd
}

func describeTopology(t topology.Topology) []appliedObject {
	var out []appliedObject
	for _, e := range t.Exchanges {
		typ := e.Type
		if typ == "" {
			typ = amqp.ExchangeDirect
		}
		out = append(out, appliedObject{Kind: "exchange", Name: e.Name, Info: typ})
	}
	for _, q := range t.Queues {
		p := topology.ForQueue(q)
		if p.DLQ != "" {
			info := string(p.DLQType)
			if p.DLQType == topology.Quorum {
				info += fmt.Sprintf(", delivery-limit %d", topology.DLQDeliveryLimit)
			}
			out = append(out, appliedObject{Kind: "dlq", Name: p.DLQ, Info: info})
		}
		for _, r := range p.Retries {
			out = append(out, describeRetry(p, r))
		}
		info := string(p.Type)
		if p.DeliveryLimit > 0 {
			info += fmt.Sprintf(", delivery-limit %d", p.DeliveryLimit)
		}
		if p.DLQ != "" {
			info += ", dead letters -> " + p.DLQ
		}
		if len(p.Delays) > 0 {
			info += ", retries " + durations(p.Delays)
		}
		for _, n := range p.Notes {
			info += "; " + n
		}
		out = append(out, appliedObject{Kind: "queue", Name: p.Queue, Info: info})
	}
	for _, b := range t.Bindings {
		out = append(out, appliedObject{Kind: "binding", Name: b.Exchange + " -> " + b.Queue, Info: "routing key " + fmt.Sprintf("%q", b.RoutingKey)})
	}
	return out
}

// describeRetry is the line of a retry queue: its type, dead-letter
// strategy, overflow and where it hands deliveries back.
func describeRetry(p topology.Plan, r topology.RetryQueue) appliedObject {
	o := appliedObject{Kind: "retry", Name: r.Name}
	o.Type, _ = r.Args[topology.ArgQueueType].(string)
	if p.RetryRoute == topology.RouteRelease {
		// No TTL, no dead-lettering: the consumers of the work queue take
		// each delivery when it is due and republish it (confirmed).
		o.Route = string(topology.RouteRelease)
		o.Info = o.Type + ", released by the consumers after " + r.Delay.String() + " -> " + p.Queue
		return o
	}
	o.Route = string(topology.RouteDeadLetter)
	o.Overflow, _ = r.Args[topology.ArgOverflow].(string)
	o.DeadLetterStrategy, _ = r.Args[topology.ArgDLStrategy].(string)
	if o.DeadLetterStrategy == "" {
		// A classic queue (or a quorum one without the argument)
		// dead-letters at most once.
		o.DeadLetterStrategy = "at-most-once"
	}
	o.Info = o.Type + ", dead-letter " + o.DeadLetterStrategy
	if o.Overflow != "" {
		o.Info += ", overflow " + o.Overflow
	}
	o.Info += ", ttl " + r.Delay.String() + " -> " + p.Queue
	return o
}

func durations(ds []time.Duration) string {
	s := ""
	for i, d := range ds {
		if i > 0 {
			s += " "
		}
		s += d.String()
	}
	return s
}

// loadTopologyFile reads the YAML topology of `topology VERB -f FILE`:
// FILE, or standard input for "-".
func loadTopologyFile(cio *cmdIO, verb, file string) (topology.Topology, error) {
	switch file {
	case "":
		return topology.Topology{}, fmt.Errorf("topology %s: -f FILE is required", verb)
	case "-":
		return topology.Load(cio.in)
	}
	return topology.LoadFile(file)
}
