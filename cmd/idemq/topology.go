package main

import (
	"errors"

	"github.com/spf13/cobra"
)

func newTopologyCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "topology",
		Short: "topology (not implemented yet)",
		RunE: func(cmd *cobra.Command, args []string) error {
			return errors.New("topology: not implemented yet")
		},
	}
}
