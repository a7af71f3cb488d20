package outagetest

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sqldb/postgres"
)

// The dependency answers, but refuses to write: the shapes that follow a
// failover (a read-only replica or standby answering where the primary
// was) or a full Redis. A probe that only reads passes, so asking the
// dependency would call each failure the message's own; the probes write
// (dedup.Probe claims and releases a probe key, inbox.Probe runs a write
// that touches no row), so each is an outage: the consumer pauses, no
// attempt is counted, nothing is dead-lettered, and once the dependency
// writes again every message is applied once.
func TestWriteRefusalsAreOutages(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T) (cfg idemq.ConsumerConfig, h idemq.Handler, refuse, allow func(), applied func() map[string]int)
	}{
		{"redis guard, maxmemory reached under noeviction (OOM)", func(t *testing.T) (idemq.ConsumerConfig, idemq.Handler, func(), func(), func() map[string]int) {
			return redisGuardCell(t, func(ctx context.Context, c *redis.Client) error {
				if err := c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
					return err
				}
				return c.ConfigSet(ctx, "maxmemory", "1").Err()
			}, func(ctx context.Context, c *redis.Client) error {
				return c.ConfigSet(ctx, "maxmemory", "0").Err()
			})
		}},
		{"redis guard, a read-only replica (READONLY)", func(t *testing.T) (idemq.ConsumerConfig, idemq.Handler, func(), func(), func() map[string]int) {
			return redisGuardCell(t, func(ctx context.Context, c *redis.Client) error {
				// A replica of a primary that does not answer: it keeps
				// its data and answers reads, and refuses writes.
				return c.ReplicaOf(ctx, "127.0.0.1", strconv.Itoa(testenv.FreePort(t))).Err()
			}, func(ctx context.Context, c *redis.Client) error {
				return c.ReplicaOf(ctx, "NO", "ONE").Err()
			})
		}},
		{"redis guard, a server that stalls (SIGSTOP)", func(t *testing.T) (idemq.ConsumerConfig, idemq.Handler, func(), func(), func() map[string]int) {
			var rs *testenv.PrivateRedis
			cfg, h, _, _, applied := redisGuardCellOn(t, func(r *testenv.PrivateRedis) { rs = r }, nil, nil)
			return cfg, h, func() { rs.Signal(syscall.SIGSTOP) }, func() { rs.Signal(syscall.SIGCONT) }, applied
		}},
		{"postgres inbox, a read-only database (hot standby)", postgresReadOnlyCell},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, h, refuse, allow, applied := tc.setup(t)
			f := newFixture(t, 30)
			cfg.Queue, cfg.Workers, cfg.Prefetch, cfg.Logger = f.q.Name, 4, 10, logger()
			cfg.Pipeline.Policy = f.policy()
			var hold holder
			hold.close()
			held := idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
				hold.wait()
				return h.Handle(ctx, d)
			})
			c := run(t, cfg, held)
			<-c.Ready()
			refuse()
			hold.open()
			counters := c.Counters()
			waitOutage(t, counters)
			time.Sleep(2 * time.Second) // the refusal lasts: probes keep failing, nothing counted
			if f.deadLettered(t) {
				t.Error("a message was dead-lettered while the dependency refused writes")
			}
			allow()
			testenv.Eventually(t, 60*time.Second, "every message applied (or one dead-lettered)", func() bool {
				return len(applied()) >= len(f.ids) || f.deadLettered(t)
			})
			f.checkNoDeadLetters(t)
			for id, n := range applied() {
				if n != 1 {
					t.Errorf("%s applied %d times", id, n)
				}
			}
			if n := counters.Get(idemq.CountRetried); n != 0 {
				t.Errorf("%d delayed retries: the refusal was counted as attempts", n)
			}
			checkOutageCounted(t, counters)
			// The consumer paused for the refusal (the probes failed while
			// it lasted, 2 s at least), rather than taking deliveries back
			// and forth because a probe that only reads passed.
			if ms := counters.Get(idemq.CountPausedMillis); ms < 1000 {
				t.Errorf("paused %d ms during a refusal of 2 s or more: the probe did not see it", ms)
			}
			t.Logf("%d applied; counters %v", len(applied()), counters.Snapshot())
		})
	}
}

// redisGuardCell is a dedup guard on a private Redis that refuse and allow
// turn against writes and back.
func redisGuardCell(t *testing.T, refuse, allow func(context.Context, *redis.Client) error) (idemq.ConsumerConfig, idemq.Handler, func(), func(), func() map[string]int) {
	return redisGuardCellOn(t, nil, refuse, allow)
}

// redisGuardCellOn is redisGuardCell, handing the private Redis to got.
func redisGuardCellOn(t *testing.T, got func(*testenv.PrivateRedis), refuse, allow func(context.Context, *redis.Client) error) (idemq.ConsumerConfig, idemq.Handler, func(), func(), func() map[string]int) {
	rs := testenv.StartPrivateRedis(t, true)
	if got != nil {
		got(rs)
	}
	rc := rs.Client()
	t.Cleanup(func() { rc.Close() })
	admin := rs.Client()
	t.Cleanup(func() { admin.Close() })
	store, err := redisstore.New(rc, redisstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	guard, err := dedup.NewGuard(dedup.Config{Store: store, Prefix: "shapes", Lease: 5 * time.Second, StoreTimeout: time.Second, Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	applied := map[string]int{}
	h := idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
		mu.Lock()
		applied[d.MessageID]++
		mu.Unlock()
		return nil
	})
	var cfg idemq.ConsumerConfig
	cfg.Pipeline.Guard = guard
	configureBreaker(&cfg, dedup.Probe(store))
	do := func(f func(context.Context, *redis.Client) error) func() {
		return func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := f(ctx, admin); err != nil {
				t.Errorf("redis admin: %v", err)
			}
		}
	}
	return cfg, h, do(refuse), do(allow), func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		out := make(map[string]int, len(applied))
		for k, v := range applied {
			out[k] = v
		}
		return out
	}
}

// postgresReadOnlyCell is an inbox on a database that refuse turns
// read-only (default_transaction_read_only, the sessions ended: what the
// consumer meets when a hot standby answers where the primary was).
func postgresReadOnlyCell(t *testing.T) (idemq.ConsumerConfig, idemq.Handler, func(), func(), func() map[string]int) {
	dbURL := testenv.PostgresDB(t)
	ctx := context.Background()
	pool := testenv.PgxPool(t, dbURL)
	if _, err := pool.Exec(ctx, `CREATE TABLE applied (message_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(ctx, postgres.Pgx(pool), inbox.Config{Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	h := ib.Handler(func(ctx context.Context, tx pgx.Tx, d *idemq.Delivery) error {
		_, err := tx.Exec(ctx, `INSERT INTO applied (message_id) VALUES ($1)`, d.MessageID)
		return err
	})
	var cfg idemq.ConsumerConfig
	configureBreaker(&cfg, ib.Probe)
	name := pool.Config().ConnConfig.Database
	admin := func(sql string) { pgAdmin(t, sql) }
	endSessions := fmt.Sprintf(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '%s' AND pid <> pg_backend_pid()`, name)
	refuse := func() {
		admin(fmt.Sprintf(`ALTER DATABASE %q SET default_transaction_read_only = on`, name))
		admin(endSessions)
	}
	allow := func() {
		admin(fmt.Sprintf(`ALTER DATABASE %q RESET default_transaction_read_only`, name))
		admin(endSessions)
	}
	return cfg, h, refuse, allow, func() map[string]int {
		rows, err := pool.Query(context.Background(), `SELECT message_id, count(*) FROM applied GROUP BY message_id`)
		if err != nil {
			return nil
		}
		out := map[string]int{}
		for rows.Next() {
			var id string
			var n int
			if rows.Scan(&id, &n) == nil {
				out[id] = n
			}
		}
		rows.Close()
		return out
	}
}
