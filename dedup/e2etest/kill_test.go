package e2etest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/internal/redistest"
	"github.com/idemq/idemq/internal/testenv"
)

// Environment of the helper consumer process.
const (
	envHelper = "IDEMQ_E2E_HELPER"
	envQueue  = "IDEMQ_E2E_QUEUE"
	envPrefix = "IDEMQ_E2E_PREFIX"
	envMarker = "IDEMQ_E2E_MARKER"
)

const killLease = 3 * time.Second

func killGuard(t *testing.T, rdb redis.UniversalClient, prefix string) (*redisstore.Store, *dedup.Guard) {
	st := redistest.Store(t, rdb, redisstore.Config{KeyPrefix: prefix + ":"})
	return st, mustGuard(st, dedup.Config{Lease: killLease, Logger: quiet()})
}

// TestHelperConsumerProcess is not a test: it is the consumer process that
// TestConsumerKilledMidHandler starts (the test binary re-executed) and
// kills. Its handler writes the marker file and then hangs, never applying
// the effect.
func TestHelperConsumerProcess(t *testing.T) {
	if os.Getenv(envHelper) != "1" {
		return // only a child process of TestConsumerKilledMidHandler does anything
	}
	opt, err := redis.ParseURL(testenv.RedisURL())
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	_, guard := killGuard(t, rdb, os.Getenv(envPrefix))
	c, err := newConsumer(idemq.ConsumerConfig{
		Queue: os.Getenv(envQueue), Group: "kill", Pipeline: idemq.Pipeline{Guard: guard},
	}, idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
		if err := os.WriteFile(os.Getenv(envMarker), []byte(d.MessageID), 0o644); err != nil {
			t.Error(err)
		}
		<-ctx.Done() // "working" until SIGKILL
		return ctx.Err()
	}))
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Run(context.Background())
}

// A consumer process killed with SIGKILL in the middle of its handler: the
// broker redelivers the message, the dead process's lease keeps it from
// running again until the lease expires, then another consumer processes
// it — exactly once (the effect is a Redis INCR).
func TestConsumerKilledMidHandler(t *testing.T) {
	testenv.RequireAMQP(t)
	rdb, prefix := testenv.Redis(t)
	queue := testenv.Queue(t, nil)
	marker := filepath.Join(t.TempDir(), "in-handler")
	publishIDs(t, queue, "transfer-1")

	var out bytes.Buffer
	child := exec.Command(os.Args[0], "-test.run=^TestHelperConsumerProcess$", "-test.count=1")
	child.Env = testenv.Env(envHelper+"=1", envQueue+"="+queue, envPrefix+"="+prefix, envMarker+"="+marker)
	child.Stdout, child.Stderr = &out, &out
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = child.Wait(); close(exited) }()
	t.Cleanup(func() { _ = child.Process.Kill(); <-exited })
	testenv.Eventually(t, wait, "the child consumer to be inside its handler", func() bool {
		select {
		case <-exited:
			t.Fatalf("child exited early:\n%s", out.String())
		default:
		}
		_, err := os.Stat(marker)
		return err == nil
	})

	store, guard := killGuard(t, rdb, prefix)
	key := dedup.Key("idemq", "kill", "transfer-1")
	held, ok, err := store.Get(context.Background(), key)
	if err != nil || !ok || held.State != dedup.StateProcessing {
		t.Fatalf("record while the child runs: %+v ok=%v err=%v, want processing", held, ok, err)
	}
	if err := child.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	<-exited

	effect := prefix + ":effect"
	var appliedAt time.Time
	c, _ := runConsumer(t, idemq.ConsumerConfig{
		Queue: queue, Group: "kill", Pipeline: idemq.Pipeline{Guard: guard},
	}, idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
		appliedAt = time.Now()
		return rdb.Incr(ctx, effect).Err()
	}))
	cnt := c.Counters()
	testenv.Eventually(t, wait, "the message processed by the second consumer", func() bool {
		return cnt.Get(idemq.CountAcked) == 1
	})
	if n, _ := rdb.Get(context.Background(), effect).Int(); n != 1 {
		t.Fatalf("effect applied %d times, want 1", n)
	}
	// Not before the dead owner's lease ran out (it may have been renewed
	// after we read it, so its real end is at or after held.ExpiresAt).
	if early := held.ExpiresAt.Sub(appliedAt); early > 100*time.Millisecond {
		t.Fatalf("processed %v before the dead consumer's lease expired", early)
	}
	t.Logf("redelivered and deferred %d time(s) while the dead lease lived", cnt.Get(idemq.CountInFlight))

	// A later resend of the same ID is a duplicate.
	publishIDs(t, queue, "transfer-1")
	testenv.Eventually(t, wait, "the resend acked", func() bool { return cnt.Get(idemq.CountAcked) == 2 })
	if n, _ := rdb.Get(context.Background(), effect).Int(); n != 1 || cnt.Get(idemq.CountDuplicates) != 1 {
		t.Fatalf("after a resend: effect %d duplicates %d, want 1 and 1", n, cnt.Get(idemq.CountDuplicates))
	}
}
