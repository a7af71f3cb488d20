package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/idemq/idemq/metrics"
)

// serveMetrics serves /metrics, /healthz and /readyz on addr until stop
// is called (or ctx ends).
func serveMetrics(ctx context.Context, addr string, log *slog.Logger, cfg metrics.HealthConfig) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-listen %s: %w", addr, err)
	}
	srv := &http.Server{Handler: metrics.NewHealth(cfg), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("idemq: metrics server stopped", "err", err)
		}
	}()
	log.Info("idemq: serving /metrics, /healthz, /readyz", "addr", ln.Addr().String())
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}, nil
}
