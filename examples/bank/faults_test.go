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

// The demo with the broker restarted twice per mode (rabbitmqctl stop_app,
// start_app) while consumers are killed and a tenth of the transfers fail
// transiently on their first one or two attempts: the failures go through
// the quick retries and the quorum retry queues, and each restart waits
// until some wait there. Nothing lost in any mode, every transfer meant to
// fail applied only after its failures, inbox exact. The dedup Redis is
// the shared one and nothing else is cut, so what is measured is the
// broker restart.
func TestFaultBankDemoBrokerRestarts(t *testing.T) {
	testenv.RequireAMQP(t)
	bin := buildBank(t)
	ls := runDemo(t, bin, "--messages", "500", "--kills", "2", "--cuts", "0", "--broker-restarts", "2",
		"--crash-rate", "0.005", "--fail-rate", "0.1", "--timeout", "150s")
	checkLedgers(t, ls, faultPlan{brokerRestarts: 2, transient: true})
}
