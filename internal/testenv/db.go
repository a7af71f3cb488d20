package testenv

import (
	"context"
	"database/sql"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// Redis returns a client for the test Redis (closed at cleanup) and a key
// prefix unique to this test; keys under it are deleted at cleanup.
func Redis(t testing.TB) (redis.UniversalClient, string) {
	t.Helper()
	u := RedisURL()
	opt, err := redis.ParseURL(u)
	if err != nil {
		t.Fatalf("IDEMQ_REDIS_URL: %v", err)
	}
	c := redis.NewClient(opt)
	if err := Reachable(ReachWithin, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return c.Ping(ctx).Err()
	}); err != nil {
		c.Close()
		Unavailable(t, "Redis", u, err)
	}
	prefix := Name(t, "t")
	t.Cleanup(func() {
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if scanned, err := deleteKeys(ctx, c, prefix, maxCleanupScan); err != nil {
			t.Logf("redis cleanup of %s*: %v", prefix, err)
		} else if !scanned {
			t.Logf("redis cleanup of %s* skipped: the database holds more than %d keys (a benchmark's?); the test's keys are left under its own prefix", prefix, maxCleanupScan)
		}
	})
	return c, prefix
}

// maxCleanupScan bounds the database a test's cleanup scans for its keys.
// SCAN walks the whole database whatever its pattern: on one left full by
// a benchmark (3 million keys after `make bench`), every test spent
// seconds in its cleanup, and the Redis packages of `make test` minutes.
const maxCleanupScan = 100_000

// deleteKeys deletes the keys that contain prefix, unless the database
// holds more than maxKeys keys. It reports whether it looked.
func deleteKeys(ctx context.Context, c redis.UniversalClient, prefix string, maxKeys int64) (bool, error) {
	n, err := c.DBSize(ctx).Result()
	if err != nil {
		return false, err
	}
	if n > maxKeys {
		return false, nil
	}
	iter := c.Scan(ctx, 0, "*"+prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		if err := c.Del(ctx, iter.Val()).Err(); err != nil {
			return true, err
		}
	}
	return true, iter.Err()
}

// PrivateRedis is a redis-server this test owns (its own port and data
// folder), so the test can restart it without touching anyone else's.
type PrivateRedis struct {
	t       testing.TB
	Port    int
	Dir     string
	persist bool
	fsync   string
	cmd     *exec.Cmd
}

// StartPrivateRedis starts a redis-server on a free port. With persist, it
// runs with appendonly (fsync every write) so a restart keeps its data.
func StartPrivateRedis(t testing.TB, persist bool) *PrivateRedis {
	t.Helper()
	return startPrivateRedis(t, persist, "always")
}

// StartPrivateRedisFsync starts a redis-server with appendonly and the
// given appendfsync policy (always, everysec, no).
func StartPrivateRedisFsync(t testing.TB, fsync string) *PrivateRedis {
	t.Helper()
	return startPrivateRedis(t, true, fsync)
}

func startPrivateRedis(t testing.TB, persist bool, fsync string) *PrivateRedis {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		Unavailable(t, "redis-server (binary)", "PATH", err)
	}
	r := &PrivateRedis{t: t, Port: FreePort(t), Dir: t.TempDir(), persist: persist, fsync: fsync}
	r.Start()
	t.Cleanup(r.Stop)
	return r
}

// Addr is host:port.
func (r *PrivateRedis) Addr() string { return "127.0.0.1:" + strconv.Itoa(r.Port) }

// Client returns a new client for this server.
func (r *PrivateRedis) Client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1, DialTimeout: time.Second})
}

// Start starts the server and waits for it to answer PING.
func (r *PrivateRedis) Start() {
	r.t.Helper()
	args := []string{"--port", strconv.Itoa(r.Port), "--bind", "127.0.0.1", "--dir", r.Dir, "--save", "", "--daemonize", "no"}
	if r.persist {
		args = append(args, "--appendonly", "yes", "--appendfsync", r.fsync)
	} else {
		args = append(args, "--appendonly", "no")
	}
	r.cmd = exec.Command("redis-server", args...)
	r.cmd.Stdout, r.cmd.Stderr = nil, nil
	if err := r.cmd.Start(); err != nil {
		r.t.Fatalf("start redis-server: %v", err)
	}
	c := r.Client()
	defer c.Close()
	Eventually(r.t, 15*time.Second, "private redis to answer", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		return c.Ping(ctx).Err() == nil
	})
}

// Kill stops the server with SIGKILL (no shutdown save).
func (r *PrivateRedis) Kill() {
	if r.cmd != nil && r.cmd.Process != nil {
		_ = r.cmd.Process.Kill()
		_, _ = r.cmd.Process.Wait()
		r.cmd = nil
	}
}

// Signal sends sig to the server process: SIGSTOP stalls it (connections
// accepted by the kernel, nothing answered), SIGCONT resumes it.
func (r *PrivateRedis) Signal(sig os.Signal) {
	r.t.Helper()
	if r.cmd == nil || r.cmd.Process == nil {
		r.t.Fatal("private redis: not running")
	}
	if err := r.cmd.Process.Signal(sig); err != nil {
		r.t.Fatalf("private redis: signal %v: %v", sig, err)
	}
}

// Restart kills and starts the server again on the same port and folder.
func (r *PrivateRedis) Restart() {
	r.Kill()
	r.Start()
}

// Stop kills the server.
func (r *PrivateRedis) Stop() { r.Kill() }

// PostgresDB creates a fresh database for this test, dropped at cleanup, and
// returns its URL.
func PostgresDB(t testing.TB) string {
	t.Helper()
	base := PostgresURL()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		Unavailable(t, "PostgreSQL", base, err)
	}
	defer conn.Close(ctx)
	name := Name(t, "db")
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			return
		}
		defer c.Close(ctx)
		_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

// MySQLDB creates a fresh MariaDB/MySQL database for this test, dropped at
// cleanup, and returns a go-sql-driver DSN for it (parseTime on).
func MySQLDB(t testing.TB) string {
	t.Helper()
	base := MySQLURL()
	cfg, err := mysql.ParseDSN(base)
	if err != nil {
		t.Fatalf("IDEMQ_MYSQL_URL: %v", err)
	}
	cfg.DBName = ""
	cfg.ParseTime = true
	root, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := root.PingContext(ctx); err != nil {
		Unavailable(t, "MariaDB", cfg.FormatDSN(), err)
	}
	name := Name(t, "db")
	if _, err := root.ExecContext(ctx, "CREATE DATABASE `"+name+"`"); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		db, err := sql.Open("mysql", cfg.FormatDSN())
		if err != nil {
			return
		}
		defer db.Close()
		_, _ = db.Exec("DROP DATABASE IF EXISTS `" + name + "`")
	})
	cfg.DBName = name
	return cfg.FormatDSN()
}

// SQLitePath returns a path for a fresh SQLite database file in a temp dir.
func SQLitePath(t testing.TB) string {
	t.Helper()
	return filepath.Join(t.TempDir(), strings.ReplaceAll(Name(t, "db"), "/", "_")+".sqlite")
}

// Env returns the environment for a child process with the IDEMQ_* URLs set.
func Env(extra ...string) []string {
	env := os.Environ()
	env = append(env,
		"IDEMQ_AMQP_URL="+AMQPURL(),
		"IDEMQ_REDIS_URL="+RedisURL(),
		"IDEMQ_POSTGRES_URL="+PostgresURL(),
		"IDEMQ_MYSQL_URL="+MySQLURL(),
	)
	return append(env, extra...)
}
