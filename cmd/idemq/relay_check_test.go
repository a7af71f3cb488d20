package main

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/sqldb"
	"github.com/idemq/idemq/sqldb/sqlite"
)

// A wrong AMQP password ends `idemq relay` at start with the broker's
// reason (before: the relay started, the 403 showed after a 20 s publish
// timeout at INFO, and SIGTERM waited for it).
func TestRelayRefusesWrongAMQPPassword(t *testing.T) {
	u, err := url.Parse(testenv.RequireAMQP(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(testenv.Name(t, "no-such-user"), "s3cret-pw")
	path := testenv.SQLitePath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	cmd := newRootCmd()
	var logs testenv.LogBuffer
	cmd.SetErr(&logs)
	cmd.SetOut(&logs)
	cmd.SetArgs([]string{"relay", "--db", "sqlite://" + path, "--amqp", u.String(), "--log-format", "text"})
	start := time.Now()
	err = cmd.ExecuteContext(ctx)
	if err == nil {
		t.Fatalf("relay with a wrong password returned nil\n%s", logs.String())
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("relay took %v to refuse a wrong password", took)
	}
	for _, want := range []string{"refused", "403"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error()+logs.String(), "s3cret-pw") {
		t.Fatalf("password leaked:\n%v\n%s", err, logs.String())
	}
	if strings.Contains(logs.String(), "outbox relay started") {
		t.Fatalf("relay started despite the refused broker:\n%s", logs.String())
	}
}

// A broker that does not answer at start is a WARN, not a refusal: the
// relay starts and stops promptly on cancel (its publisher retries until
// the broker is back).
func TestRelayWarnsOnUnreachableBroker(t *testing.T) {
	path := testenv.SQLitePath(t)
	port := testenv.FreePort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := newRootCmd()
	var logs testenv.LogBuffer
	cmd.SetErr(&logs)
	cmd.SetOut(&logs)
	cmd.SetArgs([]string{"relay", "--db", "sqlite://" + path, "--amqp", "amqp://guest:guest@127.0.0.1:" + strconv.Itoa(port) + "/", "--log-format", "text"})
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(rctx) }()
	testenv.Eventually(t, 30*time.Second, "relay started with a WARN", func() bool {
		s := logs.String()
		return strings.Contains(s, "level=WARN") && strings.Contains(s, "broker not reachable") && strings.Contains(s, "outbox relay started")
	})
	rcancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("relay: %v\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("relay did not stop after cancel\n%s", logs.String())
	}
}

// At start the relay runs the doctor on its outbox table and logs what
// is not PASS once: here a failed row waiting for an operator.
func TestRelayLogsDoctorFindings(t *testing.T) {
	path := testenv.SQLitePath(t)
	db, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	std := sqlite.Std(db)
	if _, err := sqldb.Up(context.Background(), std, 0, outbox.Schema(outbox.DefaultTable)); err != nil {
		t.Fatal(err)
	}
	if _, err := std.Exec(context.Background(), `INSERT INTO `+outbox.DefaultTable+` (message_id, exchange, routing_key, body, state) VALUES ('doc-1', '', 'q', X'00', 'failed')`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := newRootCmd()
	var logs testenv.LogBuffer
	cmd.SetErr(&logs)
	cmd.SetOut(&logs)
	cmd.SetArgs([]string{"relay", "--db", "sqlite://" + path, "--amqp", testenv.RequireAMQP(t), "--log-format", "text"})
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(rctx) }()
	testenv.Eventually(t, 30*time.Second, "the doctor's finding logged", func() bool {
		s := logs.String()
		return strings.Contains(s, "idemq doctor: sql.outbox-failed WARN") && strings.Contains(s, "1 failed rows")
	})
	rcancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("relay: %v\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("relay did not stop after cancel\n%s", logs.String())
	}
	if n := strings.Count(logs.String(), "idemq doctor:"); n != 1 {
		t.Errorf("%d doctor lines, want the one finding once:\n%s", n, logs.String())
	}
}
