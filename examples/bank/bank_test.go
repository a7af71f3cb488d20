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

	"github.com/idemq/idemq/internal/testenv"
)

// buildBank builds the example exactly as its contract says:
// go build -o bank ./examples/bank.
func buildBank(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "bank")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// waitSubscribed waits until a consumer declared queue and subscribed to it.
func waitSubscribed(t *testing.T, queue string) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, "a consumer to subscribe to "+queue, func() bool {
		conn, err := amqp.Dial(testenv.AMQPURL())
		if err != nil {
			return false
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return false
		}
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err == nil && q.Consumers > 0
	})
}

// waitExit waits up to within for cmd to end; exited is false if it did
// not (it is left running).
func waitExit(cmd *exec.Cmd, within time.Duration) (err error, exited bool) {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err, true
	case <-time.After(within):
		return nil, false
	}
}

func balance(t *testing.T, db string) (int64, int) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var sum int64
	var rows int
	err = c.QueryRow(ctx, `SELECT COALESCE(SUM(balance),0), count(*) FROM accounts`).Scan(&sum, &rows)
	if err != nil {
		return 0, 0 // table not created yet
	}
	return sum, rows
}

// The examples/bank contract: a consume process declares its queues and
// tables, applies transfers once in inbox mode (resends included),
// dead-letters every malformed message with a reason, and exits 0 on
// SIGTERM.
func TestBankContract(t *testing.T) {
	testenv.RequireAMQP(t)
	bin := buildBank(t)
	db := testenv.PostgresDB(t)
	queue := testenv.Name(t, "bank")
	t.Cleanup(func() {
		testenv.DeleteQueue(queue, queue+".dlq", queue+".retry.200", queue+".retry.1000")
	})
	for _, mode := range []string{"inbox", "dedup"} {
		cmd := exec.Command(bin, "consume", "--mode", mode, "--queue", queue, "--queue-type", "classic",
			"--postgres", db, "--workers", "2", "--prefetch", "20")
		cmd.Env = testenv.Env()
		out, _ := os.Create(filepath.Join(t.TempDir(), mode+".log"))
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = cmd.Process.Kill() }()
		waitSubscribed(t, queue)
		run := mode + "-" + testenv.Name(t, "")
		var msgs []amqp.Publishing
		var want int64
		for i := 0; i < 20; i++ {
			amount := int64(i + 1)
			want += amount
			m := amqp.Publishing{MessageId: fmt.Sprintf("%s-%d", run, i), ContentType: "application/json",
				Body: []byte(fmt.Sprintf(`{"account":"acc-%d","amount":%d}`, i%3, amount))}
			msgs = append(msgs, m)
			if i%4 == 0 {
				msgs = append(msgs, m) // a resend: same message ID
			}
		}
		msgs = append(msgs, badMessages()...)
		before, _ := balance(t, db)
		testenv.Publish(t, "", queue, msgs...)
		testenv.Eventually(t, 60*time.Second, "every transfer applied", func() bool {
			got, _ := balance(t, db)
			return got-before >= want
		})
		var dlq []amqp.Delivery
		testenv.Eventually(t, 30*time.Second, "every malformed message dead-lettered", func() bool {
			dlq = append(dlq, testenv.Drain(t, queue+".dlq")...)
			return len(dlq) >= len(badMessages())
		})
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err, exited := waitExit(cmd, 30*time.Second); !exited {
			t.Fatalf("%s: did not exit within 30s of SIGTERM", mode)
		} else if err != nil {
			b, _ := os.ReadFile(out.Name())
			t.Fatalf("%s: exit after SIGTERM: %v\n%s", mode, err, b)
		}
		got, _ := balance(t, db)
		if got-before != want {
			t.Fatalf("%s: balance moved by %d, want %d (resends must not apply twice)", mode, got-before, want)
		}
		if len(dlq) != len(badMessages()) {
			t.Fatalf("%s: %d dead letters, want %d", mode, len(dlq), len(badMessages()))
		}
		for _, d := range dlq {
			if r, _ := d.Headers["x-idemq-reason"].(string); r == "" {
				t.Fatalf("%s: dead letter %q without a reason header", mode, d.MessageId)
			}
		}
	}
}

func TestParseTransfer(t *testing.T) {
	cases := []struct {
		body string
		ok   bool
	}{
		{`{"account":"a","amount":5}`, true},
		{`{"account":"a","amount":-5}`, true},
		{`{"amount":5,"account":"a"}`, true},
		{`{"account":"a","amount":1.5}`, false},
		{`{"account":"a","amount":"5"}`, false},
		{`{"account":"","amount":5}`, false},
		{`{"amount":5}`, false},
		{`{"account":"a"}`, false},
		{`{"account":"a","amount":5} {}`, false},
		{`[1]`, false},
		{``, false},
		{`{"account":"a","amount":99999999999999999999}`, false},
	}
	for _, c := range cases {
		_, err := parseTransfer([]byte(c.body))
		if (err == nil) != c.ok {
			t.Errorf("parseTransfer(%s): err=%v, want ok=%v", c.body, err, c.ok)
		}
	}
}

func FuzzParseTransfer(f *testing.F) {
	f.Add([]byte(`{"account":"a","amount":5}`))
	f.Add([]byte(`{"account":"a","amount":1e3}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, b []byte) {
		tr, err := parseTransfer(b)
		if err == nil && tr.Account == "" {
			t.Fatalf("accepted %q without an account", b)
		}
	})
}

// demoDeadline bounds one `bank demo` run in the tests (a short run takes
// 15–60 s).
const demoDeadline = 5 * time.Minute

// runDemo runs `bank demo` and returns its ledgers.
func runDemo(t *testing.T, bin string, args ...string) []Ledger {
	t.Helper()
	jsonPath := filepath.Join(t.TempDir(), "ledger.json")
	// A demo that hangs fails here with its goroutines (SIGQUIT), well
	// before the package's test timeout would kill everything silently.
	ctx, cancel := context.WithTimeout(context.Background(), demoDeadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"demo", "--json", jsonPath}, args...)...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGQUIT) }
	cmd.WaitDelay = 15 * time.Second
	cmd.Env = testenv.Env()
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("bank demo %v did not finish within %v:\n%s", args, demoDeadline, out)
	}
	t.Logf("bank demo %v:\n%s", args, out)
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	b, rerr := os.ReadFile(jsonPath)
	if rerr != nil {
		t.Fatalf("demo wrote no ledger (exit %v): %v", err, rerr)
	}
	var ls []Ledger
	if err := json.Unmarshal(b, &ls); err != nil {
		t.Fatal(err)
	}
	if err != nil {
		t.Fatalf("demo exited with %v", err)
	}
	return ls
}

// The short fault suite (make test): consumers SIGKILLed by the demo and at
// every crash point by themselves, the publisher resending, every consumer
// connection cut twice by the demo's TCP proxy, and the dedup modes' private
// Redis SIGKILLed and restarted twice — with an fsync-always append-only file
// (dedup) and without persistence (dedup-nopersist). Every mode loses
// nothing and dead-letters every malformed message; inbox is exact; the
// duplicates none, dedup and dedup-nopersist apply are counted, not hidden.
func TestFaultSuiteShort(t *testing.T) {
	testenv.RequireAMQP(t)
	if _, err := exec.LookPath("redis-server"); err != nil {
		testenv.Unavailable(t, "redis-server (binary)", "PATH", err)
	}
	bin := buildBank(t)
	ls := runDemo(t, bin, "--messages", "400", "--kills", "2", "--cuts", "0", "--crash-rate", "0.01",
		"--redis-restarts", "2", "--proxy-cuts", "2", "--queue-type", "classic", "--timeout", "90s")
	checkLedgers(t, ls, faultPlan{proxyCuts: 2, redisRestarts: 2})
}

// faultPlan is what a demo run was asked to inject, per mode; transient:
// --fail-rate > 0.
type faultPlan struct {
	proxyCuts, redisRestarts, brokerRestarts int
	transient                                bool
}

func checkLedgers(t *testing.T, ls []Ledger, plan faultPlan) {
	t.Helper()
	want := []string{"none", "dedup", "inbox"}
	if plan.redisRestarts > 0 {
		want = []string{"none", "dedup", "dedup-nopersist", "inbox"}
	}
	var got []string
	for _, l := range ls {
		got = append(got, l.Mode)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("modes %v, want %v", got, want)
	}
	waiting := 0
	for _, l := range ls {
		waiting += l.RetryWaitingAtRestarts
	}
	if plan.transient && plan.brokerRestarts > 0 && waiting == 0 {
		t.Errorf("no delivery was waiting in a retry queue at any broker restart: the run did not test what it is for")
	}
	for _, l := range ls {
		if l.Lost != 0 {
			t.Errorf("%s: %d transfers lost", l.Mode, l.Lost)
		}
		// Dead-lettered and never applied is not lost (it can be
		// replayed), but no fault here may walk a valid transfer there.
		if l.DeadNotApplied != 0 {
			t.Errorf("%s: %d valid transfers dead-lettered and never applied (reasons %v)", l.Mode, l.DeadNotApplied, l.Reasons)
		}
		if l.ExitedOnTheirOwn != 0 {
			t.Errorf("%s: %d consumers exited on their own (see the run's output: \"consumer exited\")", l.Mode, l.ExitedOnTheirOwn)
		}
		if l.StuckOnSigterm != 0 {
			t.Errorf("%s: %d consumers did not exit on SIGTERM", l.Mode, l.StuckOnSigterm)
		}
		// A kill between the dead-letter confirm and the ack may duplicate
		// a dead letter; none may be missing.
		if l.DeadLettered < l.Malformed {
			t.Errorf("%s: %d dead letters, want at least %d", l.Mode, l.DeadLettered, l.Malformed)
		}
		// Every proxy cut happened mid-run and closed at least one consumer
		// connection (a cut waits for one to be open).
		if l.BrokerRestarts != plan.brokerRestarts {
			t.Errorf("%s: %d broker restarts, want %d", l.Mode, l.BrokerRestarts, plan.brokerRestarts)
		}
		if l.ProxyCuts != plan.proxyCuts || l.ProxyConns < l.ProxyCuts {
			t.Errorf("%s: %d proxy cuts closing %d connections, want %d cuts closing at least one each",
				l.Mode, l.ProxyCuts, l.ProxyConns, plan.proxyCuts)
		}
		if plan.transient {
			checkTransient(t, l)
		}
		switch l.Mode {
		case "inbox":
			if !l.Exact {
				t.Errorf("inbox not exact: %+v", l)
			}
		case "none":
			// The publisher resent ~10% of transfers: none must show them.
			if l.AppliedTwice == 0 {
				t.Errorf("none mode applied nothing twice despite resends: the demo is not showing the problem")
			}
		case "dedup":
			// The variant ran as asked: a private fsync-always Redis that
			// kept a key written just before every kill, or the shared one.
			wantRedis, wantKept := "aof-always", plan.redisRestarts
			if plan.redisRestarts == 0 {
				wantRedis = "shared"
			}
			if l.Redis != wantRedis || l.RedisRestarts != plan.redisRestarts || l.RedisKept != wantKept {
				t.Errorf("dedup: Redis %q restarted %d times, data kept %d times; want %q, %d, %d",
					l.Redis, l.RedisRestarts, l.RedisKept, wantRedis, plan.redisRestarts, wantKept)
			}
		case "dedup-nopersist":
			// A Redis without persistence forgot the key at every restart.
			if l.Redis != "no-persist" || l.RedisRestarts != plan.redisRestarts || l.RedisKept != 0 {
				t.Errorf("dedup-nopersist: Redis %q restarted %d times, data kept %d times; want \"no-persist\", %d, 0",
					l.Redis, l.RedisRestarts, l.RedisKept, plan.redisRestarts)
			}
		}
	}
}

// checkTransient checks a mode's transient failures (--fail-rate): some
// were planned and happened, they went through the retry queues, every
// transfer meant to fail was applied after its failures and none at a
// failing attempt, and none was dead-lettered.
func checkTransient(t *testing.T, l Ledger) {
	t.Helper()
	planned := l.TransientOnce + l.TransientTwice
	if l.TransientOnce == 0 || l.TransientTwice == 0 {
		t.Errorf("%s: %d transfers planned to fail once, %d twice: want some of each", l.Mode, l.TransientOnce, l.TransientTwice)
	}
	// Each failing attempt runs the handler 3 times (quick retries), then
	// goes to a retry queue; the counters may miss the last 25 ms of a
	// killed consumer, so they are checked against half of the minimum.
	if minRuns := int64(3 * (l.TransientOnce + 2*l.TransientTwice)); l.TransientFailures < minRuns/2 {
		t.Errorf("%s: %d handler runs failed transiently, want about %d or more", l.Mode, l.TransientFailures, minRuns)
	}
	if minRetried := int64(l.TransientOnce + 2*l.TransientTwice); l.Retried < minRetried/2 {
		t.Errorf("%s: %d deliveries sent to retry queues, want about %d or more", l.Mode, l.Retried, minRetried)
	}
	if l.TransientApplied != planned || l.TransientEarly != 0 {
		t.Errorf("%s: of %d transfers failing transiently %d applied after their failures, %d at a failing attempt; want %d, 0",
			l.Mode, planned, l.TransientApplied, l.TransientEarly, planned)
	}
	if l.ValidDeadLettered != 0 {
		t.Errorf("%s: %d valid transfers dead-lettered (reasons %v)", l.Mode, l.ValidDeadLettered, l.Reasons)
	}
	t.Logf("%s: transient 1×/2× %d/%d, runs failed %d, retried %d, waiting in retry queues at the restarts %d",
		l.Mode, l.TransientOnce, l.TransientTwice, l.TransientFailures, l.Retried, l.RetryWaitingAtRestarts)
}

// The demo's freeze fault, short: per mode, a running consumer is made to
// stop itself (SIGSTOP) in a handler — effect written, transaction open,
// dedup lease held — and is continued (SIGCONT) after 3 s, past its 2 s
// lease; twice per mode. The publisher sends no resends and nothing else
// is injected, so while a consumer is frozen no other copy of its
// messages exists (its deliveries stay unacked on its live connection):
// a transfer applied twice can only be the frozen consumer's own delivery
// given back after its commit landed, and dedup must show none. Nothing
// is lost, no valid transfer is dead-lettered, inbox is exact, and in
// dedup mode the frozen consumer reports the leases it lost.
func TestBankDemoFreezes(t *testing.T) {
	testenv.RequireAMQP(t)
	bin := buildBank(t)
	ls := runDemo(t, bin, "--modes", "none,dedup,inbox", "--messages", "300", "--resend", "0",
		"--kills", "0", "--cuts", "0", "--proxy-cuts", "0", "--redis-restarts", "0", "--crash-rate", "0",
		"--freezes", "2", "--freeze-duration", "3s", "--queue-type", "classic", "--timeout", "90s")
	if len(ls) != 3 {
		t.Fatalf("%d modes ran, want 3", len(ls))
	}
	for _, l := range ls {
		if l.Lost != 0 {
			t.Errorf("%s: %d transfers lost", l.Mode, l.Lost)
		}
		// Dead-lettered and never applied is not lost (it can be
		// replayed), but no fault here may walk a valid transfer there.
		if l.DeadNotApplied != 0 {
			t.Errorf("%s: %d valid transfers dead-lettered and never applied (reasons %v)", l.Mode, l.DeadNotApplied, l.Reasons)
		}
		if l.ValidDeadLettered != 0 {
			t.Errorf("%s: %d valid transfers dead-lettered (reasons %v)", l.Mode, l.ValidDeadLettered, l.Reasons)
		}
		if l.DeadLettered < l.Malformed {
			t.Errorf("%s: %d dead letters, want at least %d", l.Mode, l.DeadLettered, l.Malformed)
		}
		if l.StuckOnSigterm != 0 {
			t.Errorf("%s: %d consumers did not exit on SIGTERM", l.Mode, l.StuckOnSigterm)
		}
		// Both freezes ran; at least one caught a consumer in a handler
		// (the other may have found it idle and stopped it where it was).
		if l.Freezes != 2 || l.FreezesMidHandler < 1 {
			t.Errorf("%s: %d freezes, %d in a handler; want 2, at least 1", l.Mode, l.Freezes, l.FreezesMidHandler)
		}
		switch l.Mode {
		case "dedup":
			if l.AppliedTwice != 0 {
				t.Errorf("dedup: %d transfers applied twice after freezes (no other copy existed: the frozen consumer's own delivery was applied again)", l.AppliedTwice)
			}
			if l.FreezeLeasesLost == 0 {
				t.Errorf("dedup: the frozen consumers reported no lost lease after a %s freeze past their lease", "3s")
			}
		case "inbox":
			if !l.Exact {
				t.Errorf("inbox not exact: %+v", l)
			}
		}
	}
}
