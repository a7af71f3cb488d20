package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/deadletter"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/internal/console"
	"github.com/idemq/idemq/internal/redistest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/sqldb/postgres"
	"github.com/jackc/pgx/v5/pgxpool"
)

func keyAdmin(t *testing.T, client redis.UniversalClient) dedup.KeyAdmin {
	t.Helper()
	return redistest.Store(t, client, redisstore.Config{})
}

var groupRowRE = regexp.MustCompile(`(?s)<tr class="group" data-group="([0-9a-f]+)">\s*<td class="n count">(\d+)`)

// groupsOf parses the groups table: key -> count.
func groupsOf(body string) map[string]int {
	out := map[string]int{}
	for _, m := range groupRowRE.FindAllStringSubmatch(body, -1) {
		var n int
		fmt.Sscan(m[2], &n)
		out[m[1]] = n
	}
	return out
}

// TestDeadLetterPages against the broker: the overview's depth, the groups
// with their counts (duplicates once), a message's detail (JSON body
// pretty-printed, binary as hex), the confirmation's count, a group replay
// to the work queue only, archive and purge.
func TestDeadLetterPages(t *testing.T) {
	testenv.RequireAMQP(t)
	p := declare(t)
	seed(t, p, 3, "order %d not found", "gateway timeout after %dms")
	testenv.Publish(t, "", p.DLQ, amqp.Publishing{MessageId: "bin-1", Body: []byte{0xff, 0x00, 0x01},
		Headers: amqp.Table{idemq.HeaderReason: idemq.ReasonPermanent, idemq.HeaderQueue: p.Queue, idemq.HeaderError: "cannot decode"}})
	testenv.Eventually(t, wait, "9 dead letters", func() bool { return depth(t, p.DLQ) == 9 })
	e := newEnv(t, console.Config{Queues: []console.Queue{console.QueueOf(p.Queue)}})

	code, body := e.get("/")
	if code != http.StatusOK || !strings.Contains(body, `<td class="n depth">9</td>`) {
		t.Fatalf("overview %d:\n%s", code, body)
	}
	code, body = e.get("/dlq?q=" + url.QueryEscape(p.DLQ))
	gs := groupsOf(body)
	if code != http.StatusOK || len(gs) != 3 || !strings.Contains(body, "order &lt;n&gt; not found") || !strings.Contains(body, `<span id="distinct">7</span>`) {
		t.Fatalf("dlq page %d, groups %v:\n%s", code, gs, body)
	}
	counts := []int{}
	for _, n := range gs {
		counts = append(counts, n)
	}
	sort.Ints(counts)
	if fmt.Sprint(counts) != "[1 3 3]" {
		t.Fatalf("group counts %v", counts)
	}
	if code, _ := e.get("/dlq?q=not-ours"); code != http.StatusNotFound {
		t.Fatalf("another queue: %d", code)
	}

	_, body = e.get("/dlq/message?q=" + url.QueryEscape(p.DLQ) + "&id=c0-1")
	for _, want := range []string{"order 1001 not found", "max-attempts", "&#34;cause&#34;: 0,", "x-idemq-attempts", "not used by a replay", "orders.fanout"} {
		if !strings.Contains(body, want) {
			t.Fatalf("detail lacks %q:\n%s", want, body)
		}
	}
	_, body = e.get("/dlq/message?q=" + url.QueryEscape(p.DLQ) + "&id=bin-1")
	if !strings.Contains(body, "00000000  ff 00 01") || !strings.Contains(body, "hex") {
		t.Fatalf("binary detail:\n%s", body)
	}
	if code, _ := e.get("/dlq/message?q=" + url.QueryEscape(p.DLQ) + "&id=nope"); code != http.StatusNotFound {
		t.Fatalf("missing message: %d", code)
	}

	// Replay the "order not found" group: 3, its duplicate dropped.
	var key string
	for k, n := range gs {
		if n == 3 && key == "" {
			_, b := e.get("/dlq/confirm?q=" + url.QueryEscape(p.DLQ) + "&action=replay&group=" + k)
			if strings.Contains(b, "order &lt;n&gt; not found") {
				key = k
				if !strings.Contains(b, `<strong id="count">3</strong>`) || !strings.Contains(b, "1 duplicate copy") || !strings.Contains(b, "back to the work queue <strong>"+p.Queue) {
					t.Fatalf("confirmation:\n%s", b)
				}
			}
		}
	}
	if key == "" {
		t.Fatal("no order-not-found group")
	}
	tok := e.csrf("/dlq/confirm?q=" + url.QueryEscape(p.DLQ) + "&action=replay&group=" + key)
	code, _, h := e.post("/dlq/act", url.Values{"csrf": {tok}, "q": {p.DLQ}, "action": {"replay"}, "group": {key}, "expect": {"3"}})
	if code != http.StatusSeeOther {
		t.Fatalf("act: %d", code)
	}
	job := e.waitJob(h.Get("Location"))
	if !strings.Contains(job, "replayed 3 to work queue "+p.Queue+", duplicates dropped 1, failed 0") {
		t.Fatalf("job page:\n%s", job)
	}
	var ids []string
	for _, d := range testenv.Drain(t, p.Queue) {
		ids = append(ids, d.MessageId)
	}
	sort.Strings(ids)
	if fmt.Sprint(ids) != "[c0-0 c0-1 c0-2]" || depth(t, p.DLQ) != 5 {
		t.Fatalf("replayed %v, %d left", ids, depth(t, p.DLQ))
	}
	if !strings.Contains(e.logs.String(), "action=replay") {
		t.Fatalf("replay not logged:\n%s", e.logs.String())
	}

	// Archive one message, then purge the rest (the count is confirmed).
	tok = e.csrf("/dlq/confirm?q=" + url.QueryEscape(p.DLQ) + "&action=archive&id=bin-1")
	_, _, h = e.post("/dlq/act", url.Values{"csrf": {tok}, "q": {p.DLQ}, "action": {"archive"}, "id": {"bin-1"}, "expect": {"1"}})
	if job := e.waitJob(h.Get("Location")); !strings.Contains(job, "archived 1 dead letter(s)") {
		t.Fatalf("archive job:\n%s", job)
	}
	if n := depth(t, deadletter.ArchiveName(p.DLQ)); n != 1 {
		t.Fatalf("archive holds %d", n)
	}
	_, b := e.get("/dlq/confirm?q=" + url.QueryEscape(p.DLQ) + "&action=purge")
	if !strings.Contains(b, `<strong id="count">4</strong>`) || !strings.Contains(b, "cannot be undone") {
		t.Fatalf("purge confirmation:\n%s", b)
	}
	// A stale confirmation (fewer than now) purges nothing.
	_, _, h = e.post("/dlq/act", url.Values{"csrf": {tok}, "q": {p.DLQ}, "action": {"purge"}, "expect": {"2"}})
	if job := e.waitJob(h.Get("Location")); !strings.Contains(job, "nothing purged; confirm again") || depth(t, p.DLQ) != 4 {
		t.Fatalf("stale purge:\n%s", job)
	}
	_, _, h = e.post("/dlq/act", url.Values{"csrf": {tok}, "q": {p.DLQ}, "action": {"purge"}, "expect": {"4"}})
	if job := e.waitJob(h.Get("Location")); !strings.Contains(job, "purged 4 message(s)") {
		t.Fatalf("purge job:\n%s", job)
	}
	if n := depth(t, p.DLQ); n != 0 {
		t.Fatalf("%d left after purge", n)
	}
	if code, _, _ := e.post("/dlq/act", url.Values{"csrf": {tok}, "q": {p.DLQ}, "action": {"replay"}}); code != http.StatusBadRequest {
		t.Fatalf("act without a confirmed count: %d", code)
	}
}

// TestKeysPage against Redis: a record's state, owner and TTL; forget of a
// live lease refused unless forced; a done record forgotten.
func TestKeysPage(t *testing.T) {
	testenv.RequireAMQP(t)
	client, prefix := testenv.Redis(t)
	store, err := redisstore.New(client, redisstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	done, busy := dedup.Key(prefix, "billing", "order-1"), dedup.Key(prefix, "billing", "order-2")
	if _, err := store.Claim(ctx, done, "tok-a", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := store.Complete(ctx, done, "tok-a", time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Claim(ctx, busy, "tok-live", time.Minute); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, console.Config{Queues: []console.Queue{console.QueueOf("orders")}, Keys: store, KeyPrefix: prefix})
	_, body := e.get("/keys?group=billing&id=order-2")
	if !strings.Contains(body, `id="state">processing`) || !strings.Contains(body, "tok-live") || !strings.Contains(body, "live lease") {
		t.Fatalf("busy record:\n%s", body)
	}
	tok := e.csrf("/keys?group=billing&id=order-2")
	code, body, _ := e.post("/keys/forget", url.Values{"csrf": {tok}, "group": {"billing"}, "id": {"order-2"}})
	if code != http.StatusConflict || !strings.Contains(body, "refused") {
		t.Fatalf("forget of a live lease: %d\n%s", code, body)
	}
	if _, ok, _ := store.Get(ctx, busy); !ok {
		t.Fatal("the live lease was deleted")
	}
	if code, _, _ := e.post("/keys/forget", url.Values{"csrf": {tok}, "group": {"billing"}, "id": {"order-2"}, "force": {"yes"}}); code != http.StatusOK {
		t.Fatalf("forced forget: %d", code)
	}
	if _, ok, _ := store.Get(ctx, busy); ok {
		t.Fatal("forced forget left the lease")
	}
	_, body = e.get("/keys?group=billing&id=order-1")
	if !strings.Contains(body, `id="state">done`) || !regexp.MustCompile(`id="ttl">(59m|1h)`).MatchString(body) {
		t.Fatalf("done record:\n%s", body)
	}
	code, body, _ = e.post("/keys/forget", url.Values{"csrf": {tok}, "group": {"billing"}, "id": {"order-1"}})
	if code != http.StatusOK || !strings.Contains(body, "forgot") {
		t.Fatalf("forget done: %d\n%s", code, body)
	}
	if _, ok, _ := store.Get(ctx, done); ok {
		t.Fatal("done record still there")
	}
	if !strings.Contains(e.logs.String(), "action=forget") {
		t.Fatal("forget not logged")
	}
}

// TestOutboxPage against PostgreSQL: pending and failed rows, the reason
// and the lag; a failed row retried becomes pending.
func TestOutboxPage(t *testing.T) {
	testenv.RequireAMQP(t)
	dsn := testenv.PostgresDB(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := outbox.NewStore(ctx, postgres.Pgx(pool), outbox.StoreConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Add(ctx, store.DB(), outbox.Message{ID: "m-1", RoutingKey: "orders", Body: []byte("1")},
		outbox.Message{ID: "m-2", RoutingKey: "orders", Body: []byte("2")}); err != nil {
		t.Fatal(err)
	}
	rows, err := store.Claim(ctx, "relay-1", 1, time.Minute, false)
	if err != nil || len(rows) != 1 {
		t.Fatalf("claim %v %v", rows, err)
	}
	if err := store.Fail(ctx, "relay-1", rows[0].ID, "unroutable: no queue bound to orders"); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, console.Config{Queues: []console.Queue{console.QueueOf("orders")}, Outbox: console.SQLOutbox(store)})
	_, body := e.get("/outbox")
	if !strings.Contains(body, "unroutable: no queue bound to orders") || !strings.Contains(body, "m-2") ||
		!regexp.MustCompile(`Pending <strong>1</strong>, lag <strong>[0-9.]+m?s</strong>`).MatchString(body) {
		t.Fatalf("outbox page:\n%s", body)
	}
	tok := e.csrf("/outbox")
	code, _, h := e.post("/outbox/retry", url.Values{"csrf": {tok}, "id": {fmt.Sprint(rows[0].ID)}})
	if code != http.StatusSeeOther {
		t.Fatalf("retry: %d", code)
	}
	_, body = e.get(h.Get("Location"))
	if !strings.Contains(body, "is pending again") || !strings.Contains(body, "No failed rows") {
		t.Fatalf("after retry:\n%s", body)
	}
	n, err := store.Count(ctx)
	if err != nil || n[outbox.StatePending] != 2 || n[outbox.StateFailed] != 0 {
		t.Fatalf("counts %v %v", n, err)
	}
	if code, _, _ := e.post("/outbox/retry", url.Values{"csrf": {tok}, "id": {fmt.Sprint(rows[0].ID)}}); code != http.StatusConflict {
		t.Fatalf("retry of a pending row: %d", code)
	}
}
