package bench

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/dedup/sqlstore"
	"github.com/idemq/idemq/internal/redistest"
	"github.com/idemq/idemq/sqldb/postgres"
)

func noop() idemq.Handler {
	return idemq.HandlerFunc(func(context.Context, *idemq.Delivery) error { return nil })
}

func pgURL() string {
	if u := os.Getenv("IDEMQ_POSTGRES_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
}

// benchDB creates a fresh PostgreSQL database for one case and returns a
// pool on it.
func benchDB(b testing.TB, name string) *pgxpool.Pool {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(createDB(b, name))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 40
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}

// createDB creates a fresh PostgreSQL database, dropped at cleanup, and
// returns its connection URL.
func createDB(b testing.TB, name string) string {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgURL())
	if err != nil {
		b.Fatalf("PostgreSQL not reachable (%v): run `make services`", err)
	}
	// The pid keeps two benchmark runs on one server (a smoke run beside a
	// full one) out of each other's databases.
	name = fmt.Sprintf("%s_p%d", name, os.Getpid())
	ident := pgx.Identifier{name}.Sanitize()
	_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)")
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		b.Fatal(err)
	}
	conn.Close(ctx)
	// Registered first, so it runs after the cleanups that close pools.
	b.Cleanup(func() {
		if c, err := pgx.Connect(ctx, pgURL()); err == nil {
			_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)")
			c.Close(ctx)
		}
	})
	u, err := url.Parse(pgURL())
	if err != nil {
		b.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

// DedupWorkers is the handler concurrency of the SQL cases (dedup store,
// inbox): each message costs store round trips that are not grouped, so
// throughput comes from having many in flight. The Redis and memory cases
// run at the consumer's default (the guard's suggestion).
const DedupWorkers = 32

// guardConsume runs the dedup guard on store with a no-op handler and
// checks the outcome: every delivery acked, the duplicates suppressed and
// every other message processed once.
func guardConsume(b *testing.B, r *run, o consumerOpts, store dedup.Store) *idemq.Counters {
	return guardConsumeBatch(b, r, o, store, 0)
}

// guardConsumeBatch is guardConsume with the guard's MaxBatch (0: the
// default; 1: every store call its own round trip). The guard is the
// pipeline's Guard, so o.Workers 0 is the consumer's default for it, as
// in the README's snippet.
func guardConsumeBatch(b *testing.B, r *run, o consumerOpts, store dedup.Store, maxBatch int) *idemq.Counters {
	prefix := fmt.Sprintf("idemq-bench-%d", time.Now().UnixNano())
	guard, err := dedup.NewGuard(dedup.Config{
		Store: store, Prefix: prefix, Lease: 30 * time.Second, Window: time.Hour, MaxBatch: maxBatch, BatchesInFlight: o.BatchesInFlight,
		// A duplicate that overtakes its original (only in tiny smoke runs,
		// where the gap is one message) comes back soon, not after the lease.
		InFlightRetryAfter: 5 * time.Millisecond,
	})
	if err != nil {
		b.Fatal(err)
	}
	o.Guard = guard
	rec := idemqConsume(b, r, o, noop())
	checkOnce(b, r, rec)
	return rec
}

// checkOnce fails the case unless every new message was processed once and
// every repetition suppressed, with nothing rejected.
func checkOnce(b testing.TB, r *run, rec *idemq.Counters) {
	b.Helper()
	if got := rec.Get(idemq.CountRejected); got != 0 {
		b.Fatalf("%d deliveries rejected", got)
	}
	if got, want := rec.Get(idemq.CountDuplicates), int64(r.Dups); got != want {
		b.Fatalf("%d duplicates suppressed, want %d", got, want)
	}
	if got, want := rec.Get(idemq.CountProcessed), int64(r.N-r.Dups); got != want {
		b.Fatalf("%d processed, want %d", got, want)
	}
}

// dedupCases are the stores of BenchmarkDedup; each runs on unique IDs and
// on 20% duplicates.
func dedupCases() []struct {
	name     string
	opts     consumerOpts
	maxBatch int
	open     func(b *testing.B) dedup.Store
} {
	redis := func(auto bool) func(b *testing.B) dedup.Store {
		return func(b *testing.B) dedup.Store {
			return redistest.Store(b, redisClient(b), redisstore.Config{AutoPipeline: auto})
		}
	}
	return []struct {
		name     string
		opts     consumerOpts
		maxBatch int
		open     func(b *testing.B) dedup.Store
	}{
		{"idemq-dedup-memory", consumerOpts{}, 0, func(*testing.B) dedup.Store { return dedup.NewMemory(dedup.MemoryConfig{}) }},
		{"idemq-dedup-redis", consumerOpts{}, 0, redis(false)},
		// Every claim and complete its own round trip (the guard's
		// grouping off), through go-redis' autopipeliner.
		{"idemq-dedup-redis-unbatched-autopipeline", consumerOpts{Workers: 32}, 1, redis(true)},
	}
}

// recipeConsume is the seeds' recipe, what blog posts copy: a plain
// amqp091-go consumer (one goroutine, prefetch Prefetch) that does
// SET id NX EX 24h for each delivery, runs the handler when the SET took
// and acks each delivery. No lease: a crash between the SET and the effect
// loses the message, a failing handler leaves its key behind. It is the
// baseline of what idemq's guard costs against what people write.
func recipeConsume(b *testing.B, r *run) {
	rdb := redisClient(b)
	prefix := fmt.Sprintf("recipe-bench-%d:", time.Now().UnixNano())
	conn := dial(b)
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := ch.Qos(Prefetch, 0, false); err != nil {
		b.Fatal(err)
	}
	ds, err := ch.Consume(r.Queue, "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	processed := 0
	for i := 0; i < r.N; i++ {
		d := <-ds
		first, err := rdb.SetNX(ctx, prefix+d.MessageId, 1, 24*time.Hour).Result()
		if err != nil {
			b.Fatal(err)
		}
		if first {
			processed++ // the handler
		}
		if err := d.Ack(false); err != nil {
			b.Fatal(err)
		}
	}
	if want := r.N - r.Dups; processed != want {
		b.Fatalf("%d processed, want %d", processed, want)
	}
}

func BenchmarkDedup(b *testing.B) {
	consumeCase(b, "recipe-setnx-ack", 0, recipeConsume)
	consumeCase(b, "recipe-setnx-ack-dup20", DupEvery, recipeConsume)
	for _, dups := range []int{0, DupEvery} {
		for _, c := range dedupCases() {
			name := c.name
			if dups > 0 {
				name += "-dup20"
			}
			consumeCase(b, name, dups, func(b *testing.B, r *run) { guardConsumeBatch(b, r, c.opts, c.open(b), c.maxBatch) })
		}
	}
	consumeCase(b, "idemq-dedup-postgres", 0, func(b *testing.B, r *run) {
		pool := benchDB(b, "idemq_bench_dedup")
		st, err := sqlstore.New(context.Background(), postgres.Pgx(pool), sqlstore.Config{})
		if err != nil {
			b.Fatal(err)
		}
		defer st.Close()
		guardConsume(b, r, consumerOpts{Workers: DedupWorkers}, st)
	})
}

// twoRoundTrips hides a store's dedup.MixedBatchStore: the guard groups
// claims and completes in batches of their own.
type twoRoundTrips struct{ dedup.BatchStore }

// BenchmarkRedisTuning varies the consumer around the Redis store (issue
// target: ≥ 1.0× raw ack-each): handler concurrency (the more workers, the
// more claims share a round trip), the prefetch window, and for reference
// the store without the guard's grouping.
func BenchmarkRedisTuning(b *testing.B) {
	for _, c := range []struct {
		name     string
		auto     bool
		maxBatch int
		o        consumerOpts
	}{
		{"redis-w16", false, 0, consumerOpts{Workers: 16}},
		{"redis-w32", false, 0, consumerOpts{Workers: 32}},
		{"redis-w64", false, 0, consumerOpts{Workers: 64}},
		{"redis-w128", false, 0, consumerOpts{Workers: 128}},
		{"redis-w64-prefetch500", false, 0, consumerOpts{Workers: 64, Prefetch: 500}},
		{"redis-w128-prefetch500", false, 0, consumerOpts{Workers: 128, Prefetch: 500}},
		{"redis-w256-prefetch1000", false, 0, consumerOpts{Workers: 256, Prefetch: 1000}},
		{"redis-two-round-trips", false, 0, consumerOpts{}},
		{"redis-2-batches-in-flight", false, 0, consumerOpts{BatchesInFlight: 2}},
		{"redis-w128-2-batches-in-flight", false, 0, consumerOpts{Workers: 128, BatchesInFlight: 2}},
		{"redis-unbatched-w64", false, 1, consumerOpts{Workers: 64}},
		{"redis-unbatched-autopipeline-w64", true, 1, consumerOpts{Workers: 64}},
	} {
		consumeCase(b, c.name, 0, func(b *testing.B, r *run) {
			var st dedup.Store = redistest.Store(b, redisClient(b), redisstore.Config{AutoPipeline: c.auto})
			if c.name == "redis-two-round-trips" {
				// Claims and completes grouped apart, as before the
				// store's mixed batches: two round trips per message.
				st = twoRoundTrips{st.(dedup.BatchStore)}
			}
			guardConsumeBatch(b, r, c.o, st, c.maxBatch)
		})
	}
}

// BenchmarkSideBySide runs the raw baselines, the no-dedup consumer and the
// Redis dedup store at the README's defaults one after the other (the
// rueidis backend of issue 20 ran here too: branch h-rueidis-exp). Run it
// with -count=1 several times (make bench-side) so that each repetition
// measures every case within a minute or two: on a shared 2-core machine
// the load moves between benchmark groups, and -count=N repeats each case
// N times before the next one.
func BenchmarkSideBySide(b *testing.B) {
	consumeCase(b, "raw-ack-each", 0, func(b *testing.B, r *run) { rawConsume(b, r.Queue, r.N, 1) })
	consumeCase(b, "raw-multiple-ack-50", 0, func(b *testing.B, r *run) { rawConsume(b, r.Queue, r.N, 50) })
	consumeCase(b, "idemq-noop", 0, func(b *testing.B, r *run) { idemqConsume(b, r, consumerOpts{}, noop()) })
	for _, c := range dedupCases() {
		if c.name == "idemq-dedup-redis" {
			consumeCase(b, c.name, 0, func(b *testing.B, r *run) { guardConsumeBatch(b, r, c.opts, c.open(b), c.maxBatch) })
		}
	}
}
