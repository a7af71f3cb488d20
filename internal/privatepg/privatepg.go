package privatepg

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
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNotInstalled means PostgreSQL's server programs (initdb, pg_ctl) are
// neither on PATH nor in Debian's /usr/lib/postgresql/<v>/bin.
var ErrNotInstalled = errors.New("PostgreSQL server programs (initdb, pg_ctl) not found on PATH nor in /usr/lib/postgresql/*/bin")

// ErrInvalidConfig is wrapped by Config.Validate's errors.
var ErrInvalidConfig = errors.New("privatepg: invalid config")

// Config configures a private server. The zero value is usable.
type Config struct {
	// TempPrefix names the server's temporary folder (os.MkdirTemp).
	// Default "idemq-privpg-".
	TempPrefix string
	// MaxConnections is the server's max_connections. Default 100.
	MaxConnections int
	// Fsync turns the server's fsync on. Default off (faster; a stop -m
	// immediate still loses nothing committed, only an OS crash would).
	Fsync bool
	// SharedBuffers is the server's shared_buffers (e.g. "16MB"). Default
	// "": the server's own default.
	SharedBuffers string
	// StartTimeout bounds one start: pg_ctl start -w and the wait until the
	// server accepts connections. Default 2 minutes.
	StartTimeout time.Duration
}

// Validate checks the config; negative sizes and durations are errors.
func (c Config) Validate() error {
	if c.MaxConnections < 0 {
		return fmt.Errorf("%w: MaxConnections %d < 0", ErrInvalidConfig, c.MaxConnections)
	}
	if c.StartTimeout < 0 {
		return fmt.Errorf("%w: StartTimeout %v < 0", ErrInvalidConfig, c.StartTimeout)
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.TempPrefix == "" {
		c.TempPrefix = "idemq-privpg-"
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = 100
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = 2 * time.Minute
	}
	return c
}

// Server is a running (or stopped) private PostgreSQL server.
type Server struct {
	cfg  Config
	Port int    // its loopback port
	Dir  string // the data folder's parent (logs, socket)

	mu      sync.Mutex
	running bool
}

// Start initialises a fresh cluster in a new temporary folder, starts it on
// a free port and waits until it accepts connections. The caller calls
// Remove when done. A missing initdb is ErrNotInstalled.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if err := Installed(); err != nil {
		return nil, err
	}
	// Not a test's TempDir: its parents are mode 0700 and owned by us,
	// which the postgres user cannot enter.
	dir, err := os.MkdirTemp("", cfg.TempPrefix)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, Dir: dir}
	if err := s.initdb(ctx); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if err := s.Start(ctx); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// initdb makes the folder the postgres user's (when root), picks the port
// and initialises the cluster.
func (s *Server) initdb(ctx context.Context) error {
	if err := os.Chmod(s.Dir, 0o755); err != nil {
		return err
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return fmt.Errorf("private postgres: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(s.Dir, uid, gid); err != nil {
			return err
		}
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	s.Port = port
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd, err := pgCommand(cctx, "initdb", "-D", s.dataDir(), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
	if err != nil {
		return err
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %w: %s", err, tail(string(out), 400))
	}
	return nil
}

func (s *Server) dataDir() string { return filepath.Join(s.Dir, "pgdata") }

// URL is the server's postgres database.
func (s *Server) URL() string { return s.DBURL("postgres") }

// DBURL is the URL of database name on the server.
func (s *Server) DBURL(name string) string {
	return "postgres://postgres@" + net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)) + "/" + name + "?sslmode=disable"
}

// Start starts the server (same port, same data) and waits until it
// accepts connections. Starting a running server does nothing.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.StartTimeout)
	defer cancel()
	fsync := "off"
	if s.cfg.Fsync {
		fsync = "on"
	}
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c max_connections=%d -c fsync=%s",
		s.Port, s.Dir, s.cfg.MaxConnections, fsync)
	if s.cfg.SharedBuffers != "" {
		opts += " -c shared_buffers=" + s.cfg.SharedBuffers
	}
	wait := strconv.Itoa(max(1, int(s.cfg.StartTimeout.Seconds()*3/4)))
	logPath := filepath.Join(s.Dir, "postgres.log")
	cmd, err := pgCommand(cctx, "pg_ctl", "-D", s.dataDir(), "-l", logPath, "-w", "-t", wait, "-o", opts, "start")
	if err != nil {
		return err
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(logPath)
		return fmt.Errorf("pg_ctl start: %w: %s %s", err, out, tail(string(log), 2000))
	}
	s.running = true
	for {
		c, err := pgx.Connect(cctx, s.URL())
		if err == nil {
			_ = c.Close(cctx)
			return nil
		}
		if cctx.Err() != nil {
			return fmt.Errorf("private postgres on port %d does not accept connections: %w", s.Port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop stops the server at once (pg_ctl stop -m immediate: every
// connection is cut, no shutdown checkpoint — what a crash looks like to
// clients) and returns once it no longer runs. Stopping a stopped server
// does nothing.
func (s *Server) Stop(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd, err := pgCommand(cctx, "pg_ctl", "-D", s.dataDir(), "-m", "immediate", "-w", "-t", "50", "stop")
	if err != nil {
		return err
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl stop: %w: %s", err, out)
	}
	s.running = false
	return nil
}

// Remove stops the server for good and deletes its folder.
func (s *Server) Remove() {
	_ = s.Stop(context.Background())
	_ = os.RemoveAll(s.Dir)
}

// Installed returns nil when PostgreSQL's initdb can be found (on PATH or
// in /usr/lib/postgresql/<v>/bin), else an error wrapping ErrNotInstalled.
func Installed() error {
	_, err := pgBin("initdb")
	return err
}

// pgBin finds a PostgreSQL program: on PATH, else Debian's
// /usr/lib/postgresql/<v>/bin.
func pgBin(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/" + name); len(m) > 0 {
		return m[len(m)-1], nil
	}
	return "", fmt.Errorf("%s: %w", name, ErrNotInstalled)
}

// pgCommand runs a PostgreSQL program, as the postgres user when we are
// root.
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

// freePort is a loopback TCP port nobody listens on (now).
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// Signal sends sig to the server's postmaster, then to every process it
// started (its backends and background workers; Linux: read from /proc):
// SIGSTOP stalls the whole server — connections are still accepted by the
// kernel and never answered, running queries hang — and SIGCONT resumes
// it. Resume a stopped server before Stop.
func (s *Server) Signal(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, err := os.ReadFile(filepath.Join(s.dataDir(), "postmaster.pid"))
	if err != nil {
		return fmt.Errorf("postmaster.pid: %w", err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return fmt.Errorf("postmaster.pid: %w", err)
	}
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		return fmt.Errorf("signal the server's processes: needs /proc: %w", err)
	}
	// The postmaster first, so it forks no new backend, then its children,
	// listed again until no new one shows up.
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("signal %v to the postmaster %d: %w", sig, pid, err)
	}
	signalled := map[int]bool{}
	for round := 0; round < 5; round++ {
		fresh := 0
		for _, p := range children(pid) {
			if signalled[p] {
				continue
			}
			fresh++
			signalled[p] = true
			if err := syscall.Kill(p, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
				return fmt.Errorf("signal %v to %d: %w", sig, p, err)
			}
		}
		if fresh == 0 && round > 0 {
			break
		}
	}
	return nil
}

// children lists the processes whose parent is pid (from /proc).
func children(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so read after
		// its closing parenthesis.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, p)
		}
	}
	return out
}

// AllowConnections turns new connections to every database but postgres
// and the templates on (allow) or off; turning them off also ends the
// sessions of those databases, so every client meets the refusal (a
// server error, SQLSTATE 55000) at its next connection.
func (s *Server) AllowConnections(ctx context.Context, allow bool) error {
	c, err := pgx.Connect(ctx, s.URL())
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	rows, err := c.Query(ctx, `SELECT datname FROM pg_database WHERE datname NOT IN ('postgres', 'template0', 'template1')`)
	if err != nil {
		return err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, n := range names {
		if _, err := c.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %s ALLOW_CONNECTIONS %t`, pgx.Identifier{n}.Sanitize(), allow)); err != nil {
			return err
		}
	}
	if !allow {
		if _, err := c.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname NOT IN ('postgres', 'template0', 'template1') AND pid <> pg_backend_pid()`); err != nil {
			return err
		}
	}
	return nil
}
