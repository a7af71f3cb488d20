package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/sqldb/dburl"
)

func TestResolveDB(t *testing.T) {
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	cases := []struct {
		db, dialect string
		env         map[string]string
		want        dburl.Target
		wantErr     bool
	}{
		{db: "postgres://u:p@h/db", want: dburl.Target{Dialect: "postgres", DSN: "postgres://u:p@h/db"}},
		{db: "postgresql://h/db", want: dburl.Target{Dialect: "postgres", DSN: "postgresql://h/db"}},
		{db: "mysql://u:p@tcp(127.0.0.1:3306)/app?parseTime=true", want: dburl.Target{Dialect: "mysql", DSN: "u:p@tcp(127.0.0.1:3306)/app?parseTime=true"}},
		{db: "mysql://u:p@db.local/app", want: dburl.Target{Dialect: "mysql", DSN: "u:p@tcp(db.local:3306)/app"}},
		{db: "mysql://u:p@db.local:3307/app?timeout=5s", want: dburl.Target{Dialect: "mysql", DSN: "u:p@tcp(db.local:3307)/app?timeout=5s"}},
		{db: "u:p@tcp(h:3306)/app", want: dburl.Target{Dialect: "mysql", DSN: "u:p@tcp(h:3306)/app"}},
		{db: "u:p@/app", dialect: "mariadb", want: dburl.Target{Dialect: "mysql", DSN: "u:p@/app"}},
		{db: "/var/lib/app.db", wantErr: true}, // a plain path needs --dialect sqlite
		{db: "/var/lib/app.db", dialect: "sqlite", want: dburl.Target{Dialect: "sqlite", DSN: "/var/lib/app.db"}},
		{db: "host=db user=app password=pw", wantErr: true}, // keyword DSN: --dialect postgres
		{db: "host=db user=app password=pw", dialect: "postgres", want: dburl.Target{Dialect: "postgres", DSN: "host=db user=app password=pw"}},
		{db: "host=db user=app password=pw", dialect: "sqlite", wantErr: true},
		{db: "postgres://u:p@h/db", dialect: "sqlite", wantErr: true},
		{db: "sqlite:///var/lib/app.db", want: dburl.Target{Dialect: "sqlite", DSN: "/var/lib/app.db"}},
		{db: "file:app.db?_pragma=busy_timeout(1)", want: dburl.Target{Dialect: "sqlite", DSN: "file:app.db?_pragma=busy_timeout(1)"}},
		{env: map[string]string{envPostgreURL: "postgres://e/db"}, want: dburl.Target{Dialect: "postgres", DSN: "postgres://e/db"}},
		{dialect: "mysql", env: map[string]string{envPostgreURL: "postgres://e/db", envMySQLURL: "u:p@tcp(m:3306)/x"}, want: dburl.Target{Dialect: "mysql", DSN: "u:p@tcp(m:3306)/x"}},
		{env: map[string]string{envOutboxDB: "file:/tmp/x.db", envPostgreURL: "postgres://e/db"}, want: dburl.Target{Dialect: "sqlite", DSN: "file:/tmp/x.db"}},
		{env: map[string]string{envOutboxDB: "/tmp/x.db", envPostgreURL: "postgres://e/db"}, wantErr: true},
		{wantErr: true},
		{db: "redis://h/0", wantErr: true},
		{db: "x", dialect: "oracle", wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.db+"|"+c.dialect, func(t *testing.T) {
			env = c.env
			got, err := resolveDB(c.db, c.dialect, getenv)
			if (err != nil) != c.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, c.wantErr)
			}
			if err == nil && got != c.want {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}
	if r := (dburl.Target{Dialect: "mysql", DSN: "u:secret@tcp(h:3306)/app"}).Redacted(); strings.Contains(r, "secret") {
		t.Fatalf("redacted mysql DSN %q shows the password", r)
	}
	if r := (dburl.Target{Dialect: "postgres", DSN: "postgres://u:secret@h/app"}).Redacted(); strings.Contains(r, "secret") {
		t.Fatalf("redacted postgres URL %q shows the password", r)
	}
}

// TestRelayCommandSQLite runs the command in process against SQLite and
// stops it by cancelling its context, as main's signal context does; with
// --delete-sent the published rows are gone, without it they are sent.
func TestRelayCommandSQLite(t *testing.T) {
	for _, deleteSent := range []bool{false, true} {
		t.Run(map[bool]string{false: "marks-sent", true: "delete-sent"}[deleteSent], func(t *testing.T) {
			testRelayCommandSQLite(t, deleteSent)
		})
	}
}

func testRelayCommandSQLite(t *testing.T, deleteSent bool) {
	amqpURL := testenv.RequireAMQP(t)
	path := testenv.SQLitePath(t)
	q := testenv.Queue(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	store, db := testStore(ctx, t, dburl.Target{Dialect: "sqlite", DSN: path})
	for _, id := range []string{"cli-1", "cli-2", "cli-3"} {
		if err := store.Add(ctx, db, outbox.Message{ID: id, RoutingKey: q, Body: []byte(id)}); err != nil {
			t.Fatal(err)
		}
	}

	cmd := newRootCmd()
	var logs testenv.LogBuffer
	cmd.SetErr(&logs)
	cmd.SetOut(&logs)
	args := []string{"relay", "--db", "sqlite://" + path, "--amqp", amqpURL, "--log-format", "json"}
	if deleteSent {
		args = append(args, "--delete-sent")
	}
	cmd.SetArgs(args)
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(rctx) }()
	var got []string
	testenv.Eventually(t, 30*time.Second, "three messages relayed", func() bool {
		for _, d := range testenv.Drain(t, q) {
			got = append(got, d.MessageId)
		}
		return len(got) >= 3
	})
	rcancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("relay command: %v\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("relay command did not stop after its context was cancelled")
	}
	if len(got) != 3 {
		t.Fatalf("consumed %v", got)
	}
	var sawStop bool
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		if m["msg"] == "idemq relay drained and stopped" {
			sawStop = true
			if m["published"] != float64(3) {
				t.Errorf("final counters: %v", m)
			}
		}
	}
	if !sawStop {
		t.Fatalf("no final counters line:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), "guest:guest") {
		t.Fatalf("password in logs:\n%s", logs.String())
	}
	want := map[outbox.State]int64{outbox.StateSent: 3}
	if deleteSent {
		want = map[outbox.State]int64{}
	}
	if c, err := store.Count(ctx); err != nil || !maps.Equal(c, want) {
		t.Fatalf("rows by state %v (%v), want %v", c, err, want)
	}
}

// TestHelperRelayMain is the child of TestRelayCommandSIGTERM: main's own
// signal handling around the relay command.
func TestHelperRelayMain(t *testing.T) {
	args := os.Getenv("IDEMQ_TEST_RELAY_MAIN_ARGS")
	if args == "" {
		return // only a child process of TestRelayCommandSIGTERM does anything
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cmd := newRootCmd()
	cmd.SetArgs(strings.Split(args, "\x1f"))
	if err := cmd.ExecuteContext(ctx); err != nil {
		os.Stderr.WriteString("idemq: " + err.Error() + "\n")
		os.Exit(1)
	}
	os.Exit(0)
}

// TestRelayCommandSIGTERM runs `idemq relay` on PostgreSQL in a child
// process, checks it relays (woken by NOTIFY) and exits 0 on SIGTERM, with a
// password-free log.
func TestRelayCommandSIGTERM(t *testing.T) {
	testenv.RequireAMQP(t)
	dsn := testenv.PostgresDB(t)
	q := testenv.Queue(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	store, db := testStore(ctx, t, dburl.Target{Dialect: "postgres", DSN: dsn})

	args := []string{"relay", "--db", dsn, "--max-poll", "1m", "--poll", "1m", "--log-format", "text"}
	child := exec.Command(os.Args[0], "-test.run=^TestHelperRelayMain$")
	// The AMQP URL comes from the environment, with a password to redact.
	child.Env = testenv.Env("IDEMQ_TEST_RELAY_MAIN_ARGS=" + strings.Join(args, "\x1f"))
	var logs testenv.LogBuffer
	child.Stdout, child.Stderr = &logs, &logs
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Process.Kill()
	testenv.Eventually(t, 30*time.Second, "relay started", func() bool {
		return strings.Contains(logs.String(), "outbox relay started")
	})
	if err := store.Add(ctx, db, outbox.Message{ID: "sigterm-1", RoutingKey: q, Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	var got []string
	testenv.Eventually(t, 30*time.Second, "message relayed (NOTIFY; polling is a minute away)", func() bool {
		for _, d := range testenv.Drain(t, q) {
			got = append(got, d.MessageId)
		}
		return len(got) > 0
	})
	if err := child.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- child.Wait() }()
	select {
	case err := <-waited:
		var ee *exec.ExitError
		if errors.As(err, &ee) || err != nil {
			t.Fatalf("relay exited with %v after SIGTERM, want 0\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("relay did not exit after SIGTERM\n%s", logs.String())
	}
	out := logs.String()
	if !strings.Contains(out, "drained and stopped") {
		t.Fatalf("no final log line:\n%s", out)
	}
	if strings.Contains(out, "guest:guest@") {
		t.Fatalf("password in logs:\n%s", out)
	}
	if len(got) != 1 || got[0] != "sigterm-1" {
		t.Fatalf("consumed %v", got)
	}
}

// TestRelayStartsWhileDatabaseRefuses starts `idemq relay` while its
// PostgreSQL database refuses new connections with a server error
// (SQLSTATE 55000, no list of outage errors named it: the relay exited at
// once): it waits, logged, and relays once the database accepts
// connections again.
func TestRelayStartsWhileDatabaseRefuses(t *testing.T) {
	testenv.RequireAMQP(t)
	dsn := testenv.PostgresDB(t)
	q := testenv.Queue(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	store, db := testStore(ctx, t, dburl.Target{Dialect: "postgres", DSN: dsn})
	if err := store.Add(ctx, db, outbox.Message{ID: "refused-1", RoutingKey: q, Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	admin := func(sql string) {
		conn, err := pgx.Connect(ctx, testenv.PostgresURL())
		if err != nil {
			t.Fatalf("admin connection: %v", err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	admin(fmt.Sprintf(`ALTER DATABASE %q ALLOW_CONNECTIONS false`, cfg.Database))
	admin(fmt.Sprintf(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '%s' AND pid <> pg_backend_pid()`, cfg.Database))
	allowed := false
	allow := func() {
		if !allowed {
			allowed = true
			admin(fmt.Sprintf(`ALTER DATABASE %q ALLOW_CONNECTIONS true`, cfg.Database))
		}
	}
	t.Cleanup(allow)

	args := []string{"relay", "--db", dsn, "--poll", "100ms", "--log-format", "text"}
	child := exec.Command(os.Args[0], "-test.run=^TestHelperRelayMain$")
	child.Env = testenv.Env("IDEMQ_TEST_RELAY_MAIN_ARGS=" + strings.Join(args, "\x1f"))
	var logs testenv.LogBuffer
	child.Stdout, child.Stderr = &logs, &logs
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Process.Kill()
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()
	testenv.Eventually(t, 30*time.Second, "the relay waits for its database", func() bool {
		select {
		case err := <-exited:
			t.Fatalf("relay exited while the database refused connections (%v):\n%s", err, logs.String())
		default:
		}
		return strings.Contains(logs.String(), "waiting for it")
	})
	allow()
	var got []string
	testenv.Eventually(t, 30*time.Second, "the row relayed once the database accepts connections", func() bool {
		for _, d := range testenv.Drain(t, q) {
			got = append(got, d.MessageId)
		}
		return len(got) > 0
	})
	if len(got) != 1 || got[0] != "refused-1" {
		t.Fatalf("relayed %v", got)
	}
	_ = child.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("relay exited with %v after SIGTERM\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("relay did not exit after SIGTERM\n%s", logs.String())
	}
}
