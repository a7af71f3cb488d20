package deadletter_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/deadletter"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/topology"
)

func TestNormalizeError(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{"payment gateway timeout", "payment gateway timeout"},
		{"order 1234 not found", "order <n> not found"},
		{"order 99 not found", "order <n> not found"},
		{"amount 12.50 exceeds limit 10", "amount <n> exceeds limit <n>"},
		{"customer 0b6a4d3e-1f2a-4c5b-9d8e-7f6a5b4c3d2e unknown", "customer <uuid> unknown"},
		{"customer 0B6A4D3E-1F2A-4C5B-9D8E-7F6A5B4C3D2E unknown", "customer <uuid> unknown"},
		{"blob 5f3a9c0e7b1d2f48 missing", "blob <hex> missing"},
		{"pointer 0xdeadbeef nil", "pointer <hex> nil"},
		{"deadlines and facades stay", "deadlines and facades stay"},
		{"order-77: x", "order-<n>: x"},
		{"  two\n\tlines  ", "two lines"},
	} {
		if got := deadletter.NormalizeError(c.in); got != c.want {
			t.Errorf("NormalizeError(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	long := deadletter.NormalizeError(fmt.Sprintf("%0500d", 0) + " x " + string(make([]byte, 0)) + fmt.Sprint(make([]int, 200)))
	if n := len([]rune(long)); n > 300 {
		t.Errorf("a long error is %d runes", n)
	}
}

func entry(pos int, id, reason, errText, first, last string, dups int) *deadletter.Entry {
	return &deadletter.Entry{Position: pos, MessageID: id, Reason: reason, Error: errText, FirstFailure: first, LastFailure: last, Duplicates: dups}
}

func TestGroupEntries(t *testing.T) {
	es := []*deadletter.Entry{
		entry(1, "a", "max-attempts", "order 1 not found", "2024-01-01T00:00:05.1Z", "2024-01-01T00:00:09Z", 0),
		entry(2, "b", "permanent", "bad currency \"XYZ\"", "", "", 0),
		entry(3, "c", "max-attempts", "order 2 not found", "2024-01-01T00:00:05.12Z", "2024-01-01T00:00:10Z", 2),
		entry(4, "d", "permanent", "order 3 not found", "", "", 0), // same text, other reason: another group
		entry(5, "e", "max-attempts", "order 4 not found", "2024-01-01T00:00:01Z", "2024-01-01T00:00:02Z", 0),
	}
	gs := deadletter.GroupEntries(es)
	if len(gs) != 3 {
		t.Fatalf("%d groups: %+v", len(gs), gs)
	}
	g := gs[0]
	if g.Reason != "max-attempts" || g.Pattern != "order <n> not found" || g.Count != 3 || g.Duplicates != 2 ||
		g.Example != "order 1 not found" || fmt.Sprint(g.MessageIDs) != "[a c e]" ||
		g.FirstFailure != "2024-01-01T00:00:01Z" || g.LastFailure != "2024-01-01T00:00:10Z" {
		t.Fatalf("first group %+v", g)
	}
	if g.Key != deadletter.GroupKey(es[0]) || g.Key != deadletter.GroupKey(es[2]) || g.Key == deadletter.GroupKey(es[3]) {
		t.Fatal("group keys do not follow reason and pattern")
	}
	if gs[1].Reason != "permanent" || gs[1].Count != 1 || gs[2].Count != 1 {
		t.Fatalf("groups %+v", gs)
	}
	if !deadletter.InGroup(g.Key)(es[4]) || deadletter.InGroup(g.Key)(es[1]) {
		t.Fatal("InGroup")
	}
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// seedCauses dead-letters n messages of each cause into dlq (a copy of the
// first message of each cause too, as a consumer killed after its dead
// letter's confirm leaves), as the retry package writes them.
func seedCauses(t *testing.T, queue, dlq string, n int, causes ...string) {
	t.Helper()
	var msgs []amqp.Publishing
	for c, cause := range causes {
		for i := range n {
			id := fmt.Sprintf("c%d-%d", c, i)
			msgs = append(msgs, amqp.Publishing{MessageId: id, Body: []byte(`{"n":` + fmt.Sprint(i) + `}`), ContentType: "application/json",
				Headers: amqp.Table{idemq.HeaderReason: idemq.ReasonMaxAttempts, idemq.HeaderQueue: queue, idemq.HeaderAttempts: int64(3),
					idemq.HeaderError: fmt.Sprintf(cause, 1000+i), "tenant": "acme"}})
			if i == 0 {
				msgs = append(msgs, msgs[len(msgs)-1])
			}
		}
	}
	testenv.Publish(t, "", dlq, msgs...)
}

// TestGroupReplayArchivePurge, against the broker: three causes grouped
// with the right counts (duplicates once); one group replayed to the work
// queue only, its duplicate dropped; one group archived with its headers;
// the last one deleted.
func TestGroupReplayArchivePurge(t *testing.T) {
	testenv.RequireRealBroker(t, "deadletter.Open dials with amqp.Dial itself (it has no Dial option to point it at the fake)")
	url := testenv.RequireAMQP(t)
	q := topology.Queue{Name: testenv.Name(t, "q"), NoRetry: true}
	p := topology.ForQueue(q)
	archive := deadletter.ArchiveName(p.DLQ)
	t.Cleanup(func() { testenv.DeleteQueue(p.Queue, p.DLQ, archive) })
	if err := topology.DeclareQueue(context.Background(), testenv.Channel(t), q); err != nil {
		t.Fatal(err)
	}
	seedCauses(t, p.Queue, p.DLQ, 4, "order %d not found", "gateway timeout after %dms", "bad currency %d")
	testenv.Eventually(t, 30*time.Second, "15 dead letters", func() bool { n, _ := testenv.QueueCounts(t, p.DLQ); return n == 15 })
	ctx := context.Background()

	groups := func() []deadletter.Group {
		t.Helper()
		c, err := deadletter.Open(url)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, es, err := c.List(ctx, p.DLQ, deadletter.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return deadletter.GroupEntries(es)
	}
	gs := groups()
	if len(gs) != 3 {
		t.Fatalf("groups %+v", gs)
	}
	byPattern := map[string]deadletter.Group{}
	for _, g := range gs {
		if g.Count != 4 || g.Duplicates != 1 {
			t.Fatalf("group %+v: want 4 and 1 duplicate", g)
		}
		byPattern[g.Pattern] = g
	}
	notFound, timeout := byPattern["order <n> not found"], byPattern["gateway timeout after <n>ms"]
	if notFound.Key == "" || timeout.Key == "" {
		t.Fatalf("patterns %v", byPattern)
	}

	pub, err := idemq.NewPublisher(idemq.PublisherConfig{URL: url, Dial: testenv.Dial, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	c, err := deadletter.Open(url)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Replay(ctx, deadletter.ReplayOptions{DLQ: p.DLQ, Filter: deadletter.InGroup(notFound.Key), Publisher: pub})
	c.Close()
	if err != nil || len(res.Replayed) != 4 || len(res.Duplicates) != 1 || res.Skipped != 10 {
		t.Fatalf("replay %+v, %v", res, err)
	}
	testenv.Eventually(t, 30*time.Second, "the group in the work queue", func() bool {
		n, _ := testenv.QueueCounts(t, p.DLQ)
		w, _ := testenv.QueueCounts(t, p.Queue)
		return n == 10 && w == 4
	})
	var ids []string
	for _, d := range testenv.Drain(t, p.Queue) {
		ids = append(ids, d.MessageId)
		if d.Headers[idemq.HeaderReason] != nil || d.Headers["tenant"] != "acme" {
			t.Fatalf("replayed headers %v", d.Headers)
		}
	}
	sort.Strings(ids)
	if fmt.Sprint(ids) != "[c0-0 c0-1 c0-2 c0-3]" {
		t.Fatalf("replayed %v", ids)
	}

	c, err = deadletter.Open(url)
	if err != nil {
		t.Fatal(err)
	}
	var progress int
	ar, err := c.Remove(ctx, deadletter.RemoveOptions{DLQ: p.DLQ, ArchiveTo: archive, Filter: deadletter.InGroup(timeout.Key),
		Publisher: pub, Progress: func() { progress++ }})
	c.Close()
	if err != nil || ar.Removed != 4 || ar.Copies != 1 || ar.Skipped != 5 || progress != 5 {
		t.Fatalf("archive %+v, %v (progress %d)", ar, err, progress)
	}
	testenv.Eventually(t, 30*time.Second, "the group archived", func() bool {
		n, _ := testenv.QueueCounts(t, p.DLQ)
		a, _ := testenv.QueueCounts(t, archive)
		return n == 5 && a == 5
	})
	for _, d := range testenv.Drain(t, archive) {
		if d.Headers[idemq.HeaderReason] != idemq.ReasonMaxAttempts || d.Headers[deadletter.HeaderArchivedAt] == nil {
			t.Fatalf("archived headers %v", d.Headers)
		}
	}

	c, err = deadletter.Open(url)
	if err != nil {
		t.Fatal(err)
	}
	dr, err := c.Remove(ctx, deadletter.RemoveOptions{DLQ: p.DLQ})
	c.Close()
	if err != nil || dr.Removed != 4 || dr.Copies != 1 {
		t.Fatalf("delete %+v, %v", dr, err)
	}
	testenv.Eventually(t, 30*time.Second, "the DLQ empty", func() bool { n, _ := testenv.QueueCounts(t, p.DLQ); return n == 0 })
}
