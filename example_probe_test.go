package idemq_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/idemq/idemq"
)

// A handler that calls an HTTP API registers a probe of that API: when a
// run fails with an error in a shape idemq does not know (a 503 from a
// proxy, a timeout), the consumer asks the probe before counting an
// attempt. A failing probe makes it an outage: the delivery goes back
// uncounted and the consumer pauses until the probe passes. The probes
// of idemq's own layers (the dedup guard, an inbox handler) are added by
// themselves.
func ExampleBreakerConfig_probe() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			w.WriteHeader(http.StatusServiceUnavailable) // the API is down
		}
	}))
	defer api.Close()
	probe := func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, api.URL+"/healthz", nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("payments API: %s", resp.Status)
		}
		return nil
	}
	cfg := idemq.ConsumerConfig{
		Queue: "orders",
		Pipeline: idemq.Pipeline{Handler: idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
			return callPaymentsAPI(ctx, api.URL, d.Body) // its errors need not be classified
		})},
		Breaker: idemq.BreakerConfig{
			Probes:     []func(context.Context) error{probe},
			AskTimeout: 2 * time.Second, // the default
		},
	}
	if _, err := idemq.NewConsumer(cfg); err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	fmt.Println("probe:", probe(ctx))
	// Output: probe: payments API: 503 Service Unavailable
}

// callPaymentsAPI stands for the handler's call to an HTTP API.
func callPaymentsAPI(ctx context.Context, url string, body []byte) error { return nil }
