package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterConfig says which half of a private cluster to start (see
// [StartCluster]).
type ClusterConfig struct {
	// Rabbit starts three RabbitMQ nodes joined in one cluster.
	Rabbit bool
	// Redis starts a Redis primary, two replicas and three Sentinels.
	Redis bool
	// StartTimeout bounds the start. Default 4 min (a RabbitMQ cluster
	// takes about a minute on a loaded 2-core machine).
	StartTimeout time.Duration
}

// Cluster is a private cluster of a test's own, run by scripts/cluster.sh
// (the script `make cluster` runs) on random ports with its data in a
// temporary folder. It never touches the shared servers.
type Cluster struct {
	t      testing.TB
	script string
	env    []string
	// AMQPURLs are the three nodes' AMQP URLs (Rabbit).
	AMQPURLs []string
	// Nodes are the three nodes' names (Rabbit).
	Nodes []string
	// Sentinels are the Sentinels' addresses, Master the monitored name
	// (Redis).
	Sentinels []string
	Master    string
}

// repoRoot is the folder of the module's go.mod (the tests of every package
// run somewhere below it).
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.HasPrefix(b, []byte("module github.com/idemq/idemq\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of github.com/idemq/idemq above the working folder")
		}
		dir = parent
	}
}

// clusterPort is a free port below the kernel's ephemeral range (32768 and
// up), where an outgoing connection could take it between now and the
// server's bind (a RabbitMQ node takes seconds to get there), and away from
// the shared servers' ports.
func clusterPort(t testing.TB, used map[int]bool) int {
	t.Helper()
	for i := 0; i < 1000; i++ {
		p := 20000 + mrand.IntN(12000)
		if used[p] || (p >= 25600 && p <= 25700) { // taken, or near the shared node's distribution port
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		l.Close()
		used[p] = true
		return p
	}
	t.Fatal("no free port for a private cluster")
	return 0
}

// StartCluster starts a private cluster for the test and stops it (kill
// -9, data thrown away) at cleanup. A missing rabbitmq-server or
// redis-server fails the test in CI and skips it elsewhere; a cluster that
// does not start fails it.
func StartCluster(t testing.TB, cfg ClusterConfig) *Cluster {
	t.Helper()
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 4 * time.Minute
	}
	var bins []string
	if cfg.Rabbit {
		bins = append(bins, "rabbitmq-server", "rabbitmqctl", "rabbitmq-queues")
	}
	if cfg.Redis {
		bins = append(bins, "redis-server", "redis-cli")
	}
	for _, b := range bins {
		if _, err := exec.LookPath(b); err != nil {
			Unavailable(t, b+" (for a private cluster)", "", err)
		}
	}
	if os.Geteuid() != 0 {
		Unavailable(t, "a private cluster (scripts/cluster.sh runs the servers as their own users: root needed)", "", fmt.Errorf("euid %d", os.Geteuid()))
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "idemq-cluster-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	name := "idemqt" + hex.EncodeToString(b[:]) + "n"
	used := map[int]bool{}
	ports := func() []int { return []int{clusterPort(t, used), clusterPort(t, used), clusterPort(t, used)} }
	join := func(ps []int) string {
		s := make([]string, len(ps))
		for i, p := range ps {
			s[i] = strconv.Itoa(p)
		}
		return strings.Join(s, " ")
	}
	c := &Cluster{t: t, script: filepath.Join(root, "scripts", "cluster.sh"), Master: "idemq"}
	amqp, redisPorts, sentinels := ports(), ports(), ports()
	c.env = append(os.Environ(),
		"IDEMQ_CLUSTER_DIR="+dir,
		"IDEMQ_CLUSTER_NAME="+name,
		"IDEMQ_CLUSTER_AMQP_PORTS="+join(amqp),
		"IDEMQ_CLUSTER_DIST_PORTS="+join(ports()),
		"IDEMQ_CLUSTER_MGMT_PORTS="+join(ports()),
		"IDEMQ_CLUSTER_REDIS_PORTS="+join(redisPorts),
		"IDEMQ_CLUSTER_SENTINEL_PORTS="+join(sentinels),
		"IDEMQ_CLUSTER_MGMT=0",
	)
	for i := 0; i < 3; i++ {
		c.AMQPURLs = append(c.AMQPURLs, fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", amqp[i]))
		c.Nodes = append(c.Nodes, fmt.Sprintf("%s%d@localhost", name, i+1))
		c.Sentinels = append(c.Sentinels, fmt.Sprintf("127.0.0.1:%d", sentinels[i]))
	}
	t.Cleanup(func() {
		start := time.Now()
		if out, err := c.run(2*time.Minute, "down-now"); err != nil {
			t.Logf("cluster down: %v\n%s", err, out)
		}
		// IDEMQ_KEEP_FAILED_NODE=1 keeps a failed test's cluster folder
		// (the nodes' mnesia and logs) for a post-mortem.
		if t.Failed() && os.Getenv("IDEMQ_KEEP_FAILED_NODE") != "" {
			t.Logf("kept the private cluster's folder %s", dir)
		} else {
			_ = os.RemoveAll(dir)
		}
		t.Logf("private cluster %s stopped in %v", name, time.Since(start).Round(time.Millisecond))
	})
	start := time.Now()
	var steps []string
	if cfg.Rabbit {
		steps = append(steps, "up-rabbit")
	}
	if cfg.Redis {
		steps = append(steps, "up-redis")
	}
	for _, s := range steps {
		if out, err := c.run(cfg.StartTimeout, s); err != nil {
			t.Fatalf("private cluster (scripts/cluster.sh %s) did not start: %v\n%s", s, err, tail(out, 40))
		}
	}
	t.Logf("private cluster %s up in %v", name, time.Since(start).Round(time.Millisecond))
	return c
}

func (c *Cluster) run(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{c.script}, args...)...)
	cmd.Env = c.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// Our own process group: a timeout kills the script's children too
	// (not the servers, which run in sessions of their own).
	err := cmd.Run()
	return out.String(), err
}

// Run runs scripts/cluster.sh with args on this cluster (for example
// "kill", "2" or "redis-failover"); its output is returned, and a failure
// fails the test.
func (c *Cluster) Run(args ...string) string {
	c.t.Helper()
	out, err := c.run(5*time.Minute, args...)
	if err != nil {
		c.t.Fatalf("scripts/cluster.sh %s: %v\n%s", strings.Join(args, " "), err, tail(out, 40))
	}
	return out
}

// Leader is the index (1..3) of the node leading quorum queue q.
func (c *Cluster) Leader(q string) int {
	c.t.Helper()
	out := strings.TrimSpace(c.Run("leader", q))
	lines := strings.Split(out, "\n")
	i, err := strconv.Atoi(strings.TrimSpace(lines[len(lines)-1]))
	if err != nil || i < 1 || i > 3 {
		c.t.Fatalf("scripts/cluster.sh leader %s: %q", q, out)
	}
	return i
}

// FailoverClient is a go-redis client that finds the primary through the
// cluster's Sentinels (Redis). Closed at cleanup.
func (c *Cluster) FailoverClient() *redis.Client {
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    c.Master,
		SentinelAddrs: c.Sentinels,
		DialTimeout:   time.Second,
		ReadTimeout:   2 * time.Second,
		WriteTimeout:  2 * time.Second,
	})
	c.t.Cleanup(func() { rdb.Close() })
	return rdb
}

// RedisPrimary is the address of the primary, as the Sentinels see it.
func (c *Cluster) RedisPrimary() string {
	c.t.Helper()
	out := strings.TrimSpace(c.Run("redis-primary"))
	lines := strings.Split(out, "\n")
	return "127.0.0.1:" + strings.TrimSpace(lines[len(lines)-1])
}
