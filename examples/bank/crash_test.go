package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/testenv"
)

// Each crash window hit on purpose, not by chance: a consumer started with
// the crash hook on one point SIGKILLs itself there on its first delivery;
// a second consumer, without the hook, takes the redelivery. The table is
// the guarantee table of docs/GUARANTEES.md for one transfer: how many
// times it is applied, per mode and window. dedup applies twice only in
// its documented window (after the commit, before the complete); inbox
// never does.
func TestCrashWindowsOnPurpose(t *testing.T) {
	testenv.RequireAMQP(t)
	bin := buildBank(t)
	applied := map[string]map[string]int{
		"none":  {crashBeforeClaim: 1, crashInHandler: 1, crashAfterCommit: 2, crashBeforeAck: 2},
		"dedup": {crashBeforeClaim: 1, crashInHandler: 1, crashAfterCommit: 2, crashBeforeAck: 1},
		"inbox": {crashBeforeClaim: 1, crashInHandler: 1, crashAfterCommit: 1, crashBeforeAck: 1},
	}
	for _, mode := range []string{"none", "dedup", "inbox"} {
		for _, point := range []string{crashBeforeClaim, crashInHandler, crashAfterCommit, crashBeforeAck} {
			want := applied[mode][point]
			t.Run(mode+"/"+point, func(t *testing.T) {
				t.Parallel()
				crashWindow(t, bin, mode, point, want)
			})
		}
	}
}

func crashWindow(t *testing.T, bin, mode, point string, want int) {
	db := testenv.PostgresDB(t)
	queue := testenv.Name(t, "bank")
	retryQueues := []string{queue + ".retry.200", queue + ".retry.1000"}
	t.Cleanup(func() { testenv.DeleteQueue(append([]string{queue, queue + ".dlq"}, retryQueues...)...) })
	dir := t.TempDir()

	start := func(name string, extraEnv ...string) *exec.Cmd {
		cmd := exec.Command(bin, "consume", "--mode", mode, "--queue", queue, "--queue-type", "classic",
			"--postgres", db, "--workers", "1", "--prefetch", "1", "--lease", "1s",
			"--stats", filepath.Join(dir, name+".json"))
		cmd.Env = testenv.Env(extraEnv...)
		logf, err := os.Create(filepath.Join(dir, name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = logf.Close() })
		return cmd
	}
	logOf := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(dir, name+".log"))
		return string(b)
	}
	// The first consumer declares the topology, takes the transfer and
	// kills itself at the point.
	first := start("first", "IDEMQ_BANK_CRASH="+point, "IDEMQ_BANK_CRASH_RATE=1")
	waitSubscribed(t, queue)
	id := testenv.Name(t, "transfer")
	testenv.Publish(t, "", queue, amqp.Publishing{MessageId: id, ContentType: "application/json",
		Body: []byte(`{"account":"acc-crash","amount":7}`)})
	err, exited := waitExit(first, 60*time.Second)
	if !exited {
		t.Fatalf("the first consumer did not crash at %s within 60s\n%s", point, logOf("first"))
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the first consumer ended with %v, want killed by SIGKILL at %s\n%s", err, point, logOf("first"))
	}

	// The second consumer takes the redelivery: it runs the handler or
	// suppresses a duplicate (in dedup mode after the first's lease when the
	// first died holding it).
	second := start("second")
	testenv.Eventually(t, 60*time.Second, "the second consumer to settle the redelivery", func() bool {
		b, err := os.ReadFile(filepath.Join(dir, "second.json"))
		if err != nil {
			return false
		}
		var c map[string]int64
		if json.Unmarshal(b, &c) != nil {
			return false
		}
		if mode == "none" {
			return c[idemq.CountAcked] >= 1 // nothing counts processed without a guard or an inbox
		}
		// Not acked: a delivery deferred behind the first's lease is acked
		// too, once republished to a retry queue.
		return c[idemq.CountProcessed]+c[idemq.CountDuplicates] >= 1
	})
	if err := second.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err, exited := waitExit(second, 30*time.Second); !exited || err != nil {
		t.Fatalf("the second consumer after SIGTERM: exited %v, %v\n%s", exited, err, logOf("second"))
	}

	// Nothing left behind: no message ready (unacked ones went back to
	// ready when the consumer closed), none dead-lettered.
	for _, q := range append([]string{queue, queue + ".dlq"}, retryQueues...) {
		if n, _ := testenv.QueueCounts(t, q); n != 0 {
			t.Fatalf("%s holds %d messages after the redelivery was settled\n%s", q, n, logOf("second"))
		}
	}
	if got := appliedCount(t, db, id); got != want {
		t.Fatalf("%s, crash %s: transfer applied %d times, want %d\nfirst:\n%s\nsecond:\n%s", mode, point, got, want, logOf("first"), logOf("second"))
	}
}

// appliedCount is how many times the transfer id was applied (bank_applied
// commits with the effect).
func appliedCount(t *testing.T, db, id string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM bank_applied WHERE message_id = $1`, id).Scan(&n); err != nil {
		t.Fatal(fmt.Errorf("count applications: %w", err))
	}
	return n
}
