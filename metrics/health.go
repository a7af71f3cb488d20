package metrics

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Check is one readiness probe: nil when ready.
type Check func(ctx context.Context) error

// HealthConfig configures [NewHealth]. The zero value serves /healthz and
// an always-ready /readyz.
type HealthConfig struct {
	// Gatherer serves /metrics when set ([Metrics.Gatherer]).
	Gatherer prometheus.Gatherer
	// Checks are the readiness probes by name: the consumer subscribed and
	// its breaker closed ([ConsumerReady]), stores reachable (a Ping).
	// /readyz runs them all, concurrently.
	Checks map[string]Check
	// Timeout bounds each probe. Default 2s.
	Timeout time.Duration
}

// ErrNotReady is what [ConsumerReady] returns before the first subscribe.
var ErrNotReady = errors.New("metrics: consumer not subscribed yet")

// ErrDisconnected is what [ConsumerReady] returns while a consumer that
// had subscribed is reconnecting to the broker.
var ErrDisconnected = errors.New("metrics: consumer not connected to the broker: reconnecting")

// ErrBreakerOpen is what [ConsumerReady] returns while the consumer's
// breaker holds deliveries back.
var ErrBreakerOpen = errors.New("metrics: consumer paused: a dependency is unavailable")

// ConsumerReady is a [Check]: the consumer (an *idemq.Consumer, a
// *gate.Gate) has subscribed, is subscribed now (when it tells:
// a Consuming() bool method) and its breaker is closed.
func ConsumerReady(c Watched) Check {
	return func(context.Context) error {
		if !isReady(c) {
			return ErrNotReady
		}
		if cc, ok := c.(interface{ Consuming() bool }); ok && !cc.Consuming() {
			return ErrDisconnected
		}
		if c.Paused() {
			return ErrBreakerOpen
		}
		return nil
	}
}

// NewHealth returns a handler serving /healthz (200 while the process
// serves HTTP), /readyz (200 when every check passes, 503 else; the body is
// JSON: each check's "ok" or error) and /metrics (when a Gatherer is set).
// Mount it at the root of a mux or a listener of its own.
func NewHealth(cfg HealthConfig) http.Handler {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		res, ok := runChecks(r.Context(), cfg.Checks, cfg.Timeout)
		w.Header().Set("Content-Type", "application/json")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(res)
	})
	if cfg.Gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{}))
	}
	return mux
}

func runChecks(ctx context.Context, checks map[string]Check, timeout time.Duration) (map[string]string, bool) {
	names := make([]string, 0, len(checks))
	for n := range checks {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]error, len(names))
	var wg sync.WaitGroup
	for i, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			out[i] = checks[n](cctx)
		}()
	}
	wg.Wait()
	res := make(map[string]string, len(names))
	ok := true
	for i, n := range names {
		if out[i] != nil {
			ok = false
			res[n] = out[i].Error()
		} else {
			res[n] = "ok"
		}
	}
	return res, ok
}
