package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// errNoInitdb means PostgreSQL's initdb is not installed, so the demo
// cannot run a PostgreSQL of its own to stop and start.
var errNoInitdb = errors.New("initdb (PostgreSQL) not found on PATH nor in /usr/lib/postgresql/*/bin")

// privatePostgres is a PostgreSQL server the demo owns (its own port and
// data folder), so the dependency-outage phase can stop it and start it
// again without touching the shared server. Run as root it runs as the
// postgres user (runuser), as scripts/services.sh does.
type privatePostgres struct {
	port int
	dir  string
}

func pgBin(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/" + name); len(m) > 0 {
		return m[len(m)-1], nil
	}
	return "", errNoInitdb
}

func pgCmd(ctx context.Context, prog string, args ...string) (*exec.Cmd, error) {
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

// startPrivatePostgres initialises a cluster in a fresh folder and starts it.
func startPrivatePostgres(ctx context.Context) (*privatePostgres, error) {
	if _, err := pgBin("initdb"); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "bank-demo-pg-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("private postgres: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	p := &privatePostgres{port: port, dir: dir}
	cmd, err := pgCmd(ctx, "initdb", "-D", p.data(), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
	if err != nil {
		return nil, err
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %w: %s", err, tail(string(out), 400))
	}
	if err := p.start(ctx); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return p, nil
}

func (p *privatePostgres) data() string { return filepath.Join(p.dir, "pgdata") }

// url is the server's postgres database.
func (p *privatePostgres) url() string {
	return "postgres://postgres@" + net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)) + "/postgres?sslmode=disable"
}

// start starts the server and waits until it accepts connections.
func (p *privatePostgres) start(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=on", p.port, p.dir)
	cmd, err := pgCmd(cctx, "pg_ctl", "-D", p.data(), "-l", filepath.Join(p.dir, "postgres.log"), "-w", "-t", "90", "-o", opts, "start")
	if err != nil {
		return err
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(p.dir, "postgres.log"))
		return fmt.Errorf("pg_ctl start: %w: %s %s", err, out, tail(string(log), 600))
	}
	for {
		c, err := pgx.Connect(cctx, p.url())
		if err == nil {
			_ = c.Close(cctx)
			return nil
		}
		if cctx.Err() != nil {
			return fmt.Errorf("private postgres on port %d does not accept connections: %w", p.port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop stops the server at once (pg_ctl stop -m immediate: every
// connection is cut, as in a crash).
func (p *privatePostgres) stop(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd, err := pgCmd(cctx, "pg_ctl", "-D", p.data(), "-m", "immediate", "-w", "-t", "50", "stop")
	if err != nil {
		return err
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl stop: %w: %s", err, out)
	}
	return nil
}

// outage stops the server, calls started, keeps it down for d, and starts
// it again.
func (p *privatePostgres) outage(ctx context.Context, d time.Duration, started func()) error {
	if err := p.stop(ctx); err != nil {
		return err
	}
	started()
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
	return p.start(context.WithoutCancel(ctx))
}

// remove stops the server for good and deletes its folder.
func (p *privatePostgres) remove() {
	_ = p.stop(context.Background())
	os.RemoveAll(p.dir)
}
