package doctor

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

func redisSubject(cfg Config) string {
	if cfg.RedisAddr != "" {
		return cfg.RedisAddr
	}
	switch c := cfg.Redis.(type) {
	case *redis.Client:
		return "redis " + c.Options().Addr
	case *redis.ClusterClient:
		return "redis cluster " + strings.Join(c.Options().Addrs, ",")
	}
	return "redis"
}

func redisFindings(ctx context.Context, cfg Config) []Finding {
	subject := redisSubject(cfg)
	if err := cfg.Redis.Ping(ctx).Err(); err != nil {
		return []Finding{{Check: "redis.reach", Subject: subject, Status: Fail, Detail: err.Error(),
			Meaning: "the dedup guard cannot claim or complete: consumers pause", Fix: "check the Redis URL (--redis-url, IDEMQ_REDIS_URL) and that Redis runs"}}
	}
	var out []Finding
	if cc, ok := cfg.Redis.(*redis.ClusterClient); ok {
		out = append(out, clusterFindings(ctx, cc, subject)...)
		// Every node must be configured the same way, replicas included
		// (one becomes a primary on a failover). The nodes come from
		// CLUSTER NODES: the client's own slot map can lack replicas that
		// gossip has not announced to the node it asked.
		addrs, err := clusterNodeAddrs(ctx, cc)
		if err != nil {
			return append(out, Finding{Check: "redis.cluster", Subject: subject, Status: Fail, Detail: "CLUSTER NODES: " + err.Error()})
		}
		var mu sync.Mutex
		var wg sync.WaitGroup
		co := cc.Options()
		for _, addr := range addrs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := redis.NewClient(&redis.Options{Addr: addr, Username: co.Username, Password: co.Password,
					TLSConfig: co.TLSConfig, DialTimeout: co.DialTimeout, MaxRetries: -1})
				defer c.Close()
				fs := nodeFindings(ctx, cfg, c, "redis "+addr)
				mu.Lock()
				out = append(out, fs...)
				mu.Unlock()
			}()
		}
		wg.Wait()
		sort.SliceStable(out, func(i, j int) bool { return out[i].Subject < out[j].Subject })
		return out
	}
	return append(out, nodeFindings(ctx, cfg, cfg.Redis, subject)...)
}

// configGet reads one CONFIG GET value; ok is false when the server does
// not allow CONFIG (managed Redis services often rename or disable it).
func configGet(ctx context.Context, c redis.Cmdable, key string) (string, bool, error) {
	m, err := c.ConfigGet(ctx, key).Result()
	if err != nil {
		if strings.Contains(strings.ToLower(err.Error()), "unknown command") || strings.HasPrefix(err.Error(), "NOPERM") {
			return "", false, nil
		}
		return "", false, err
	}
	v, ok := m[key]
	return v, ok, nil
}

func nodeFindings(ctx context.Context, cfg Config, c redis.Cmdable, subject string) []Finding {
	var out []Finding
	notReadable := func(check, what string, err error) Finding {
		d := "not checked: CONFIG is not available to this user"
		if err != nil {
			d = "not checked: " + err.Error()
		}
		return Finding{Check: check, Subject: subject, Status: Warn, Detail: d,
			Meaning: "idemq cannot see " + what, Fix: "check it by hand (CONFIG GET), or let the doctor's user run CONFIG GET"}
	}

	// Eviction: a done record evicted is a message applied twice on its
	// next redelivery. Records carry a TTL (the window), so every policy
	// but noeviction may pick them.
	policy, ok, err := configGet(ctx, c, "maxmemory-policy")
	if !ok {
		out = append(out, notReadable("redis.maxmemory-policy", "whether Redis evicts dedup records", err))
	} else {
		maxmem, _, _ := configGet(ctx, c, "maxmemory")
		f := Finding{Check: "redis.maxmemory-policy", Subject: subject, Detail: fmt.Sprintf("maxmemory-policy %s, maxmemory %s", policy, orZero(maxmem))}
		switch {
		case policy == "noeviction":
			f.Status = Pass
		case maxmem == "0" || maxmem == "":
			f.Status = Warn
			f.Meaning = "nothing is evicted while maxmemory is 0, but the day a memory limit is set, Redis evicts done records under pressure and each evicted message is applied twice on its next redelivery"
			f.Fix = "CONFIG SET maxmemory-policy noeviction (and in redis.conf)"
		default:
			f.Status = Fail
			f.Meaning = "under memory pressure Redis evicts done records (they carry a TTL, so volatile-* policies pick them too): each evicted message is applied twice on its next redelivery, silently"
			f.Fix = "CONFIG SET maxmemory-policy noeviction (and in redis.conf): a full Redis then refuses writes, which idemq treats as an outage (the consumers pause) instead of forgetting"
		}
		out = append(out, f)
	}

	// Persistence: a restart without it forgets every done record.
	aof, ok1, err1 := configGet(ctx, c, "appendonly")
	save, ok2, err2 := configGet(ctx, c, "save")
	if !ok1 || !ok2 {
		out = append(out, notReadable("redis.persistence", "whether Redis keeps done records through a restart", firstErr(err1, err2)))
	} else {
		fsync, _, _ := configGet(ctx, c, "appendfsync")
		f := Finding{Check: "redis.persistence", Subject: subject}
		lossy := Warn
		if !cfg.RedisOnlyLine {
			lossy = Pass
		}
		switch {
		case aof == "yes" && fsync == "always":
			f.Status, f.Detail = Pass, "appendonly yes, appendfsync always"
		case aof == "yes":
			f.Status, f.Detail = lossy, "appendonly yes, appendfsync "+fsync
			f.Meaning = "a crash of the Redis server loses up to the last second of done records: those messages are applied twice if they are redelivered"
			f.Fix = "CONFIG SET appendfsync always, or keep the inbox (exact mode) as the last line"
			if f.Status == Pass {
				f.Detail += " (the inbox is the last line)"
				f.Meaning, f.Fix = "", ""
			}
		case cfg.RedisOnlyLine:
			f.Status = Fail
			f.Detail = fmt.Sprintf("appendonly %s, save %q", aof, save)
			f.Meaning = "a restart of Redis forgets the done records written since the last snapshot (all of them without one): those messages are applied twice if they are redelivered"
			f.Fix = "CONFIG SET appendonly yes and appendfsync always (and in redis.conf)"
		default:
			f.Status = Pass
			f.Detail = fmt.Sprintf("appendonly %s, save %q: a restart forgets the done records, and the inbox, the last line, absorbs the duplicates that then pass the guard", aof, save)
		}
		out = append(out, f)
	}

	// Replication: a replica far behind loses what it missed on failover.
	info, err := c.Info(ctx, "replication").Result()
	if err == nil {
		out = append(out, replicationFinding(subject, info))
	}
	return out
}

func orZero(s string) string {
	if s == "" {
		return "0"
	}
	return s
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// replicationFinding reads INFO replication of a primary: each replica's
// state and lag.
func replicationFinding(subject, info string) Finding {
	f := Finding{Check: "redis.replication", Subject: subject, Status: Pass}
	fields := map[string]string{}
	var slaves []string
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		fields[k] = v
		if strings.HasPrefix(k, "slave") && k[len("slave"):] != "" && isDigits(k[len("slave"):]) {
			slaves = append(slaves, v)
		}
	}
	if fields["role"] != "master" {
		f.Detail = "role " + fields["role"] + " (the client writes to the primary it is given)"
		return f
	}
	if len(slaves) == 0 {
		f.Detail = "primary without replicas"
		return f
	}
	var bad []string
	for _, s := range slaves {
		kv := map[string]string{}
		for _, p := range strings.Split(s, ",") {
			if k, v, ok := strings.Cut(p, "="); ok {
				kv[k] = v
			}
		}
		lag, _ := strconv.Atoi(kv["lag"])
		if kv["state"] != "online" || lag > 10 {
			bad = append(bad, fmt.Sprintf("%s:%s state %s lag %ss", kv["ip"], kv["port"], kv["state"], kv["lag"]))
		}
	}
	f.Detail = fmt.Sprintf("%d replica(s)", len(slaves))
	if len(bad) > 0 {
		f.Status = Warn
		f.Detail += ", not in sync: " + strings.Join(bad, "; ")
		f.Meaning = "a failover to a replica that is behind loses the done records it missed: those messages are applied twice if redelivered"
		f.Fix = "find why the replica lags (network, disk); replication is asynchronous, so keep the inbox as the last line where twice is not acceptable"
	}
	return f
}

func isDigits(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return s != ""
}

// clusterNodeAddrs lists the address of every node of the cluster that is
// not marked failed, from CLUSTER NODES.
func clusterNodeAddrs(ctx context.Context, cc *redis.ClusterClient) ([]string, error) {
	s, err := cc.ClusterNodes(ctx).Result()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || strings.Contains(f[2], "fail") || strings.Contains(f[2], "noaddr") || strings.Contains(f[2], "handshake") {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		if addr != "" && !strings.HasPrefix(addr, ":") {
			out = append(out, addr)
		}
	}
	sort.Strings(out)
	return out, nil
}

// clusterFindings reads CLUSTER INFO: the cluster must be ok and cover
// every slot.
func clusterFindings(ctx context.Context, cc *redis.ClusterClient, subject string) []Finding {
	info, err := cc.ClusterInfo(ctx).Result()
	if err != nil {
		return []Finding{{Check: "redis.cluster", Subject: subject, Status: Fail, Detail: err.Error(), Fix: "check the cluster (redis-cli --cluster check)"}}
	}
	fields := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	f := Finding{Check: "redis.cluster", Subject: subject, Status: Pass,
		Detail: fmt.Sprintf("cluster_state %s, %s of 16384 slots ok, %s known nodes", fields["cluster_state"], fields["cluster_slots_ok"], fields["cluster_known_nodes"])}
	if fields["cluster_state"] != "ok" || fields["cluster_slots_ok"] != "16384" {
		f.Status = Fail
		f.Meaning = "claims and completes on keys in the uncovered slots fail: their consumers pause"
		f.Fix = "redis-cli --cluster fix, and check the failed nodes"
	}
	return []Finding{f}
}
