// Command idemq is the operations tool for idemq: topology, dead letters,
// dedup keys, the outbox relay, the demo and the benchmarks.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRootCmd().ExecuteContext(ctx); err != nil {
		var silent silentError
		if !errors.As(err, &silent) {
			fmt.Fprintln(os.Stderr, "idemq:", err)
		}
		os.Exit(1)
	}
}
