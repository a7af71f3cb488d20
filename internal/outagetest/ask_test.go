package outagetest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/testenv"
)

// pgAdmin runs sql on the shared PostgreSQL's postgres database, as its
// superuser; a failure fails the test.
func pgAdmin(t *testing.T, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, testenv.PostgresURL())
	if err != nil {
		t.Errorf("admin connection: %v", err)
		return
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Errorf("%s: %v", sql, err)
	}
}

// refuseConnections makes PostgreSQL refuse new connections to the
// database of dbURL with a server error (SQLSTATE 55000, "not currently
// accepting connections") and ends its sessions; allow undoes it.
func refuseConnections(t *testing.T, dbURL string) (refuse, allow func()) {
	t.Helper()
	cfg, err := pgx.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	name := cfg.Database
	admin := func(sql string) { pgAdmin(t, sql) }
	refuse = func() {
		admin(fmt.Sprintf(`ALTER DATABASE %q ALLOW_CONNECTIONS false`, name))
		admin(fmt.Sprintf(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '%s' AND pid <> pg_backend_pid()`, name))
	}
	allow = func() { admin(fmt.Sprintf(`ALTER DATABASE %q ALLOW_CONNECTIONS true`, name)) }
	t.Cleanup(allow)
	return refuse, allow
}

// A dependency failing in a shape nobody listed — PostgreSQL refusing new
// connections with a server error (SQLSTATE 55000), which no error list
// of idemq's calls an outage — is an outage when the consumer asks the
// dependency (the breaker's probe) before counting an attempt: nothing is
// dead-lettered, nothing counted as an attempt, the consumer pauses and
// resumes, every message is applied once. With asking turned off
// (AskTimeout < 0, idemq before issue 38) the same outage uses up every
// attempt and dead-letters the messages.
func TestServerRefusalDecidedByAskingTheDependency(t *testing.T) {
	for _, tc := range []struct {
		name string
		ask  time.Duration
		want string // "exact" or "dead-lettered"
	}{
		{"asked", 0, "exact"},
		{"not asked (error shapes only)", -1, "dead-lettered"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dbURL := testenv.PostgresDB(t)
			refuse, allow := refuseConnections(t, dbURL)
			f := newFixture(t, 20)
			var mu sync.Mutex
			applied := map[string]int{}
			var hold holder
			hold.close() // the first deliveries wait until the database refuses
			handler := idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
				hold.wait()
				// A fresh connection per message, as a handler calling a
				// service would: it meets the refusal as a plain error.
				conn, err := pgx.Connect(ctx, dbURL)
				if err != nil {
					return fmt.Errorf("apply %s: %w", d.MessageID, err)
				}
				defer conn.Close(context.Background())
				if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
					return fmt.Errorf("apply %s: %w", d.MessageID, err)
				}
				mu.Lock()
				applied[d.MessageID]++
				mu.Unlock()
				return nil
			})
			cfg := idemq.ConsumerConfig{URL: testenv.AMQPURL(), Queue: f.q.Name, Logger: logger(), Workers: 4, Prefetch: 20,
				Pipeline: idemq.Pipeline{Policy: f.policy()}}
			cfg.Breaker.AskTimeout = tc.ask
			configureBreaker(&cfg, func(ctx context.Context) error {
				conn, err := pgx.Connect(ctx, dbURL)
				if err != nil {
					return err
				}
				defer conn.Close(context.Background())
				return conn.Ping(ctx)
			})
			c := run(t, cfg, handler)
			<-c.Ready()
			refuse()
			hold.open()
			counters := c.Counters()
			if tc.want == "dead-lettered" {
				testenv.Eventually(t, 60*time.Second, "a message dead-lettered by the outage", func() bool { return f.deadLettered(t) })
				allow()
				return
			}
			waitOutage(t, counters)
			testenv.Eventually(t, 10*time.Second, "failures asked about", func() bool {
				return counters.Get(idemq.CountProbedOutages) > 0
			})
			allow()
			testenv.Eventually(t, 60*time.Second, "every message applied", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(applied) == len(f.ids)
			})
			f.checkNoDeadLetters(t)
			checkOutageCounted(t, counters)
			mu.Lock()
			defer mu.Unlock()
			for id, n := range applied {
				if n != 1 {
					t.Errorf("%s applied %d times", id, n)
				}
			}
			if n := counters.Get(idemq.CountRetried); n != 0 {
				// Unavailable deliveries go back in place, uncounted: no
				// delayed retry (an attempt) was published.
				t.Errorf("%d delayed retries: the outage was counted as attempts", n)
			}
		})
	}
}
