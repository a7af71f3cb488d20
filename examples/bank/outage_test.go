package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/topology"
)

// A `bank consume` started while its PostgreSQL is unusable (restarted by
// its supervisor mid-outage) keeps running, waiting for the database with
// backoff, and processes the backlog once the database is back — it does
// not exit. The shapes: the server stopped (connection refused), the
// server refusing new connections with a server error (SQLSTATE 55000,
// "not currently accepting connections": no list of outage errors held
// it, and the consumer exited at once), and a server that accepts the
// connection and never answers (a stall: it exited with "failed to
// receive message: timeout").
func TestConsumeStartsDuringOutage(t *testing.T) {
	for _, shape := range []string{"stopped", "refusing connections (55000)", "stalled"} {
		t.Run(shape, func(t *testing.T) { consumeStartsDuring(t, shape) })
	}
}

func consumeStartsDuring(t *testing.T, shape string) {
	testenv.RequireAMQP(t)
	bin := buildBank(t)
	pg := testenv.StartPrivatePostgres(t)
	db := pg.CreateDB("bank")
	queue := testenv.Name(t, "bank")
	q := bankQueue(queue, "classic")
	t.Cleanup(func() {
		p := topology.ForQueue(q)
		names := []string{p.Queue, p.DLQ}
		for _, r := range p.Retries {
			names = append(names, r.Name)
		}
		testenv.DeleteQueue(names...)
	})
	if err := topology.Declare(context.Background(), testenv.Channel(t), topology.Topology{Queues: []topology.Queue{q}}); err != nil {
		t.Fatal(err)
	}
	var msgs []amqp.Publishing
	var want int64
	for i := 0; i < 30; i++ {
		want += int64(i + 1)
		msgs = append(msgs, amqp.Publishing{MessageId: fmt.Sprintf("t-%d", i), ContentType: "application/json",
			Body: []byte(fmt.Sprintf(`{"account":"acc-%d","amount":%d}`, i%3, i+1))})
	}
	testenv.Publish(t, "", queue, msgs...) // the backlog

	consumeURL := db
	var back func()
	switch shape {
	case "stopped":
		pg.Stop()
		back = pg.Start
	case "refusing connections (55000)":
		admin := func(sql string) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			conn, err := pgx.Connect(ctx, pg.URL())
			if err != nil {
				t.Fatalf("admin connection: %v", err)
			}
			defer conn.Close(ctx)
			if _, err := conn.Exec(ctx, sql); err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
		}
		admin(`ALTER DATABASE bank ALLOW_CONNECTIONS false`)
		back = func() { admin(`ALTER DATABASE bank ALLOW_CONNECTIONS true`) }
	case "stalled":
		u, err := url.Parse(db)
		if err != nil {
			t.Fatal(err)
		}
		proxy := testenv.NewProxy(t, u.Host)
		u.Host = proxy.Addr()
		consumeURL = u.String()
		proxy.Stall()
		back = proxy.Resume
	}
	logPath := filepath.Join(t.TempDir(), "consume.log")
	out, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "consume", "--mode", "inbox", "--queue", queue, "--queue-type", "classic",
		"--postgres", consumeURL, "--workers", "2", "--prefetch", "10")
	cmd.Env = testenv.Env()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	logText := func() string { b, _ := os.ReadFile(logPath); return string(b) }
	testenv.Eventually(t, 30*time.Second, "consume to report it waits for PostgreSQL", func() bool {
		select {
		case err := <-exited:
			t.Fatalf("bank consume exited while PostgreSQL is %s (%v):\n%s", shape, err, logText())
		default:
		}
		return strings.Contains(logText(), "waiting for it")
	})
	back()
	testenv.Eventually(t, 60*time.Second, "the backlog applied once PostgreSQL is back", func() bool {
		select {
		case err := <-exited:
			t.Fatalf("bank consume exited (%v):\n%s", err, logText())
		default:
		}
		got, _ := balance(t, db)
		return got >= want
	})
	if got, _ := balance(t, db); got != want {
		t.Fatalf("balance %d, want %d", got, want)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, logText())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("did not exit within 30s of SIGTERM")
	}
}

// The demo's dependency-outage phase, short: per mode, the demo's private
// PostgreSQL stalls (SIGSTOP of every server process: connections
// accepted and never answered) and then refuses connections with a server
// error (ALLOW_CONNECTIONS false, SQLSTATE 55000), 3 s each, during a
// backlog (the publisher holds half the transfers until the first outage
// starts); the dedup mode's private Redis is killed and kept down for 3 s.
// A consumer is killed a second into each database outage, so its
// successor starts while the database is unavailable: it must wait, not
// exit (no consumer exits on its own). No valid transfer is
// dead-lettered, none is lost, inbox is exact. make chaos runs the long
// version (stop, stall and refuse of 30 s, with kills).
func TestDependencyOutageShort(t *testing.T) {
	testenv.RequireAMQP(t)
	if _, err := exec.LookPath("redis-server"); err != nil {
		testenv.Unavailable(t, "redis-server (binary)", "PATH", err)
	}
	bin := buildBank(t)
	ls := runDemo(t, bin, "--modes", "none,dedup,inbox", "--messages", "200", "--kills", "0", "--cuts", "0",
		"--proxy-cuts", "0", "--redis-restarts", "0", "--crash-rate", "0",
		"--db-outages", "2", "--db-outage-shapes", "stall,refuse", "--db-outage-duration", "3s", "--redis-outages", "1", "--redis-outage-duration", "3s",
		"--timeout", "90s")
	if len(ls) != 3 {
		t.Fatalf("%d modes ran, want 3", len(ls))
	}
	for _, l := range ls {
		if l.Lost != 0 {
			t.Errorf("%s: %d transfers lost", l.Mode, l.Lost)
		}
		if l.ValidDeadLettered != 0 {
			t.Errorf("%s: %d valid transfers dead-lettered during the outages (reasons %v)", l.Mode, l.ValidDeadLettered, l.Reasons)
		}
		if l.DeadLettered < l.Malformed {
			t.Errorf("%s: %d dead letters, want at least %d", l.Mode, l.DeadLettered, l.Malformed)
		}
		if l.DBOutages != 2 {
			t.Errorf("%s: %d PostgreSQL outages ran, want 2", l.Mode, l.DBOutages)
		}
		if l.ExitedOnTheirOwn != 0 {
			t.Errorf("%s: %d consumers exited on their own", l.Mode, l.ExitedOnTheirOwn)
		}
		if l.Mode == "dedup" && l.RedisOutages != 1 {
			t.Errorf("dedup: %d Redis outages ran, want 1", l.RedisOutages)
		}
		if l.StuckOnSigterm != 0 {
			t.Errorf("%s: %d consumers did not exit on SIGTERM", l.Mode, l.StuckOnSigterm)
		}
		if l.Mode == "inbox" && !l.Exact {
			t.Errorf("inbox not exact: %+v", l)
		}
	}
}
