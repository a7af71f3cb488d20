package main

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/sqldb/dburl"
)

// TestRelayNeverShowsThePassword feeds the relay every DSN form with a
// planted password (pointing at a port nobody listens on, so the relay
// fails or keeps retrying) and checks that no log line and no error shows
// it, and that a DSN whose dialect cannot be told is refused instead of
// becoming a SQLite file.
func TestRelayNeverShowsThePassword(t *testing.T) {
	const secret = "Pl4nted-S3cret"
	port := strconv.Itoa(testenv.FreePort(t))
	amqpURL := "amqp://guest:" + secret + "@127.0.0.1:" + port + "/"
	cases := []struct {
		name, db, dialect string
		refused           bool // resolveDB must refuse it
	}{
		{name: "url", db: "postgres://app:" + secret + "@127.0.0.1:" + port + "/app"},
		{name: "url-password-param", db: "postgres://app@127.0.0.1:" + port + "/app?password=" + secret + "&sslmode=disable"},
		{name: "url-sslpassword", db: "postgresql://app@127.0.0.1:" + port + "/app?sslpassword=" + secret + "&sslmode=disable"},
		{name: "url-access-token", db: "postgres://app@127.0.0.1:" + port + "/app?access_token=" + secret + "&sslmode=disable"},
		{name: "url-slash-in-password", db: "postgres://app:ab/" + secret + "@127.0.0.1:" + port + "/app"},
		{name: "keyword", db: "host=127.0.0.1 port=" + port + " user=app password=" + secret + " dbname=app sslmode=disable", dialect: "postgres"},
		{name: "keyword-quoted", db: "host=127.0.0.1 port=" + port + " user=app password='" + secret + " \\' x' dbname=app sslmode=disable", dialect: "postgres"},
		{name: "keyword-sslpassword", db: "host=127.0.0.1 port=" + port + " user=app sslpassword=" + secret + " dbname=app sslmode=disable", dialect: "postgres"},
		{name: "keyword-no-dialect", db: "host=127.0.0.1 port=" + port + " user=app password=" + secret + " dbname=app", refused: true},
		{name: "go-sql-driver", db: "app:" + secret + "@tcp(127.0.0.1:" + port + ")/app?timeout=1s"},
		{name: "mysql-scheme-driver", db: "mysql://app:" + secret + "@tcp(127.0.0.1:" + port + ")/app?timeout=1s"},
		{name: "mysql-url", db: "mysql://app:" + secret + "@127.0.0.1:" + port + "/app?timeout=1s"},
		{name: "unknown", db: "app:" + secret + "@127.0.0.1:" + port + "/app", refused: true},
		{name: "sqlite-dialect-keyword", db: "host=db password=" + secret, dialect: "sqlite", refused: true},
	}
	dir := t.TempDir()
	t.Chdir(dir)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
			defer cancel()
			cmd := newRootCmd()
			var logs testenv.LogBuffer
			cmd.SetErr(&logs)
			cmd.SetOut(&logs)
			args := []string{"relay", "--db", c.db, "--amqp", amqpURL, "--log-format", "text", "--log-level", "debug", "--lease", "1s"}
			if c.dialect != "" {
				args = append(args, "--dialect", c.dialect)
			}
			cmd.SetArgs(args)
			err := cmd.ExecuteContext(ctx)
			var errText string
			if err != nil {
				errText = err.Error()
			}
			all := logs.String() + "\n" + errText
			if strings.Contains(all, secret) || strings.Contains(all, url.QueryEscape(secret)) {
				t.Errorf("password shown:\nerror: %s\nlogs:\n%s", errText, logs.String())
			}
			if c.refused {
				if err == nil || !strings.Contains(errText, "--dialect") {
					t.Errorf("want a refusal naming --dialect, got %v", err)
				}
			}
			ents, _ := os.ReadDir(dir)
			for _, e := range ents {
				t.Errorf("the relay created %q in the working directory (a SQLite file named after the DSN?)", filepath.Join(dir, e.Name()))
				os.Remove(filepath.Join(dir, e.Name()))
			}
		})
	}
}

// TestRelayMalformedAMQPURLNotLogged runs the relay on SQLite with a row to
// publish and a malformed AMQP URL holding a password: the publisher's dial
// fails on every attempt, and no log line shows the password.
func TestRelayMalformedAMQPURLNotLogged(t *testing.T) {
	const secret = "Pl4nted-S3cret"
	path := testenv.SQLitePath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	store, db := testStore(ctx, t, dburl.Target{Dialect: "sqlite", DSN: path})
	if err := store.Add(ctx, db, outbox.Message{ID: "m-1", RoutingKey: "nowhere", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	cmd := newRootCmd()
	var logs testenv.LogBuffer
	cmd.SetErr(&logs)
	cmd.SetOut(&logs)
	cmd.SetArgs([]string{"relay", "--db", "sqlite://" + path, "--amqp", "amqp://guest:ab/" + secret + "@127.0.0.1:5672/",
		"--log-format", "json", "--log-level", "debug", "--publish-timeout", "200ms", "--poll", "10ms", "--max-poll", "50ms"})
	// The broker check at start refuses a URL that does not parse.
	err := cmd.ExecuteContext(ctx)
	if err == nil || !strings.Contains(err.Error(), "not an AMQP URL") {
		t.Errorf("relay with a malformed AMQP URL: %v, want a refusal at start", err)
	}
	if err != nil && strings.Contains(err.Error(), secret) {
		t.Errorf("error shows the password: %v", err)
	}
	out := logs.String()
	if strings.Contains(out, secret) {
		t.Fatalf("password in logs:\n%s", out)
	}
	if err == nil || !strings.Contains(err.Error(), "amqp://xxxxx@127.0.0.1:5672") {
		t.Errorf("the refusal does not name the redacted URL: %v", err)
	}
}
