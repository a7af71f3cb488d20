package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/testenv"
)

// The combined example builds and runs as a user runs it (go build, then
// the binary with the environment of `make env`), and exits 0: each order
// billed once, the duplicate suppressed, the poison order dead-lettered.
func TestOrdersExampleRuns(t *testing.T) {
	testenv.RequireAMQP(t)
	bin := filepath.Join(t.TempDir(), "orders")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	suffix := "_" + strings.ToLower(strings.ReplaceAll(testenv.Name(t, "t"), "-", "_"))
	cmd := exec.CommandContext(ctx, bin, "-suffix", suffix, "-timeout", "150s")
	cmd.Env = testenv.Env()
	cmd.Dir = os.TempDir() // the topology is embedded: runs from anywhere
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("orders: %v\n%s", err, out)
	}
	for _, want := range []string{"order-1 billed 1 time(s)", "order-2 billed 1 time(s)", "order-3 billed 0 time(s)", "order-4 billed 1 time(s)", "dead-lettered: [order-3]"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
