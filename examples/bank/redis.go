package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// errNoRedisServer means redis-server is not on PATH, so the demo cannot run
// a Redis of its own to kill and restart.
var errNoRedisServer = errors.New("redis-server is not on PATH")

// sentinelKey is written before every kill of a private Redis and read back
// after the restart: whether it survived says whether the dedup records did.
const sentinelKey = "bank-demo:sentinel"

// privateRedis is a redis-server the demo owns: its own free port and data
// folder, so it can be SIGKILLed and restarted without touching the shared
// Redis. With persist it runs with an append-only file fsynced on every write
// (--appendonly yes --appendfsync always); without, with no persistence at
// all (no AOF, no RDB snapshots), so a restart forgets every record.
type privateRedis struct {
	port    int
	dir     string
	persist bool
	cmd     *exec.Cmd
	exited  chan struct{}
	logf    *os.File
}

// startPrivateRedis starts a private redis-server with its data under dir
// and waits until it answers PING.
func startPrivateRedis(ctx context.Context, dir string, persist bool) (*privateRedis, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, fmt.Errorf("%w: %w", errNoRedisServer, err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "redis")
	if err := os.MkdirAll(data, 0o755); err != nil {
		return nil, err
	}
	r := &privateRedis{port: port, dir: data, persist: persist}
	if err := r.start(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// variant names the persistence setting, as the ledger shows it.
func (r *privateRedis) variant() string {
	if r.persist {
		return "aof-always"
	}
	return "no-persist"
}

func (r *privateRedis) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// url is the redis:// URL the consumers get.
func (r *privateRedis) url() string { return "redis://" + r.addr() + "/0" }

func (r *privateRedis) client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: r.addr(), MaxRetries: -1, DialTimeout: time.Second})
}

func (r *privateRedis) start(ctx context.Context) error {
	args := []string{"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--dir", r.dir,
		"--daemonize", "no", "--save", ""}
	if r.persist {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	logf, err := os.OpenFile(filepath.Join(r.dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command("redis-server", args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	setPdeathsig(cmd)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start redis-server: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	r.cmd, r.exited, r.logf = cmd, exited, logf

	c := r.client()
	defer c.Close()
	deadline := time.Now().Add(15 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		err := c.Ping(pctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(logf.Name())
			return fmt.Errorf("redis-server on port %d exited at start: %s", r.port, tail(string(b), 400))
		default:
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			r.kill()
			return fmt.Errorf("redis-server on port %d does not answer PING: %w", r.port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill SIGKILLs the server (no shutdown save) and waits for it to be gone.
func (r *privateRedis) kill() {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	<-r.exited
	r.logf.Close()
	r.cmd = nil
}

// restart writes the sentinel, SIGKILLs the server, starts it again on the
// same port and folder, and reports whether the sentinel survived.
func (r *privateRedis) restart(ctx context.Context) (kept bool, err error) {
	c := r.client()
	defer c.Close()
	if err := c.Set(ctx, sentinelKey, time.Now().UnixNano(), 0).Err(); err != nil {
		return false, fmt.Errorf("redis sentinel: %w", err)
	}
	r.kill()
	if err := r.start(ctx); err != nil {
		return false, err
	}
	n, err := c.Exists(ctx, sentinelKey).Result()
	if err != nil {
		return false, fmt.Errorf("redis sentinel after restart: %w", err)
	}
	return n == 1, nil
}

// outage SIGKILLs the server, keeps it down for d, and starts it again
// on the same port and folder.
func (r *privateRedis) outage(ctx context.Context, d time.Duration, started func()) error {
	r.kill()
	started()
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
	return r.start(context.WithoutCancel(ctx))
}

// stop kills the server for good.
func (r *privateRedis) stop() { r.kill() }
