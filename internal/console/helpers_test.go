package console_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/console"
	"github.com/idemq/idemq/internal/headerval"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/topology"
)

const wait = 45 * time.Second

// logBuf collects the console's log lines.
type logBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// env is a console under test on an httptest server.
type env struct {
	t      *testing.T
	srv    *console.Server
	hs     *httptest.Server
	client *http.Client
	logs   *logBuf
}

func newEnv(t *testing.T, cfg console.Config) *env {
	t.Helper()
	logs := &logBuf{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if cfg.AMQPURL == "" {
		cfg.AMQPURL = testenv.AMQPURL()
	}
	s, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(hs.Close)
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, Timeout: 60 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return &env{t: t, srv: s, hs: hs, client: c, logs: logs}
}

func (e *env) do(req *http.Request) (int, string, http.Header) {
	e.t.Helper()
	resp, err := e.client.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

func (e *env) get(path string) (int, string) {
	e.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, e.hs.URL+path, nil)
	code, body, _ := e.do(req)
	return code, body
}

// post sends a form as the browser of the console's own pages does.
func (e *env) post(path string, form url.Values) (int, string, http.Header) {
	e.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.hs.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", e.hs.URL)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	return e.do(req)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf is the CSRF token of the page at path.
func (e *env) csrf(path string) string {
	e.t.Helper()
	code, body := e.get(path)
	m := csrfRE.FindStringSubmatch(body)
	if code != http.StatusOK || m == nil {
		e.t.Fatalf("GET %s: %d, no CSRF field:\n%s", path, code, body)
	}
	return m[1]
}

// waitJob follows a job page until it is finished and returns it.
func (e *env) waitJob(loc string) string {
	e.t.Helper()
	var body string
	testenv.Eventually(e.t, wait, "job "+loc+" finished", func() bool {
		_, body = e.get(loc)
		return !strings.Contains(body, `id="state">running`)
	})
	return body
}

// declare declares a work queue (no retry queues) and its DLQ.
func declare(t *testing.T) topology.Plan {
	t.Helper()
	q := topology.Queue{Name: testenv.Name(t, "q"), NoRetry: true}
	p := topology.ForQueue(q)
	t.Cleanup(func() { testenv.DeleteQueue(p.Queue, p.DLQ, p.DLQ+".archive") })
	if err := topology.DeclareQueue(context.Background(), testenv.Channel(t), q); err != nil {
		t.Fatal(err)
	}
	return p
}

// seed dead-letters n messages per cause into p.DLQ as the retry package
// writes them (cause i's IDs are "c<i>-<k>"), plus a duplicate copy of the
// first of each.
func seed(t *testing.T, p topology.Plan, n int, causes ...string) {
	t.Helper()
	var msgs []amqp.Publishing
	for c, cause := range causes {
		for k := range n {
			m := amqp.Publishing{MessageId: fmt.Sprintf("c%d-%d", c, k), ContentType: "application/json",
				Body: []byte(fmt.Sprintf(`{"cause":%d,"n":%d}`, c, k)),
				Headers: amqp.Table{idemq.HeaderReason: idemq.ReasonMaxAttempts, idemq.HeaderQueue: p.Queue, idemq.HeaderAttempts: int64(3),
					idemq.HeaderError: fmt.Sprintf(cause, 1000+k), idemq.HeaderOriginalExchange: "orders.fanout", idemq.HeaderOriginalRoutingKey: "x",
					idemq.HeaderFirstFailure: time.Now().UTC().Format(headerval.TimeFormat), idemq.HeaderLastFailure: time.Now().UTC().Format(headerval.TimeFormat)}}
			msgs = append(msgs, m)
			if k == 0 {
				msgs = append(msgs, m)
			}
		}
	}
	testenv.Publish(t, "", p.DLQ, msgs...)
	want := len(msgs)
	testenv.Eventually(t, wait, "dead letters seeded", func() bool { n, _ := testenv.QueueCounts(t, p.DLQ); return n == want })
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func depth(t *testing.T, q string) int { n, _ := testenv.QueueCounts(t, q); return n }
