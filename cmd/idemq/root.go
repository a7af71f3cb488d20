package main

import (
	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "idemq",
		Short:         "Operate idemq: exactly-once effects on RabbitMQ",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
	}
	root.AddCommand(newTopologyCmd(), newDLQCmd(), newKeysCmd(), newRelayCmd(), newOutboxCmd(), newMigrateCmd(), newConsoleCmd(), newGateCmd())
	return root
}
