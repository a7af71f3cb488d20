package deliverylimit

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/mgmt"
)

// fakeAPI answers GET /api/queues/<vhost>/<queue> with body, or with a
// 500 while broken.
type fakeAPI struct {
	mu     sync.Mutex
	body   string
	broken bool
}

func (f *fakeAPI) set(body string, broken bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.body, f.broken = body, broken
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.broken || r.URL.EscapedPath() != "/api/queues/%2F/q" {
		http.Error(w, "broken", http.StatusInternalServerError)
		return
	}
	_, _ = io.WriteString(w, f.body)
}

type timeoutSeen struct {
	d      time.Duration
	source string
}

func TestReader(t *testing.T) {
	var nilReader *Reader
	if nilReader.Limit() != 0 || nilReader.ConsumerTimeout() != 0 {
		t.Fatal("a nil reader answers other than 0")
	}
	api := &fakeAPI{}
	srv := httptest.NewServer(api)
	defer srv.Close()
	client, err := mgmt.New(srv.URL, srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	var ready atomic.Bool
	var seen []timeoutSeen
	r := New(Config{Client: client, Queue: "q", Timeout: 5 * time.Second, Ready: ready.Load,
		ConsumerTimeout: func(d time.Duration, source string) { seen = append(seen, timeoutSeen{d, source}) },
		Logger:          slog.New(slog.DiscardHandler)})
	ctx := context.Background()

	api.set("", true)
	if err := r.Read(ctx, "/"); err == nil {
		t.Fatal("a failed first read is not an error")
	}
	api.set(`{"name":"q","vhost":"/","type":"quorum","arguments":{"x-delivery-limit":5,"x-consumer-timeout":8000},"effective_policy_definition":[]}`, false)
	ready.Store(true)
	for range 2 {
		if err := r.Read(ctx, "/"); err != nil {
			t.Fatal(err)
		}
	}
	if r.Limit() != 5 || r.ConsumerTimeout() != 8*time.Second {
		t.Fatalf("limit %d, consumer timeout %v; want 5, 8s", r.Limit(), r.ConsumerTimeout())
	}
	if len(seen) != 1 || seen[0] != (timeoutSeen{8 * time.Second, "argument x-consumer-timeout"}) {
		t.Fatalf("consumer timeout hook calls %v, want one with 8s from the argument", seen)
	}

	api.set("", true)
	if err := r.Read(ctx, "/"); err != nil || r.Limit() != 5 {
		t.Fatalf("a failed read once ready: err %v, limit %d; want nil and the last limit 5", err, r.Limit())
	}

	api.set(`{"name":"q","vhost":"/","type":"quorum","arguments":{"x-delivery-limit":0},"effective_policy_definition":[]}`, false)
	if err := r.Read(ctx, "/"); err != nil {
		t.Fatal(err)
	}
	if r.Limit() != 1 || r.ConsumerTimeout() != 0 {
		t.Fatalf("limit %d, consumer timeout %v; want 1 (a limit of 0) and none", r.Limit(), r.ConsumerTimeout())
	}
	if len(seen) != 2 || seen[1].d != 0 {
		t.Fatalf("consumer timeout hook calls %v, want a second one with 0", seen)
	}
}
