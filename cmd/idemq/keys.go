package main

import (
	"errors"

	"github.com/spf13/cobra"
)

func newKeysCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "keys",
		Short: "keys (not implemented yet)",
		RunE: func(cmd *cobra.Command, args []string) error {
			return errors.New("keys: not implemented yet")
		},
	}
}
