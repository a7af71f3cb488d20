package console_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/internal/console"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/retry"
	"github.com/idemq/idemq/topology"
)

// chromium finds Debian's chromium (scripts/services.sh installs it). With
// CI=true a missing browser fails the test; elsewhere it skips.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if testenv.InCI() {
		t.Fatal("no chromium on PATH (scripts/services.sh up installs Debian's chromium)")
	}
	t.Skip("no chromium on PATH: apt-get install chromium (scripts/services.sh up does)")
	return ""
}

// browser is a headless Chromium tab; within bounds every later step.
func browser(t *testing.T, within time.Duration) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)), chromedp.NoSandbox, chromedp.Headless, chromedp.DisableGPU,
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(1280, 900),
		chromedp.UserDataDir(t.TempDir()))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelC := chromedp.NewContext(actx)
	// The first run starts the browser; no timeout on it (it would bound
	// the browser's life), the later steps get one.
	if err := chromedp.Do(ctx); err != nil {
		cancelC()
		cancelA()
		t.Fatalf("start chromium: %v", err)
	}
	tctx, cancelT := context.WithTimeout(ctx, within)
	t.Cleanup(func() { cancelT(); cancelC(); cancelA() })
	return tctx
}

// serve runs a console on a loopback port of its own.
func serve(t *testing.T, cfg console.Config) string {
	t.Helper()
	cfg.Logger = quietLogger()
	if cfg.AMQPURL == "" {
		cfg.AMQPURL = testenv.AMQPURL()
	}
	s, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		s.Close()
	})
	return "http://" + ln.Addr().String()
}

// shot saves a PNG screenshot under $IDEMQ_CONSOLE_SCREENSHOTS (docs/ when the
// README's pictures are refreshed), else in the test's temp folder.
func shot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("IDEMQ_CONSOLE_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// run runs steps in order.
func run(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// get runs one action and returns its value.
func get[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

type css = chromedp.CSS

type groupCell struct {
	Key     string `json:"key"`
	Count   string `json:"count"`
	Pattern string `json:"pattern"`
}

const groupsJS = `Array.from(document.querySelectorAll('#groups tr.group')).map(r => ({
	key: r.dataset.group, count: r.querySelector('.count').textContent.trim(), pattern: r.querySelector('.pattern code').textContent}))`

// TestBrowserConsole drives the console in headless Chromium against
// RabbitMQ and Redis: 30 messages dead-lettered by a real consumer with
// three causes show as three groups of 10; one group is replayed through
// its confirmation page after its bug is fixed, and the broker and the
// consumer see exactly those 10 processed once, the group gone; a POST
// without the CSRF token is refused; a dedup key is looked up and
// forgotten; a console with a token shows its login first; the page fits a
// phone's width.
func TestBrowserConsole(t *testing.T) {
	url := testenv.RequireAMQP(t)
	client, prefix := testenv.Redis(t)
	ctx := browser(t, 150*time.Second)
	start := time.Now()

	q := topology.Queue{Name: testenv.Name(t, "orders"), NoRetry: true}
	p := topology.ForQueue(q)
	t.Cleanup(func() { testenv.DeleteQueue(p.Queue, p.DLQ) })
	if err := topology.DeclareQueue(context.Background(), testenv.Channel(t), q); err != nil {
		t.Fatal(err)
	}
	pub, err := idemq.NewPublisher(idemq.PublisherConfig{URL: url, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()

	// The consumer: three bugs, each failing ten orders permanently.
	var mu sync.Mutex
	processed := map[string]int{}
	var fixedAmounts bool
	h := idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
		var n int
		fmt.Sscanf(d.MessageID, "order-%d", &n)
		mu.Lock()
		fixed := fixedAmounts
		mu.Unlock()
		switch {
		case n%3 == 0 && !fixed:
			return idemq.Permanent(fmt.Errorf("invalid amount %d.%02d for account %d", n*7, n, 1000+n))
		case n%3 == 1:
			return idemq.Permanent(fmt.Errorf("customer %08x-1f2a-4c5b-9d8e-%012x unknown", n*977, n))
		case n%3 == 2:
			return idemq.Permanent(fmt.Errorf("ledger 0x%x locked by batch %d", 0xbeef00+n, n*13))
		}
		mu.Lock()
		processed[d.MessageID]++
		mu.Unlock()
		return nil
	})
	pol, err := retry.New(retry.ForTopology(q, retry.Config{Sender: pub, QuickAttempts: 1}))
	if err != nil {
		t.Fatal(err)
	}
	c, err := idemq.NewConsumer(idemq.ConsumerConfig{URL: url, Queue: p.Queue, Group: "billing", Logger: quietLogger(),
		Pipeline: idemq.Pipeline{Policy: pol, Handler: h}})
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(context.Background())
	cdone := make(chan struct{})
	go func() { _ = c.Run(cctx); close(cdone) }()
	defer func() { cancel(); <-cdone }()
	<-c.Ready()
	var msgs []amqp.Publishing
	for i := range 30 {
		msgs = append(msgs, amqp.Publishing{MessageId: fmt.Sprintf("order-%d", i), ContentType: "application/json",
			Body: []byte(fmt.Sprintf(`{"order":%d,"amount":%d}`, i, i*7))})
	}
	testenv.Publish(t, "", p.Queue, msgs...)
	testenv.Eventually(t, wait, "30 dead letters", func() bool { return depth(t, p.DLQ) == 30 })

	store, err := redisstore.New(client, redisstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	base := serve(t, console.Config{Queues: []console.Queue{console.QueueOf(p.Queue)}, Keys: store, KeyPrefix: prefix, SampleInterval: 200 * time.Millisecond})

	// The overview, then the groups.
	run(t, ctx, "overview", chromedp.Navigate(base+"/"), chromedp.WaitVisible(css("#queues")))
	if d := get(t, ctx, "depth", chromedp.Text(css(`#queues tr[data-dlq="`+p.DLQ+`"] .depth`))); d != "30" {
		t.Fatalf("overview depth %q", d)
	}
	run(t, ctx, "groups", chromedp.Click(css(`#queues a[href*="`+p.DLQ+`"]`)), chromedp.WaitVisible(css("#groups")))
	groups := get(t, ctx, "groups", chromedp.Evaluate[[]groupCell](groupsJS))
	shot(t, ctx, "console-dead-letters.png")
	if len(groups) != 3 {
		t.Fatalf("groups %+v", groups)
	}
	var amounts string
	for _, g := range groups {
		if g.Count != "10" {
			t.Fatalf("group %+v: want 10", g)
		}
		if strings.Contains(g.Pattern, "invalid amount <n> for account <n>") {
			amounts = g.Key
		}
		if strings.ContainsAny(g.Pattern, "0123456789") {
			t.Fatalf("pattern not normalised: %q", g.Pattern)
		}
	}
	if amounts == "" {
		t.Fatalf("no invalid-amount group in %+v", groups)
	}

	// A message's detail.
	run(t, ctx, "detail", chromedp.Click(css(`tr[data-group="`+amounts+`"] .pattern a`)), chromedp.WaitVisible(css("#body")))
	body := get(t, ctx, "body", chromedp.Text(css("#body")))
	reason := get(t, ctx, "reason", chromedp.Text(css("#reason")))
	if !strings.Contains(body, `"order": `) || reason != idemq.ReasonPermanent {
		t.Fatalf("detail: reason %q body %q", reason, body)
	}
	shot(t, ctx, "console-message.png")

	// The bug is fixed; replay the group through its confirmation.
	mu.Lock()
	fixedAmounts = true
	mu.Unlock()
	run(t, ctx, "confirm", chromedp.Navigate(base+"/dlq?q="+p.DLQ), chromedp.WaitVisible(css("#groups")),
		chromedp.Click(css(`tr[data-group="`+amounts+`"] a.replay-group`)), chromedp.WaitVisible(css("#confirm")))
	if n := get(t, ctx, "count", chromedp.Text(css("#count"))); n != "10" {
		t.Fatalf("confirmation count %q", n)
	}
	shot(t, ctx, "console-confirm.png")
	run(t, ctx, "replay", chromedp.Click(css("#confirm-button")), chromedp.WaitVisible(css("#state")))
	loc := get(t, ctx, "job URL", chromedp.Location())
	if !strings.Contains(loc, "/jobs/") {
		t.Fatalf("after confirm: %s", loc)
	}
	var state string
	testenv.Eventually(t, wait, "the replay job done", func() bool {
		run(t, ctx, "job", chromedp.Navigate(loc), chromedp.WaitVisible(css("#state")))
		state = get(t, ctx, "state", chromedp.Text(css("#state")))
		return state != "running"
	})
	summary := get(t, ctx, "job summary", chromedp.Text(css("#summary")))
	if state != "done" || !strings.Contains(summary, "replayed 10 to work queue "+p.Queue) {
		t.Fatalf("job %s: %s", state, summary)
	}
	testenv.Eventually(t, wait, "the replayed orders processed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(processed) == 10
	})
	testenv.Eventually(t, wait, "the work queue drained", func() bool { return depth(t, p.Queue) == 0 })
	mu.Lock()
	var ids []string
	for id, n := range processed {
		var k int
		fmt.Sscanf(id, "order-%d", &k)
		if n != 1 || k%3 != 0 {
			t.Errorf("%s processed %d times", id, n)
		}
		ids = append(ids, id)
	}
	mu.Unlock()
	sort.Strings(ids)
	if n := depth(t, p.DLQ); n != 20 {
		t.Fatalf("DLQ depth %d after the replay, want 20 (processed %v)", n, ids)
	}
	run(t, ctx, "groups after", chromedp.Navigate(base+"/dlq?q="+p.DLQ), chromedp.WaitVisible(css("#groups")))
	groups = get(t, ctx, "groups after", chromedp.Evaluate[[]groupCell](groupsJS))
	if len(groups) != 2 {
		t.Fatalf("groups after the replay %+v", groups)
	}
	for _, g := range groups {
		if g.Key == amounts {
			t.Fatal("the replayed group is still shown")
		}
	}

	// A POST without the CSRF token, from the console's own page, is refused.
	status := get(t, ctx, "POST without CSRF", chromedp.Evaluate[int](`fetch('/dlq/act', {method: 'POST',
		headers: {'Content-Type': 'application/x-www-form-urlencoded'},
		body: 'q=`+p.DLQ+`&action=purge&expect=20'}).then(r => r.status)`, chromedp.EvalAwaitPromise))
	if status != 403 {
		t.Fatalf("POST without CSRF: %d", status)
	}
	if n := depth(t, p.DLQ); n != 20 {
		t.Fatalf("the refused purge changed the DLQ: %d", n)
	}

	// A dedup key: looked up, then forgotten.
	key := dedup.Key(prefix, "billing", "order-42")
	if _, err := store.Claim(context.Background(), key, "tok-1", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := store.Complete(context.Background(), key, "tok-1", time.Hour); err != nil {
		t.Fatal(err)
	}
	run(t, ctx, "keys lookup", chromedp.Navigate(base+"/keys"), chromedp.WaitVisible(css("#lookup")),
		chromedp.SendKeys(css(`input[name="group"]`), "billing"), chromedp.SendKeys(css(`input[name="id"]`), "order-42"),
		chromedp.Click(css("#lookup")), chromedp.WaitVisible(css("#record")))
	if st := get(t, ctx, "key state", chromedp.Text(css("#state"))); st != "done" {
		t.Fatalf("key state %q", st)
	}
	shot(t, ctx, "console-keys.png")
	run(t, ctx, "forget", chromedp.Click(css("#forget")), chromedp.WaitVisible(css("#message")))
	if msg := get(t, ctx, "forget message", chromedp.Text(css("#message"))); !strings.Contains(msg, "forgot") {
		t.Fatalf("forget: %q", msg)
	}
	if _, ok, err := store.Get(context.Background(), key); err != nil || ok {
		t.Fatalf("the key is still there: %v %v", ok, err)
	}

	// Phone width: nothing wider than the screen.
	run(t, ctx, "phone", chromedp.EmulateViewport(390, 800), chromedp.Navigate(base+"/dlq?q="+p.DLQ), chromedp.WaitVisible(css("#groups")))
	overflow := get(t, ctx, "overflow", chromedp.Evaluate[bool](`document.documentElement.scrollWidth > window.innerWidth + 1`))
	shot(t, ctx, "console-phone.png")
	if overflow {
		t.Fatal("the dead-letter page is wider than a phone's screen")
	}
	run(t, ctx, "desktop", chromedp.EmulateViewport(1280, 900))

	// A console with a token: the login page first, then the console.
	token := "browser-token-0123456789"
	tbase := serve(t, console.Config{Token: token, Queues: []console.Queue{console.QueueOf(p.Queue)}})
	run(t, ctx, "token refused", chromedp.Navigate(tbase+"/dlq?q="+p.DLQ), chromedp.WaitVisible(css(`input[name="token"]`)))
	if title := get(t, ctx, "title", chromedp.Text(css("h1"))); title != "Token required" {
		t.Fatalf("without a token: %q", title)
	}
	run(t, ctx, "login", chromedp.SendKeys(css(`input[name="token"]`), token), chromedp.Submit(css(`input[name="token"]`)),
		chromedp.WaitVisible(css("#groups")))
	if groups = get(t, ctx, "groups after login", chromedp.Evaluate[[]groupCell](groupsJS)); len(groups) != 2 {
		t.Fatalf("after login: %+v", groups)
	}
	t.Logf("browser test took %v", time.Since(start).Round(time.Millisecond))
}
