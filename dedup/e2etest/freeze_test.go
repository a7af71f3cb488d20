package e2etest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/internal/redistest"
	"github.com/idemq/idemq/internal/testenv"
)

// Environment of the frozen consumer process (with envQueue, envPrefix and
// envMarker from kill_test.go).
const (
	envFreezeHelper = "IDEMQ_E2E_FREEZE_HELPER"
	envGo           = "IDEMQ_E2E_GO"       // file whose existence tells the handler to commit
	envOutcome      = "IDEMQ_E2E_OUTCOME"  // file the handler writes what it did to
	envCounters     = "IDEMQ_E2E_COUNTERS" // file the process writes its counters to on exit
	envFenceMode    = "IDEMQ_E2E_FENCE"    // how the handler checks it may commit: "ctx" or "lease"
)

// freezeLease is short, so a freeze past it takes a couple of seconds.
const freezeLease = 2 * time.Second

func freezeGuard(t *testing.T, rdb redis.UniversalClient, prefix string) (*redisstore.Store, *dedup.Guard) {
	st := redistest.Store(t, rdb, redisstore.Config{KeyPrefix: prefix + ":"})
	return st, mustGuard(st, dedup.Config{Lease: freezeLease, Logger: quiet()})
}

// TestHelperFrozenConsumerProcess is not a test: it is the consumer process
// TestConsumerFrozenPastItsLease starts (the test binary re-executed),
// freezes with SIGSTOP and thaws with SIGCONT. Its handler "works" until
// the go file appears, then checks it may still commit (its context, or
// the lease with the store) and applies the effect: a Redis INCR.
func TestHelperFrozenConsumerProcess(t *testing.T) {
	if os.Getenv(envFreezeHelper) != "1" {
		return // only a child process of TestConsumerFrozenPastItsLease does anything
	}
	opt, err := redis.ParseURL(testenv.RedisURL())
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	prefix := os.Getenv(envPrefix)
	_, guard := freezeGuard(t, rdb, prefix)
	outcome := func(s string) {
		if err := os.WriteFile(os.Getenv(envOutcome), []byte(s), 0o644); err != nil {
			t.Error(err)
		}
	}
	cancelled := func(ctx context.Context, err error) error {
		outcome(fmt.Sprintf("cancelled: %v (cause: %v)", err, context.Cause(ctx)))
		return err
	}
	c, err := newConsumer(idemq.ConsumerConfig{
		Queue: os.Getenv(envQueue), Group: "freeze", Prefetch: 1, Workers: 1, Logger: quiet(),
		Pipeline: idemq.Pipeline{Guard: guard},
	}, idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
		if err := os.WriteFile(os.Getenv(envMarker), []byte(d.MessageID), 0o644); err != nil {
			t.Error(err)
		}
		for { // "working" until told to commit
			if _, err := os.Stat(os.Getenv(envGo)); err == nil {
				break
			}
			if err := ctx.Err(); err != nil {
				return cancelled(ctx, err)
			}
			time.Sleep(5 * time.Millisecond)
		}
		// The last check before the effect, in the handler's own terms.
		if err := checkBeforeCommit(ctx, os.Getenv(envFenceMode)); err != nil {
			return cancelled(ctx, err)
		}
		if err := rdb.Incr(context.WithoutCancel(ctx), prefix+":effect").Err(); err != nil {
			return err
		}
		outcome("applied")
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	_ = c.Run(ctx)
	b, _ := json.Marshal(c.Counters().Snapshot())
	if err := os.WriteFile(os.Getenv(envCounters), b, 0o644); err != nil {
		t.Error(err)
	}
}

// checkBeforeCommit is what a handler does right before its effect:
// "ctx" checks its context, "lease" asks the store whether the dedup lease
// is still its own (dedup.LeaseFrom).
func checkBeforeCommit(ctx context.Context, mode string) error {
	switch mode {
	case "lease":
		l, ok := dedup.LeaseFrom(ctx)
		if !ok {
			return errors.New("no dedup lease in the handler's context")
		}
		return l.Check(ctx)
	default:
		return ctx.Err()
	}
}

// A consumer process frozen (SIGSTOP: a stop-the-world pause, a VM freeze)
// in the middle of its handler, past its dedup lease, while a duplicate of
// its message is delivered to another consumer, which claims the expired
// lease and applies the effect. Thawed (SIGCONT), the frozen handler must
// find its lease lost before it applies the effect a second time: its
// context is cancelled with idemq.ErrLeaseLost as the cause ("ctx"), and
// the fence — dedup.LeaseFrom(ctx).Check — refuses too ("lease"). The
// delivery it held is given back, never acked as processed, and settled as
// a duplicate. The effect (a Redis INCR) is applied exactly once.
func TestConsumerFrozenPastItsLease(t *testing.T) {
	testenv.RequireAMQP(t)
	for _, mode := range []string{"ctx", "lease"} {
		t.Run(mode, func(t *testing.T) { frozenPastLease(t, mode) })
	}
}

func frozenPastLease(t *testing.T, mode string) {
	rdb, prefix := testenv.Redis(t)
	queue := testenv.Queue(t, nil)
	dir := t.TempDir()
	marker, goFile := filepath.Join(dir, "in-handler"), filepath.Join(dir, "go")
	outcomeFile, countersFile := filepath.Join(dir, "outcome"), filepath.Join(dir, "counters")
	publishIDs(t, queue, "transfer-1")

	var out bytes.Buffer
	child := exec.Command(os.Args[0], "-test.run=^TestHelperFrozenConsumerProcess$", "-test.count=1")
	child.Env = testenv.Env(envFreezeHelper+"=1", envQueue+"="+queue, envPrefix+"="+prefix, envMarker+"="+marker,
		envGo+"="+goFile, envOutcome+"="+outcomeFile, envCounters+"="+countersFile, envFenceMode+"="+mode)
	child.Stdout, child.Stderr = &out, &out
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = child.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = child.Process.Signal(syscall.SIGCONT)
		_ = child.Process.Kill()
		<-exited
	})
	alive := func() {
		select {
		case <-exited:
			t.Fatalf("child exited early:\n%s", out.String())
		default:
		}
	}
	testenv.Eventually(t, wait, "the child consumer to be inside its handler", func() bool {
		alive()
		_, err := os.Stat(marker)
		return err == nil
	})

	store, guard := freezeGuard(t, rdb, prefix)
	key := dedup.Key("idemq", "freeze", "transfer-1")
	held, ok, err := store.Get(context.Background(), key)
	if err != nil || !ok || held.State != dedup.StateProcessing {
		t.Fatalf("record while the child runs: %+v ok=%v err=%v, want processing", held, ok, err)
	}
	if err := child.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozenAt := time.Now()
	testenv.Eventually(t, wait, "the frozen child's lease to expire in Redis", func() bool {
		_, ok, err := store.Get(context.Background(), key)
		return err == nil && !ok
	})

	// A duplicate of the frozen child's message (a publisher resend) goes
	// to another consumer, which finds the lease expired and applies it.
	publishIDs(t, queue, "transfer-1")
	effect := prefix + ":effect"
	c, _ := runConsumer(t, idemq.ConsumerConfig{
		Queue: queue, Group: "freeze", Prefetch: 1, Workers: 1, Pipeline: idemq.Pipeline{Guard: guard},
	}, idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
		return rdb.Incr(ctx, effect).Err()
	}))
	cnt := c.Counters()
	testenv.Eventually(t, wait, "the duplicate processed by the other consumer", func() bool {
		return cnt.Get(idemq.CountProcessed) == 1 && cnt.Get(idemq.CountAcked) == 1
	})
	if n, _ := rdb.Get(context.Background(), effect).Int(); n != 1 {
		t.Fatalf("effect applied %d times by the other consumer, want 1", n)
	}

	// Thaw the child, told to commit at once.
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := child.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	t.Logf("child frozen for %v (lease %v)", time.Since(frozenAt).Round(time.Millisecond), freezeLease)
	var outcome string
	testenv.Eventually(t, wait, "the thawed child's handler to finish", func() bool {
		alive()
		b, err := os.ReadFile(outcomeFile)
		outcome = string(b)
		return err == nil && len(b) > 0
	})
	t.Logf("thawed handler: %s", outcome)
	if n, _ := rdb.Get(context.Background(), effect).Int(); n != 1 {
		t.Fatalf("effect applied %d times, want 1: the handler frozen past its lease applied it again (%s)", n, outcome)
	}
	if !strings.HasPrefix(outcome, "cancelled") || !strings.Contains(outcome, idemq.ErrLeaseLost.Error()) {
		t.Fatalf("thawed handler: %q, want it stopped with %v", outcome, idemq.ErrLeaseLost)
	}

	// Stop the child (gracefully: its pending requeue is flushed) and read
	// its counters: the delivery it held was given back, not processed.
	if err := child.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(wait):
		t.Fatalf("child did not stop on SIGTERM:\n%s", out.String())
	}
	var childCnt map[string]int64
	b, err := os.ReadFile(countersFile)
	if err != nil {
		t.Fatalf("child counters: %v\n%s", err, out.String())
	}
	if err := json.Unmarshal(b, &childCnt); err != nil {
		t.Fatal(err)
	}
	t.Logf("child counters: %v", childCnt)
	if childCnt[idemq.CountLeasesLost] != 1 || childCnt[idemq.CountProcessed] != 0 || childCnt[idemq.CountRequeued] < 1 {
		t.Fatalf("child: leases_lost %d processed %d requeued %d, want 1, 0 and at least 1",
			childCnt[idemq.CountLeasesLost], childCnt[idemq.CountProcessed], childCnt[idemq.CountRequeued])
	}
	// Both copies end acked exactly once between the two consumers: the
	// given-back one as a duplicate.
	testenv.Eventually(t, wait, "both copies settled", func() bool {
		ready, _ := testenv.QueueCounts(t, queue)
		return ready == 0 && cnt.Get(idemq.CountAcked)+childCnt[idemq.CountAcked] == 2
	})
	if n, _ := rdb.Get(context.Background(), effect).Int(); n != 1 {
		t.Fatalf("effect applied %d times after the redelivery, want 1", n)
	}
	rec, ok, err := store.Get(context.Background(), key)
	if err != nil || !ok || rec.State != dedup.StateDone {
		t.Fatalf("record %+v ok=%v err=%v, want done", rec, ok, err)
	}
}
