package main

import (
	"errors"

	"github.com/spf13/cobra"
)

func newDLQCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "dlq",
		Short: "dlq (not implemented yet)",
		RunE: func(cmd *cobra.Command, args []string) error {
			return errors.New("dlq: not implemented yet")
		},
	}
}
