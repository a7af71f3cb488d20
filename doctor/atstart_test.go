package doctor_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/doctor"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/topology"
)

// A consumer given doctor.AtStart as ConsumerConfig.AtStart logs, once,
// what the doctor finds wrong with the deployment it runs in — here a
// work queue declared without its dead-letter queue — and goes on
// consuming.
func TestConsumerRunsTheDoctorAtStart(t *testing.T) {
	amqpURL := testenv.RequireAMQP(t)
	name := testenv.Name(t, "doctor")
	q := topology.Queue{Name: name, Type: topology.Quorum, NoRetry: true}
	top := topology.Topology{Queues: []topology.Queue{q}}
	p := topology.ForQueue(q)
	t.Cleanup(func() { testenv.DeleteQueue(p.Queue, p.DLQ) })
	if _, err := testenv.Channel(t).QueueDeclare(p.Queue, true, false, false, false, p.Args); err != nil {
		t.Fatal(err)
	}
	var logs testenv.LogBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	c, err := idemq.NewConsumer(idemq.ConsumerConfig{URL: amqpURL, Queue: p.Queue, Logger: log,
		Pipeline: idemq.Pipeline{Handler: idemq.HandlerFunc(func(context.Context, *idemq.Delivery) error { return nil })},
		AtStart:  doctor.AtStart(log, doctor.Config{Topology: top, AMQPURL: amqpURL})})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	testenv.Eventually(t, 30*time.Second, "the doctor's finding in the consumer's log", func() bool {
		return strings.Contains(logs.String(), "idemq doctor: broker.dlq FAIL")
	})
	if n := strings.Count(logs.String(), "idemq doctor: broker.dlq FAIL"); n != 1 {
		t.Errorf("the finding was logged %d times, want once", n)
	}
	select {
	case <-c.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("the consumer did not start consuming")
	}
}
