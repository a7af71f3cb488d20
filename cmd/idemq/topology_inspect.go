package main

import (
	"context"
	"fmt"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/cobra"

	"github.com/idemq/idemq/internal/mgmt"
	"github.com/idemq/idemq/retry"
	"github.com/idemq/idemq/topology"
)

const envManagementURL = "IDEMQ_RABBITMQ_MGMT_URL"

// inspectedQueue is one line of `topology inspect` output.
type inspectedQueue struct {
	Name string `json:"name"`
	Type string `json:"type"`
	// DeclaredLimit is the x-delivery-limit the topology declares (0: none).
	DeclaredLimit int `json:"declared_limit"`
	// BrokerLimit is the limit the broker applies (argument, policy,
	// operator policy: the smallest), read from the management API; nil
	// without --management-url or without a limit.
	BrokerLimit *int   `json:"broker_limit,omitempty"`
	Source      string `json:"source,omitempty"` // argument, policy, operator-policy, none; "" when not read
	Policy      string `json:"policy,omitempty"`
	Broker      string `json:"broker,omitempty"` // the limit as text: "4 (policy p)", "not read"
	// RepublishFrom is the x-delivery-count from which retry.Policy
	// republishes an in-place deferral instead of requeueing it, for a
	// consumer given the management URL (quorum queues only).
	RepublishFrom int `json:"republish_from,omitempty"`
}

func newTopologyInspectCmd() *cobra.Command {
	var file, urlFlag, mgmtFlag, output string
	cmd := &cobra.Command{
		Use:   "inspect -f FILE",
		Short: "Show each work queue's delivery limit: declared, and what the broker applies",
		Long: `For each work queue of a YAML topology, shows the x-delivery-limit the
topology declares and, with a management API URL, the delivery limit the broker
actually applies: the smallest of the queue's x-delivery-limit argument and the
delivery-limit of the policy and operator policy that apply to it. AMQP cannot
show a policy's limit; a consumer configured with the same URL
(ConsumerConfig.ManagementURL) reads it too and keeps in-place requeues below
half of it. A broker limit below the declared one is reported as a warning.

The management URL is --management-url, else IDEMQ_RABBITMQ_MGMT_URL
(http://user:password@host:15672; a monitoring user is enough). The vhost is
the one of --url, else IDEMQ_AMQP_URL. Nothing is declared.`,
		Args: cobra.NoArgs,
		RunE: wrapRunE(func(cmd *cobra.Command, _ []string) error {
			cio, err := newIO(cmd, output)
			if err != nil {
				return err
			}
			top, err := loadTopologyFile(cio, "inspect", file)
			if err != nil {
				return err
			}
			mu := mgmtFlag
			if mu == "" {
				mu = os.Getenv(envManagementURL)
			}
			var client *mgmt.Client
			if mu != "" {
				if client, err = mgmt.New(mu, nil); err != nil {
					return err
				}
			}
			vhost := "/"
			if u, err := amqp.ParseURI(amqpURL(urlFlag)); err == nil && u.Vhost != "" {
				vhost = u.Vhost
			}
			var out []inspectedQueue
			var warnings []string
			for _, q := range top.Queues {
				p := topology.ForQueue(q)
				iq := inspectedQueue{Name: p.Queue, Type: string(p.Type), DeclaredLimit: p.DeliveryLimit, Broker: "not read (no --management-url)"}
				if client != nil {
					ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
					l, err := client.DeliveryLimit(ctx, vhost, p.Queue)
					cancel()
					if err != nil {
						return err
					}
					iq.Type, iq.Source, iq.Policy, iq.Broker = l.Type, l.Source, l.Name, l.String()
					if l.Source != mgmt.SourceNone {
						n := l.N
						iq.BrokerLimit = &n
						if p.DeliveryLimit == 0 || n < p.DeliveryLimit {
							warnings = append(warnings, fmt.Sprintf("queue %s: the broker applies a delivery limit of %s, below the declared %d: give its consumers ManagementURL (or retry.Config.RequeueLimit <= %d)",
								p.Queue, l, p.DeliveryLimit, n))
						}
					}
				}
				if iq.Type == string(topology.Quorum) {
					limit := p.DeliveryLimit
					if limit <= 0 {
						limit = retry.BrokerDefaultDeliveryLimit
					}
					if iq.BrokerLimit != nil && max(*iq.BrokerLimit, 1) < limit {
						limit = max(*iq.BrokerLimit, 1)
					}
					iq.RepublishFrom = limit / 2
				}
				out = append(out, iq)
			}
			for _, w := range warnings {
				fmt.Fprintf(cio.err, "warning: %s\n", w)
			}
			if cio.json {
				res := map[string]any{"queues": out}
				if len(warnings) > 0 {
					res["warnings"] = warnings
				}
				return cio.printJSON(res)
			}
			for _, q := range out {
				declared := "none"
				if q.DeclaredLimit > 0 {
					declared = fmt.Sprint(q.DeclaredLimit)
				}
				line := fmt.Sprintf("queue %s: %s, declared delivery limit %s, broker: %s", q.Name, q.Type, declared, q.Broker)
				if q.RepublishFrom > 0 {
					line += fmt.Sprintf(", in-place requeues republished from x-delivery-count %d", q.RepublishFrom)
				}
				cio.printf("%s\n", line)
			}
			return nil
		}),
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "YAML topology file (- for stdin)")
	cmd.Flags().StringVar(&urlFlag, "url", "", "broker URL, for its vhost (default $"+envAMQPURL+")")
	cmd.Flags().StringVar(&mgmtFlag, "management-url", "", "management API URL, http://user:password@host:15672 (default $"+envManagementURL+")")
	addOutputFlag(cmd, &output)
	return cmd
}
