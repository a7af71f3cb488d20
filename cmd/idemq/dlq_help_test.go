package main

import (
	"strings"
	"testing"
)

// The dlq subcommands do not repeat the dlq command's long help.
func TestDLQSubcommandHelpIsShort(t *testing.T) {
	parent, _, err := runCLI(t, "", "dlq", "--help")
	if err != nil {
		t.Fatal(err)
	}
	marker := "list and show never remove anything"
	if !strings.Contains(parent, marker) {
		t.Fatalf("dlq --help lost its explanation:\n%s", parent)
	}
	for _, sub := range []string{"list", "show", "groups", "purge", "replay"} {
		out, _, err := runCLI(t, "", "dlq", sub, "--help")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, marker) {
			t.Errorf("dlq %s --help repeats the dlq command's long help", sub)
		}
	}
}
