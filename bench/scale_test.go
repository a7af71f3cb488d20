package bench

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/redistest"
	"github.com/idemq/idemq/sqldb/postgres"
)

// The scale run (`make bench-scale`, issue 20): TestScale pushes
// IDEMQ_SCALE_MESSAGES persistent messages (default 2000, what make test
// runs; make bench-scale: 1,000,000) through each consumer in turn, each
// on a queue pre-filled with all its messages (scaleFill) so that the
// consumer is measured, not the publisher:
//
//   - raw-ack-each (opt-in, IDEMQ_SCALE_CASES): raw amqp091-go, ack each
//     (the broker alone at that queue depth: what is the broker's own
//     decay);
//   - redis-dedup-default: the idemq consumer with the Redis dedup guard
//     at its default configuration (Pipeline.Guard, Workers unset);
//   - inbox-batch-50-purge: the batch inbox on PostgreSQL (batches of 50,
//     a one-row effect per message) with Inbox.RunPurger running, the
//     inbox window ScaleInboxWindow so that the purge has work to do
//     within the run.
//
// It records a mark every 1% of the messages (elapsed time and the
// process' CPU) and a sample every ScaleSampleEvery (consumer RSS and Go
// heap, Redis INFO used_memory, the inbox table's pg_total_relation_size
// and row count, the 1-minute load average), as "scale-…" lines written to
// IDEMQ_SCALE_OUT (default: only the test log's summary). bench/report
// turns them into the scale section of docs/BENCHMARKS.md and its charts.
//
// Bounded: each case fails after IDEMQ_SCALE_TIMEOUT (default 30m) and
// every case deletes its queue, Redis keys and database when it ends,
// passed or not. Names carry the process id: idemq.bench.scale.<case>.p<pid>,
// Redis prefix idemq-bench-scale-p<pid>, database idemq_bench_scale_p<pid>.
// IDEMQ_SCALE_CASES (comma-separated names, or "all") picks the cases;
// by default the two idemq ones, raw-ack-each being opt-in.

// ScaleInboxWindow is the inbox window of the scale run: rows older than
// this are purged (every ScaleInboxPurgeEvery), so the table's row count
// levels off at about a window's worth of messages (plus a purge
// interval's). Short enough that a million messages (about a minute and a
// half on a quiet machine) run well past it.
const (
	ScaleInboxWindow     = 15 * time.Second
	ScaleInboxPurgeEvery = 5 * time.Second
)

// ScaleSampleEvery is the resource sampling interval of the scale run.
const ScaleSampleEvery = 2 * time.Second

func envInt(tb testing.TB, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		tb.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// scaleOut is where the scale-… lines go: IDEMQ_SCALE_OUT, or a
// discarded writer.
type scaleOut struct {
	mu sync.Mutex
	w  *bufio.Writer
	f  *os.File
}

func openScaleOut(tb testing.TB) *scaleOut {
	path := os.Getenv("IDEMQ_SCALE_OUT")
	if path == "" {
		return &scaleOut{w: bufio.NewWriter(io.Discard)}
	}
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	return &scaleOut{w: bufio.NewWriter(f), f: f}
}

func (o *scaleOut) line(format string, args ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	fmt.Fprintf(o.w, format+"\n", args...)
	_ = o.w.Flush()
}

func (o *scaleOut) close() {
	if o.f != nil {
		_ = o.f.Close()
	}
}

// mark is the progress at a multiple of the mark step.
type mark struct {
	msgs int64
	t    time.Duration
	cpu  float64
}

// progress writes the marks of one case as they happen (a case that
// fails half-way keeps them): OnFinal calls it after each delivery; only
// every step-th delivery takes the lock.
type progress struct {
	out   *scaleOut
	name  string
	step  int64
	start time.Time
	cpu0  float64
	last  atomic.Int64
}

func (p *progress) onFinal(k int64) {
	if k%p.step != 0 {
		return
	}
	m := mark{msgs: k, t: time.Since(p.start), cpu: cpuSeconds() - p.cpu0}
	p.last.Store(k)
	p.out.line("scale-mark case=%s msgs=%d t=%.3f cpu=%.3f", p.name, m.msgs, m.t.Seconds(), m.cpu)
}

func (p *progress) done() int64 { return p.last.Load() }

// sampler records the resources of one case every ScaleSampleEvery until
// stopped.
type sampler struct {
	out  *scaleOut
	name string
	rdb  redis.UniversalClient
	pool atomic.Pointer[pgxpool.Pool] // nil: no inbox table (yet)
	p    *progress
}

func (s *sampler) sample(ctx context.Context) {
	t := time.Since(s.p.start).Seconds()
	fields := []string{
		fmt.Sprintf("case=%s", s.name), fmt.Sprintf("t=%.2f", t), fmt.Sprintf("msgs=%d", s.p.done()),
		fmt.Sprintf("rss=%d", rssBytes()), fmt.Sprintf("heap=%d", heapBytes()), fmt.Sprintf("load1=%s", load1()),
	}
	if v, err := redisUsedMemory(ctx, s.rdb); err == nil {
		fields = append(fields, fmt.Sprintf("redis-used=%d", v))
	}
	if pool := s.pool.Load(); pool != nil {
		var size, rows int64
		err := pool.QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass), (SELECT count(*) FROM `+pgx.Identifier{inbox.DefaultTable}.Sanitize()+`)`, inbox.DefaultTable).Scan(&size, &rows)
		if err == nil {
			fields = append(fields, fmt.Sprintf("inbox-bytes=%d", size), fmt.Sprintf("inbox-rows=%d", rows))
		}
	}
	s.out.line("scale-sample %s", strings.Join(fields, " "))
}

// run samples at once, every ScaleSampleEvery, and once more when stop is
// closed; it closes done when finished.
func (s *sampler) run(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	ctx := context.Background()
	tk := time.NewTicker(ScaleSampleEvery)
	defer tk.Stop()
	s.sample(ctx)
	for {
		select {
		case <-stop:
			s.sample(ctx)
			return
		case <-tk.C:
			s.sample(ctx)
		}
	}
}

func rssBytes() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

func heapBytes() int64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return int64(s[0].Value.Uint64())
}

// loadavg is the 1, 5 and 15-minute load averages, comma-separated.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "0,0,0"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "0,0,0"
	}
	return strings.Join(f[:3], ",")
}

func load1() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "0"
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "0"
}

func redisUsedMemory(ctx context.Context, c redis.UniversalClient) (int64, error) {
	info, err := c.InfoMap(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	v, ok := info["Memory"]["used_memory"]
	if !ok {
		return 0, fmt.Errorf("INFO memory: no used_memory")
	}
	return strconv.ParseInt(v, 10, 64)
}

// unlinkMatching deletes the keys matching match, 1000 at a time, and
// returns how many it deleted.
func unlinkMatching(ctx context.Context, c redis.UniversalClient, match string) (int, error) {
	iter := c.Scan(ctx, 0, match, 1000).Iterator()
	var batch []string
	total := 0
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		n, err := c.Unlink(ctx, batch...).Result()
		total += int(n)
		batch = batch[:0]
		return err
	}
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 1000 {
			if err := flush(); err != nil {
				return total, err
			}
		}
	}
	if err := iter.Err(); err != nil {
		return total, err
	}
	return total, flush()
}

// scaleCase is one consumer of the scale run: consume runs it over the
// pre-filled r.Queue with o (OnFinal and Timeout set) and returns when
// r.N deliveries are done.
type scaleCase struct {
	name    string
	consume func(t *testing.T, r *run, o consumerOpts, s *sampler)
}

func TestScale(t *testing.T) {
	n := envInt(t, "IDEMQ_SCALE_MESSAGES", 2000)
	timeout := 30 * time.Minute
	if v := os.Getenv("IDEMQ_SCALE_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("IDEMQ_SCALE_TIMEOUT=%q: want a positive duration", v)
		}
		timeout = d
	}
	// The raw reference is opt-in: on the shared 2-core machine a 1M fill
	// takes minutes, and the two idemq cases are what the run is for.
	want := map[string]bool{"redis-dedup-default": true, "inbox-batch-50-purge": true}
	if v := os.Getenv("IDEMQ_SCALE_CASES"); v == "all" {
		want = nil
	} else if v != "" {
		want = map[string]bool{}
		for _, c := range strings.Split(v, ",") {
			want[strings.TrimSpace(c)] = true
		}
	}
	out := openScaleOut(t)
	defer out.close()
	step := int64(max(n/100, 1))
	started := time.Now()
	out.line("scale-run messages=%d step=%d body=%d prefetch=%d sample-every=%s inbox-window=%s inbox-purge-every=%s started=%s load=%s",
		n, step, BodySize, Prefetch, ScaleSampleEvery, ScaleInboxWindow, ScaleInboxPurgeEvery, started.UTC().Format(time.RFC3339), loadavg())
	rdb := redisClient(t)
	prefix := fmt.Sprintf("idemq-bench-scale-p%d", os.Getpid())
	for _, c := range []scaleCase{
		{"raw-ack-each", func(t *testing.T, r *run, o consumerOpts, _ *sampler) { scaleRaw(t, r, o) }},
		{"redis-dedup-default", func(t *testing.T, r *run, o consumerOpts, _ *sampler) {
			st := redistest.Store(t, rdb, redisstore.Config{})
			guard, err := dedup.NewGuard(dedup.Config{Store: st, Prefix: prefix})
			if err != nil {
				t.Fatal(err)
			}
			o.Guard = guard
			checkOnce(t, r, idemqConsume(t, r, o, noop()))
		}},
		{"inbox-batch-50-purge", scaleInbox},
	} {
		if want != nil && !want[c.name] {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			queue := freshQueue(t, fmt.Sprintf("idemq.bench.scale.%s.p%d", c.name, os.Getpid()))
			// Registered after freshQueue's: runs before it, so the keys
			// go even when the case fails.
			match := "*" + prefix + ":*"
			t.Cleanup(func() {
				if _, err := unlinkMatching(context.Background(), rdb, match); err != nil {
					t.Errorf("cleanup of %s: %v", match, err)
				}
			})
			fillStart := time.Now()
			scaleFill(t, queue, n, fmt.Sprintf("scale-%s-%d", c.name, time.Now().UnixNano()), ScaleFillPublishers)
			fillS := time.Since(fillStart).Seconds()
			out.line("scale-case case=%s messages=%d fill-s=%.2f fill-rate=%.0f load=%s", c.name, n, fillS, float64(n)/fillS, loadavg())
			r := &run{Queue: queue, N: n, Lat: newLatencies(n)}
			p := &progress{out: out, name: c.name, step: step}
			s := &sampler{out: out, name: c.name, rdb: rdb, p: p}
			o := consumerOpts{Timeout: timeout, OnFinal: p.onFinal}
			// The previous case's garbage does not count against this one.
			runtime.GC()
			debug.FreeOSMemory()
			p.start, p.cpu0 = time.Now(), cpuSeconds()
			withSampler(s, func() { c.consume(t, r, o, s) })
			el, cpu := time.Since(p.start), cpuSeconds()-p.cpu0
			keys, err := unlinkMatching(context.Background(), rdb, match)
			if err != nil {
				t.Fatal(err)
			}
			out.line("scale-done case=%s msgs=%d t=%.3f cpu=%.3f rate=%.0f redis-keys=%d load=%s", c.name, n, el.Seconds(), cpu, float64(n)/el.Seconds(), keys, loadavg())
			t.Logf("%s: %d messages in %v (%.0f msgs/s, %.1f µs CPU per message), %d Redis keys removed",
				c.name, n, el.Round(time.Millisecond), float64(n)/el.Seconds(), cpu/float64(n)*1e6, keys)
			if c.name == "redis-dedup-default" && keys != n {
				t.Errorf("%d Redis keys of the run, want one per message (%d)", keys, n)
			}
		})
	}
	out.line("scale-end elapsed-s=%.1f load=%s", time.Since(started).Seconds(), loadavg())
}

// ScaleFillPublishers is how many channels pre-fill the scale run's queue
// at once: one publisher got 1.3–3k msgs/s on the loaded shared machine,
// minutes per million.
const ScaleFillPublishers = 4

// scaleFill publishes n persistent messages with unique IDs
// "<prefix>-<k>" on pubs channels at once (each its own range of k), each
// with async confirms and a window of 1000.
func scaleFill(t *testing.T, queue string, n int, prefix string, pubs int) {
	conn := dial(t)
	defer conn.Close()
	body := make([]byte, BodySize)
	_, _ = rand.Read(body)
	ctx, cancel := context.WithTimeout(context.Background(), max(10*time.Minute, time.Duration(n)*time.Millisecond))
	defer cancel()
	errs := make(chan error, pubs)
	for p := 0; p < pubs; p++ {
		lo, hi := n*p/pubs, n*(p+1)/pubs
		go func() { errs <- publishRange(ctx, conn, queue, prefix, body, lo, hi) }()
	}
	for p := 0; p < pubs; p++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

func publishRange(ctx context.Context, conn *amqp.Connection, queue, prefix string, body []byte, lo, hi int) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	window := make([]*amqp.DeferredConfirmation, 0, 1000)
	wait := func() error {
		for _, dc := range window {
			if ok, err := dc.WaitContext(ctx); err != nil || !ok {
				return fmt.Errorf("confirm: ok=%v err=%v", ok, err)
			}
		}
		window = window[:0]
		return nil
	}
	for k := lo; k < hi; k++ {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, MessageId: fmt.Sprintf("%s-%d", prefix, k+1), Body: body,
		})
		if err != nil {
			return err
		}
		if window = append(window, dc); len(window) == cap(window) {
			if err := wait(); err != nil {
				return err
			}
		}
	}
	return wait()
}

// withSampler runs fn with s sampling in the background.
func withSampler(s *sampler, fn func()) {
	stop, done := make(chan struct{}), make(chan struct{})
	go s.run(stop, done)
	defer func() { close(stop); <-done }()
	fn()
}

// scaleRaw is rawConsume (ack each) with the scale run's marks and
// timeout.
func scaleRaw(t *testing.T, r *run, o consumerOpts) {
	conn := dial(t)
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(Prefetch, 0, false); err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume(r.Queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.After(o.Timeout)
	for i := 1; i <= r.N; i++ {
		select {
		case d := <-ds:
			if err := d.Ack(false); err != nil {
				t.Fatal(err)
			}
		case <-deadline:
			t.Fatalf("timed out after %v: %d of %d deliveries done", o.Timeout, i-1, r.N)
		}
		o.OnFinal(int64(i))
	}
}

// scaleInbox is the batch inbox (batches of 50, as BenchmarkInbox's
// batch-50 case) with the purger running.
func scaleInbox(t *testing.T, r *run, o consumerOpts, s *sampler) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool := benchDB(t, "idemq_bench_scale")
	if _, err := pool.Exec(ctx, `CREATE TABLE effect (message_id text NOT NULL, amount bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(ctx, postgres.Pgx(pool), inbox.Config{Window: ScaleInboxWindow, PurgeInterval: ScaleInboxPurgeEvery})
	if err != nil {
		t.Fatal(err)
	}
	purged := make(chan error, 1)
	go func() { purged <- ib.RunPurger(ctx) }()
	defer func() {
		cancel()
		if err := <-purged; err != nil {
			t.Error(err)
		}
	}()
	effect := func(ctx context.Context, tx pgx.Tx, d *idemq.Delivery) error {
		_, err := tx.Exec(ctx, `INSERT INTO effect (message_id, amount) VALUES ($1, 1)`, d.MessageID)
		return err
	}
	const batch = 50
	o.Workers = 2 * batch
	h := ib.Batch(effect, inbox.BatchConfig{Size: batch, MaxWait: 5 * time.Millisecond, Concurrency: o.Workers})
	s.pool.Store(pool)
	checkOnce(t, r, idemqConsume(t, r, o, untimed(h)))
	var effects int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM effect`).Scan(&effects); err != nil {
		t.Fatal(err)
	}
	if effects != int64(r.N) {
		t.Fatalf("%d effect rows, want %d", effects, r.N)
	}
}
