package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemq/idemq/internal/console"
)

// TestConsoleRefusesNonLoopbackWithoutToken: `idemq console` on an address
// beyond loopback does not start without a token (nothing is opened).
func TestConsoleRefusesNonLoopbackWithoutToken(t *testing.T) {
	t.Setenv(envConsoleToken, "")
	for _, listen := range []string{"0.0.0.0:0", ":0", "[::]:0"} {
		_, _, err := runCLI(t, "", "console", "--listen", listen, "--queue", "orders", "--no-redis", "--no-db")
		if !errors.Is(err, console.ErrTokenRequired) {
			t.Fatalf("--listen %s without a token: %v", listen, err)
		}
	}
	_, _, err := runCLI(t, "", "console", "--listen", "127.0.0.1:0", "--no-redis", "--no-db")
	if err == nil || !strings.Contains(err.Error(), "--queue") {
		t.Fatalf("no queue: %v", err)
	}
}

func TestConsoleQueues(t *testing.T) {
	env := map[string]string{envConsoleQueues: "orders, payments.dlq,"}
	qs, err := consoleQueues(consoleFlags{}, func(k string) string { return env[k] })
	if err != nil || len(qs) != 2 || qs[0] != (console.Queue{Work: "orders", DLQ: "orders.dlq"}) || qs[1] != (console.Queue{Work: "payments", DLQ: "payments.dlq"}) {
		t.Fatalf("%+v %v", qs, err)
	}
	qs, err = consoleQueues(consoleFlags{queues: []string{"a"}}, func(k string) string { return env[k] })
	if err != nil || len(qs) != 1 {
		t.Fatalf("flags win over the env: %+v %v", qs, err)
	}
}
