package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// RabbitNodeConfig configures a private RabbitMQ node (see [PrivateRabbit]).
type RabbitNodeConfig struct {
	// ConsumerTimeout is the node's consumer_timeout. 0 leaves the
	// broker's default (30 min).
	ConsumerTimeout time.Duration
	// ChannelTickInterval is how often a channel checks its consumer
	// timeout (rabbit.channel_tick_interval, 60 s by default in 3.10 —
	// far too slow for a test). Default 250ms.
	ChannelTickInterval time.Duration
	// StartTimeout bounds the boot. Default 2 min (about 6-15 s on these
	// machines).
	StartTimeout time.Duration
}

// PrivateRabbit starts a RabbitMQ node of the test's own — its own node
// name, AMQP and distribution ports, data and config in a temporary folder —
// for a test that needs a broker configured differently from the shared one
// (which must never be reconfigured). It returns the node's AMQP URL; the
// node is stopped and its folder removed at cleanup. The Erlang cookie is
// the shared one, so the node name is random. A missing rabbitmq-server
// fails the test in CI and skips it elsewhere.
func PrivateRabbit(t testing.TB, cfg RabbitNodeConfig) string {
	t.Helper()
	return StartPrivateRabbit(t, cfg).URL
}

// PrivateNode is a private RabbitMQ node started by [StartPrivateRabbit].
type PrivateNode struct {
	URL    string // AMQP URL
	Name   string // Erlang node name, for rabbitmqctl -n
	LogDir string // the node's log folder (removed at cleanup)
}

// Ctl runs rabbitmqctl against this node only.
func (n *PrivateNode) Ctl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "rabbitmqctl", append([]string{"-q", "-n", n.Name}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Restart stops and starts the RabbitMQ application of this private node
// (never the shared one): every connection drops, durable queues and
// persistent messages survive. It returns once the node accepts AMQP
// connections again.
func (n *PrivateNode) Restart(t testing.TB) {
	t.Helper()
	if out, err := n.Ctl("stop_app"); err != nil {
		t.Fatalf("rabbitmqctl -n %s stop_app: %v\n%s", n.Name, err, out)
	}
	if out, err := n.Ctl("start_app"); err != nil {
		t.Fatalf("rabbitmqctl -n %s start_app: %v\n%s", n.Name, err, out)
	}
	Eventually(t, 2*time.Minute, "private node back", func() bool {
		conn, err := amqp.DialConfig(n.URL, amqp.Config{Dial: amqp.DefaultDial(time.Second)})
		if err != nil {
			return false
		}
		conn.Close()
		return true
	})
}

// StartPrivateRabbit is [PrivateRabbit] returning the node, so a fault
// test can restart it ([PrivateNode.Restart]) or query it.
func StartPrivateRabbit(t testing.TB, cfg RabbitNodeConfig) *PrivateNode {
	t.Helper()
	server, err := exec.LookPath("rabbitmq-server")
	if err != nil {
		Unavailable(t, "rabbitmq-server (for a private node)", "", err)
	}
	if cfg.ChannelTickInterval <= 0 {
		cfg.ChannelTickInterval = 250 * time.Millisecond
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 2 * time.Minute
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	node := "idemqt" + hex.EncodeToString(b[:]) + "@localhost"
	amqpPort, distPort := FreePort(t), FreePort(t)
	for distPort == amqpPort {
		distPort = FreePort(t)
	}

	// Not t.TempDir: its parents are private to this user, and the server
	// drops to the rabbitmq user.
	dir, err := os.MkdirTemp("", "idemq-rabbit-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// IDEMQ_KEEP_FAILED_NODE=1 keeps a failed test's node folder
		// (mnesia and logs) for a post-mortem.
		if t.Failed() && os.Getenv("IDEMQ_KEEP_FAILED_NODE") != "" {
			t.Logf("kept the private node's folder %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	for _, sub := range []string{"mnesia", "log"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	settings := []string{
		fmt.Sprintf("{channel_tick_interval, %d}", cfg.ChannelTickInterval.Milliseconds()),
		fmt.Sprintf("{tcp_listeners, [{\"127.0.0.1\", %d}]}", amqpPort),
	}
	if cfg.ConsumerTimeout > 0 {
		settings = append(settings, fmt.Sprintf("{consumer_timeout, %d}", cfg.ConsumerTimeout.Milliseconds()))
	}
	advanced := "[{rabbit, [" + strings.Join(settings, ", ") + "]}].\n"
	if err := os.WriteFile(filepath.Join(dir, "advanced.config"), []byte(advanced), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "enabled_plugins"), []byte("[].\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if err := chownTree(dir, "rabbitmq"); err != nil {
			t.Fatalf("private RabbitMQ node: %v", err)
		}
	}

	started := time.Now()
	cmd := exec.Command(server)
	cmd.Env = append(os.Environ(),
		"RABBITMQ_NODENAME="+node,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(amqpPort),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(distPort),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq"), // none: defaults
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(dir, "advanced.config"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
	)
	console, err := os.Create(filepath.Join(dir, "console.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = console, console
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start private RabbitMQ node: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); console.Close() }()
	t.Cleanup(func() { stopNode(t, node, cmd, exited) })

	url := fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", amqpPort)
	deadline := time.Now().Add(cfg.StartTimeout)
	for {
		conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(time.Second)})
		if err == nil {
			conn.Close()
			t.Logf("private RabbitMQ node %s up on %s after %v (log %s)", node, url, time.Since(started).Round(time.Millisecond), filepath.Join(dir, "log"))
			break
		}
		select {
		case werr := <-exited:
			exited <- werr
			out, _ := os.ReadFile(filepath.Join(dir, "console.log"))
			t.Fatalf("private RabbitMQ node %s exited at boot (%v):\n%s", node, werr, tail(string(out), 40))
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(filepath.Join(dir, "console.log"))
			t.Fatalf("private RabbitMQ node %s not up within %v: %v\n%s", node, cfg.StartTimeout, err, tail(string(out), 40))
		}
	}
	return &PrivateNode{URL: url, Name: node, LogDir: filepath.Join(dir, "log")}
}

// stopNode stops the node gracefully, then kills its process group if it
// lingers. Only the process this helper started is touched.
func stopNode(t testing.TB, node string, cmd *exec.Cmd, exited chan error) {
	start := time.Now()
	defer func() {
		t.Logf("private RabbitMQ node %s stopped in %v", node, time.Since(start).Round(time.Millisecond))
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "rabbitmqctl", "-q", "-n", node, "stop").CombinedOutput(); err != nil {
		t.Logf("rabbitmqctl stop %s: %v %s", node, err, out)
	}
	select {
	case <-exited:
		return
	case <-time.After(30 * time.Second):
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-exited
}

func chownTree(dir, username string) error {
	u, err := user.Lookup(username)
	if err != nil {
		return fmt.Errorf("user %s: %w", username, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
