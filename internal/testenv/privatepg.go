package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PrivatePostgres is a PostgreSQL server this test owns: its own data
// folder (initdb'ed for the test) and its own port, so the test can stop
// it (an outage) and start it again without touching the shared server.
// Run as root, the server runs as the postgres user (runuser), as
// scripts/services.sh does; otherwise as the current user.
type PrivatePostgres struct {
	t    testing.TB
	Port int
	Dir  string // the data folder's parent (logs, socket)

	mu      sync.Mutex
	running bool
}

// pgBin finds a PostgreSQL program: on PATH, else Debian's
// /usr/lib/postgresql/<v>/bin.
func pgBin(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/" + name)
	if len(matches) > 0 {
		return matches[len(matches)-1], nil
	}
	return "", fmt.Errorf("%s not found on PATH nor in /usr/lib/postgresql/*/bin", name)
}

// pgCommand runs a PostgreSQL program as the postgres user when we are root.
func pgCommand(ctx context.Context, prog string, args ...string) (*exec.Cmd, error) {
	bin, err := pgBin(prog)
	if err != nil {
		return nil, err
	}
	var cmd *exec.Cmd
	if os.Geteuid() == 0 {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", "postgres", "--", bin}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, bin, args...)
	}
	cmd.Dir = "/"
	return cmd, nil
}

// StartPrivatePostgres initialises a fresh cluster (initdb, trust auth,
// user postgres) in a temporary folder, starts it on a free port and
// registers its stop and removal at cleanup. A missing initdb fails the
// test in CI and skips it elsewhere.
func StartPrivatePostgres(t testing.TB) *PrivatePostgres {
	t.Helper()
	if _, err := pgBin("initdb"); err != nil {
		Unavailable(t, "PostgreSQL binaries (initdb)", "PATH", err)
	}
	// Not t.TempDir: its parents are mode 0700 and owned by us, which
	// the postgres user cannot enter.
	dir, err := os.MkdirTemp("", "idemq-privpg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			Unavailable(t, "PostgreSQL (user postgres)", "passwd", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	p := &PrivatePostgres{t: t, Port: FreePort(t), Dir: dir}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd, err := pgCommand(ctx, "initdb", "-D", p.dataDir(), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	t.Cleanup(p.stopFinal)
	p.Start()
	return p
}

func (p *PrivatePostgres) dataDir() string { return filepath.Join(p.Dir, "pgdata") }

// URL is the server's postgres database.
func (p *PrivatePostgres) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.Port)
}

// Start starts the server (on the same port and data) and waits until it
// accepts connections.
func (p *PrivatePostgres) Start() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.running {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c max_connections=100 -c fsync=off -c shared_buffers=16MB", p.Port, p.Dir)
	cmd, err := pgCommand(ctx, "pg_ctl", "-D", p.dataDir(), "-l", filepath.Join(p.Dir, "postgres.log"), "-w", "-t", "60", "-o", opts, "start")
	if err != nil {
		p.t.Fatal(err)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(p.Dir, "postgres.log"))
		p.t.Fatalf("pg_ctl start: %v\n%s\n%s", err, out, tailString(string(log), 2000))
	}
	p.running = true
	Eventually(p.t, 60*time.Second, "private PostgreSQL to accept connections", func() bool {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		c, err := pgx.Connect(cctx, p.URL())
		if err != nil {
			return false
		}
		_ = c.Close(cctx)
		return true
	})
}

// Stop stops the server at once (pg_ctl stop -m immediate: every
// connection is cut, no shutdown checkpoint — what a crash looks like to
// clients) and returns once it no longer runs.
func (p *PrivatePostgres) Stop() {
	p.t.Helper()
	if err := p.stop(); err != nil {
		p.t.Fatal(err)
	}
}

func (p *PrivatePostgres) stop() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.running {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd, err := pgCommand(ctx, "pg_ctl", "-D", p.dataDir(), "-m", "immediate", "-w", "-t", "50", "stop")
	if err != nil {
		return err
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl stop: %v\n%s", err, out)
	}
	p.running = false
	return nil
}

func (p *PrivatePostgres) stopFinal() { _ = p.stop() }

// CreateDB creates a database on the private server and returns its URL.
func (p *PrivatePostgres) CreateDB(name string) string {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, p.URL())
	if err != nil {
		p.t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		p.t.Fatalf("create database %s: %v", name, err)
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", p.Port, name)
}

func tailString(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
