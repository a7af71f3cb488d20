package redisstore_test

import (
	"os"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/dedup/storetest"
	"github.com/idemq/idemq/internal/redistest"
	"github.com/idemq/idemq/internal/testenv"
)

// The store's concurrent history through kill -9 and restarts of its
// Redis (calls issued meanwhile fail, or wait in go-redis' dial retries
// and are answered after the restart). With appendonly and appendfsync always the history stays
// linearizable: a call the server answered was on disk, and a call that
// failed may or may not have taken effect (the model allows both). Without
// persistence it is not, by design: the restart forgets what it had
// answered (a claim after it is acquired where the record was done); the
// check shows exactly that, and docs/GUARANTEES.md says what it means.
func TestLinearizableThroughRedisRestarts(t *testing.T) {
	for _, tc := range []struct {
		name    string
		persist bool
	}{{"appendfsync-always", true}, {"no-persistence", false}} {
		t.Run(tc.name, func(t *testing.T) {
			rs := testenv.StartPrivateRedis(t, tc.persist)
			c := rs.Client()
			defer c.Close()
			st := redistest.Store(t, c, redisstore.Config{})
			done := make(chan storetest.LinResult, 1)
			until := make(chan struct{})
			// 4 clients, 2 ms apart, 40 calls per set of 3 fresh keys, on
			// until both restarts have run and 300 ms more: every restart
			// lands among the calls, and keys are visited across it.
			go func() {
				done <- storetest.CheckLinearizable(t, st, "redis-restarts-"+tc.name,
					storetest.LinParams{Ops: 40, Pace: 2 * time.Millisecond, Until: until})
			}()
			restarts := 0
			for range 2 {
				time.Sleep(300 * time.Millisecond)
				rs.Kill() // SIGKILL
				time.Sleep(150 * time.Millisecond)
				rs.Start() // on the same folder (its AOF, if any)
				restarts++
			}
			time.Sleep(300 * time.Millisecond)
			close(until)
			res := <-done
			t.Logf("%d calls on %d keys, %d failed, %d kill -9 + restart: verdict %s %s", res.Ops, res.Keys, res.Errors, restarts, res.Verdict, res.Visualized)
			switch {
			case tc.persist && !res.Linearizable:
				t.Fatalf("appendfsync always: verdict %s, want Ok; see %s", res.Verdict, res.Visualized)
			case !tc.persist && res.Verdict != "Illegal":
				t.Fatalf("without persistence: verdict %s, want Illegal (the restart forgets done records)", res.Verdict)
			}
			if res.Visualized != "" && !tc.persist {
				_ = os.Remove(res.Visualized) // the expected failure: nothing to look at
			}
		})
	}
}
