// Command quickstart publishes a few messages — one of them twice, with the
// same message ID, as a publisher does when a confirm is lost — consumes them
// with an idemq consumer and prints what the handler saw.
//
//	make services && go run ./examples/quickstart
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	queue := "idemq.quickstart." + idemq.NewMessageID()[24:]
	setup := func(ctx context.Context, ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-expires": int32(120000)})
		return err
	}

	pub, err := idemq.NewPublisher(idemq.PublisherConfig{Setup: setup, Logger: log})
	if err != nil {
		return err
	}
	defer pub.Close()
	ids := []string{"order-1001", "order-1002", "order-1003", "order-1002"} // 1002 resent
	for _, id := range ids {
		if err := pub.Publish(ctx, idemq.Message{ID: id, RoutingKey: queue, Body: []byte(`{"order":"` + id + `"}`)}); err != nil {
			return err
		}
		fmt.Printf("published %s (confirmed)\n", id)
	}

	var mu sync.Mutex
	seen := map[string]int{}
	got := make(chan struct{}, len(ids))
	c, err := idemq.NewConsumer(idemq.ConsumerConfig{Queue: queue, Setup: setup, Logger: log,
		Pipeline: idemq.Pipeline{Handler: idemq.HandlerFunc(func(ctx context.Context, d *idemq.Delivery) error {
			mu.Lock()
			seen[d.MessageID]++
			n := seen[d.MessageID]
			mu.Unlock()
			fmt.Printf("handled   %s (time %d)\n", d.MessageID, n)
			got <- struct{}{}
			return nil
		})}})
	if err != nil {
		return err
	}
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- c.Run(cctx) }()
	for range ids {
		select {
		case <-got:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	stop()
	if err := <-done; err != nil {
		return err
	}
	fmt.Printf("\n%d deliveries for %d unique IDs: without a dedup guard the resent order-1002 was handled twice.\n",
		len(ids), len(seen))
	return nil
}
