//go:build faults

package main

import (
	"os/exec"
	"testing"

	"github.com/idemq/idemq/internal/testenv"
)

// The demo with broker connection cuts (rabbitmqctl close_all_connections
// cuts every connection on the broker, so it runs with the fault tests),
// proxy cuts and private Redis restarts (both default to --cuts).
func TestFaultBankDemoWithConnectionCuts(t *testing.T) {
	testenv.RequireAMQP(t)
	if _, err := exec.LookPath("redis-server"); err != nil {
		testenv.Unavailable(t, "redis-server (binary)", "PATH", err)
	}
	bin := buildBank(t)
	ls := runDemo(t, bin, "--messages", "500", "--kills", "2", "--cuts", "2", "--crash-rate", "0.005", "--timeout", "90s")
	checkLedgers(t, ls, faultPlan{proxyCuts: 2, redisRestarts: 2})
}
