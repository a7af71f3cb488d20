package main

import (
	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "idemq",
		Short: "Operate idemq: exactly-once effects on RabbitMQ",
		Long: `Operate idemq: exactly-once effects on RabbitMQ.

TLS: every command verifies the servers' certificates. An amqps:// URL
trusts the CA certificate (PEM) in $IDEMQ_AMQP_CA, or its own cacertfile
parameter; a rediss:// URL trusts the one in $IDEMQ_REDIS_CA; a PostgreSQL
URL takes sslmode=verify-full&sslrootcert=FILE. Unset: the system's CAs.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
	}
	root.AddCommand(newTopologyCmd(), newDLQCmd(), newKeysCmd(), newRelayCmd(), newOutboxCmd(), newMigrateCmd(), newConsoleCmd(), newGateCmd(), newDoctorCmd())
	return root
}
