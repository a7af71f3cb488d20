package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/internal/testenv"
)

// A primary of a three-shard Redis Cluster killed (SIGKILL) while workers
// claim and complete: calls on its slots fail until its replica is
// promoted (cluster-node-timeout 2 s), then succeed again within seconds
// (the store has the client reload its slot map after a failed call); the
// other shards answer throughout. Afterwards every
// completed record is Done — except what the promoted replica had not
// received yet (replication is asynchronous): each such record must have
// been completed within the last second before the kill, the documented
// window in which a redelivered message runs twice. The counts are logged.
func TestClusterPrimaryKilled(t *testing.T) {
	rc := testenv.StartRedisCluster(t, 3)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("cluster logs:\n%s", rc.LogTail(30))
		}
	})
	c := rc.Client()
	store, err := redisstore.New(c, redisstore.Config{KeyPrefix: "failover:"})
	if err != nil {
		t.Fatal(err)
	}
	const workers = 8
	var (
		mu        sync.Mutex
		completed = map[string]time.Time{}
		errs      atomic.Int64
		stop      atomic.Bool
		killAt    atomic.Int64
		wg        sync.WaitGroup
	)
	key := func(w, i int) string { return dedup.Key("idemq", "failover", fmt.Sprintf("m-%d-%d", w, i)) }
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				k, token := key(w, i), fmt.Sprintf("w%d-%d", w, i)
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				cl, err := store.Claim(ctx, k, token, 10*time.Second)
				if err == nil && cl.Result == dedup.Acquired {
					err = store.Complete(ctx, k, token, time.Hour)
					if err == nil {
						mu.Lock()
						completed[k] = time.Now()
						mu.Unlock()
					}
				}
				cancel()
				if err != nil {
					errs.Add(1)
					time.Sleep(50 * time.Millisecond)
				}
			}
		}()
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(completed) }
	testenv.Eventually(t, 30*time.Second, "2000 records completed before the kill", func() bool { return count() >= 2000 })

	victim := rc.PrimaryOf(key(0, 0))
	killAt.Store(time.Now().UnixNano())
	rc.Kill(victim)
	// A Complete the victim ran just before it died may have had its reply
	// read after killAt: the window ends once the kill returned.
	killed := time.Now()
	before := count()
	testenv.Eventually(t, 60*time.Second, "a replica to take over the killed primary's slots", func() bool {
		return rc.PrimaryOf(key(0, 0)) != victim
	})
	rc.WaitOK(60 * time.Second)
	failover := time.Since(time.Unix(0, killAt.Load()))
	// The store follows the new slot map within seconds, not at go-redis'
	// next periodic reload (60 s).
	testenv.Eventually(t, 10*time.Second, "a call on the killed primary's slots to succeed", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := store.Claim(ctx, key(0, 0), "probe", time.Second)
		return err == nil
	})
	served := time.Since(time.Unix(0, killAt.Load()))
	errsAtFailover := errs.Load()
	// Calls succeed again on every shard: 1000 more completions.
	testenv.Eventually(t, 30*time.Second, "1000 more records completed after the failover", func() bool { return count() >= before+1000 })
	stop.Store(true)
	wg.Wait()

	kill := time.Unix(0, killAt.Load())
	lost, lostLate := 0, 0
	mu.Lock()
	defer mu.Unlock()
	ctx := context.Background()
	for k, at := range completed {
		cl, err := store.Claim(ctx, k, "check", 10*time.Second)
		for tries := 0; err != nil && tries < 50; tries++ { // the client may still learn the new slot map
			time.Sleep(100 * time.Millisecond)
			cl, err = store.Claim(ctx, k, "check", 10*time.Second)
		}
		if err != nil {
			t.Fatalf("claim %s after the failover: %v", k, err)
		}
		if cl.Result == dedup.Done {
			continue
		}
		lost++
		if at.Before(kill.Add(-time.Second)) || at.After(killed) {
			lostLate++
			t.Errorf("%s completed at kill%+v is %v after the failover: outside the replication window", k, at.Sub(kill), cl.Result)
		}
	}
	t.Logf("3 primaries + 3 replicas, %d workers: %d records completed (%d before the kill); primary %s killed, cluster ok again after %v, its slots served to the store after %v; %d calls failed meanwhile; %d completed records not Done afterwards (all within 1 s before the kill: %v)",
		workers, len(completed), before, victim.Addr(), failover.Round(time.Millisecond), served.Round(time.Millisecond), errsAtFailover, lost, lostLate == 0)
	if errsAtFailover == 0 {
		t.Errorf("no call failed while a primary was down: the kill did not reach the workers' keys")
	}
}
