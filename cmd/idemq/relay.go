package main

import (
	"errors"

	"github.com/spf13/cobra"
)

func newRelayCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "relay",
		Short: "relay (not implemented yet)",
		RunE: func(cmd *cobra.Command, args []string) error {
			return errors.New("relay: not implemented yet")
		},
	}
}
