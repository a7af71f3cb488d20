package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisCluster is a private Redis Cluster on loopback: Primaries primary
// nodes with one replica each, every node with appendonly (fsync every
// write) and a 2 s cluster-node-timeout, its data in a temporary folder.
type RedisCluster struct {
	t     testing.TB
	Nodes []*ClusterNode
}

// ClusterNode is one redis-server of a [RedisCluster].
type ClusterNode struct {
	Port, BusPort int
	Dir           string
	cmd           *exec.Cmd
}

// Addr is host:port.
func (n *ClusterNode) Addr() string { return "127.0.0.1:" + strconv.Itoa(n.Port) }

// StartRedisCluster starts a cluster of primaries primaries and as many
// replicas, creates it (redis-cli --cluster create) and waits until every
// node reports cluster_state:ok. The nodes are killed at cleanup.
func StartRedisCluster(t testing.TB, primaries int) *RedisCluster {
	t.Helper()
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			Unavailable(t, bin+" (binary)", "PATH", err)
		}
	}
	rc := &RedisCluster{t: t}
	root := t.TempDir()
	for i := 0; i < 2*primaries; i++ {
		n := &ClusterNode{Port: FreePort(t), BusPort: FreePort(t), Dir: filepath.Join(root, strconv.Itoa(i))}
		if err := os.MkdirAll(n.Dir, 0o755); err != nil {
			t.Fatal(err)
		}
		rc.Nodes = append(rc.Nodes, n)
		rc.start(n)
	}
	t.Cleanup(func() {
		for _, n := range rc.Nodes {
			rc.kill(n)
		}
	})
	args := []string{"--cluster", "create"}
	for _, n := range rc.Nodes {
		args = append(args, n.Addr())
	}
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	rc.WaitOK(60 * time.Second)
	rc.WaitReplicasInSync(60 * time.Second)
	return rc
}

// WaitReplicasInSync waits until every running replica has finished its
// sync with its primary (INFO replication: master_link_status:up). A
// replica that never synced does not stand for election when its primary
// dies.
func (rc *RedisCluster) WaitReplicasInSync(within time.Duration) {
	rc.t.Helper()
	Eventually(rc.t, within, "every Redis Cluster replica to be in sync", func() bool {
		replicas := 0
		for _, n := range rc.Nodes {
			if n.cmd == nil {
				continue
			}
			c := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1, DialTimeout: time.Second})
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			info, err := c.Info(ctx, "replication").Result()
			cancel()
			c.Close()
			if err != nil {
				return false
			}
			if strings.Contains(info, "role:slave") {
				replicas++
				if !strings.Contains(info, "master_link_status:up") {
					return false
				}
			}
		}
		return replicas == len(rc.Nodes)/2 // every replica up, none missing
	})
}

func (rc *RedisCluster) start(n *ClusterNode) {
	rc.t.Helper()
	n.cmd = exec.Command("redis-server",
		"--port", strconv.Itoa(n.Port), "--cluster-port", strconv.Itoa(n.BusPort), "--bind", "127.0.0.1",
		"--dir", n.Dir, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", "2000", "--appendonly", "yes", "--appendfsync", "always", "--repl-diskless-sync-delay", "0",
		"--save", "", "--daemonize", "no", "--logfile", filepath.Join(n.Dir, "redis.log"))
	if err := n.cmd.Start(); err != nil {
		rc.t.Fatalf("start redis-server: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	Eventually(rc.t, 15*time.Second, "cluster node "+n.Addr()+" to answer", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		return c.Ping(ctx).Err() == nil
	})
}

func (rc *RedisCluster) kill(n *ClusterNode) {
	if n.cmd != nil && n.cmd.Process != nil {
		_ = n.cmd.Process.Kill()
		_, _ = n.cmd.Process.Wait()
		n.cmd = nil
	}
}

// LogTail returns the last lines of every node's log, for a failure
// message.
func (rc *RedisCluster) LogTail(lines int) string {
	var b strings.Builder
	for _, n := range rc.Nodes {
		data, _ := os.ReadFile(filepath.Join(n.Dir, "redis.log"))
		ls := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(ls) > lines {
			ls = ls[len(ls)-lines:]
		}
		fmt.Fprintf(&b, "--- node %s:\n%s\n", n.Addr(), strings.Join(ls, "\n"))
	}
	return b.String()
}

// Kill kills node n with SIGKILL.
func (rc *RedisCluster) Kill(n *ClusterNode) { rc.kill(n) }

// Restart starts a killed node again on its port and folder (it rejoins
// the cluster from its nodes.conf).
func (rc *RedisCluster) Restart(n *ClusterNode) {
	rc.kill(n)
	rc.start(n)
}

// Addrs are the seed addresses of every node.
func (rc *RedisCluster) Addrs() []string {
	var out []string
	for _, n := range rc.Nodes {
		out = append(out, n.Addr())
	}
	return out
}

// Client returns a new cluster client (closed at cleanup).
func (rc *RedisCluster) Client() *redis.ClusterClient {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.Addrs(), DialTimeout: time.Second,
		ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second})
	rc.t.Cleanup(func() { c.Close() })
	return c
}

// info returns CLUSTER INFO of node n as fields.
func (rc *RedisCluster) info(n *ClusterNode) (map[string]string, error) {
	c := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	s, err := c.ClusterInfo(ctx).Result()
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			out[k] = v
		}
	}
	return out, nil
}

// WaitOK waits until every running node reports cluster_state:ok with all
// 16384 slots served.
func (rc *RedisCluster) WaitOK(within time.Duration) {
	rc.t.Helper()
	Eventually(rc.t, within, "the Redis Cluster to be ok on every node", func() bool {
		for _, n := range rc.Nodes {
			if n.cmd == nil {
				continue
			}
			f, err := rc.info(n)
			if err != nil || f["cluster_state"] != "ok" || f["cluster_slots_ok"] != "16384" {
				return false
			}
		}
		return true
	})
}

// PrimaryOf returns the node that serves key's slot as a primary now.
func (rc *RedisCluster) PrimaryOf(key string) *ClusterNode {
	rc.t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.Addrs(), DialTimeout: time.Second})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	slot, err := c.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		rc.t.Fatal(err)
	}
	slots, err := c.ClusterSlots(ctx).Result()
	if err != nil {
		rc.t.Fatal(err)
	}
	for _, s := range slots {
		if int64(s.Start) <= slot && slot <= int64(s.End) && len(s.Nodes) > 0 {
			for _, n := range rc.Nodes {
				if n.Addr() == s.Nodes[0].Addr {
					return n
				}
			}
		}
	}
	rc.t.Fatal(fmt.Sprintf("no primary serves slot %d of %q", slot, key))
	return nil
}
