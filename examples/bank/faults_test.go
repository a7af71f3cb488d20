//go:build faults

package main

import (
	"testing"

	"github.com/idemq/idemq/internal/testenv"
)

// The demo with broker connection cuts (rabbitmqctl close_all_connections
// cuts every connection on the broker, so it runs with the fault tests).
func TestFaultBankDemoWithConnectionCuts(t *testing.T) {
	testenv.RequireAMQP(t)
	bin := buildBank(t)
	ls := runDemo(t, bin, "--messages", "500", "--kills", "2", "--cuts", "2", "--crash-rate", "0.005", "--timeout", "90s")
	checkLedgers(t, ls)
}
