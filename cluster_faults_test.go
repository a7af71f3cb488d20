//go:build faults

package idemq_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sqldb/postgres"
)

// A 3-node cluster, a quorum queue, two consumers and a publisher given the
// three nodes' URLs, and the node leading the queue killed with kill -9
// mid-run: the consumers and the publisher fail over to the two others,
// the queue elects a new leader, nothing is lost, and the PostgreSQL inbox
// applies every message exactly once (the unacked deliveries of the killed
// node's consumers and the resent publishes whose confirm died with it come
// back as duplicates: the inbox suppresses them).
func TestFaultClusterLeaderKill(t *testing.T) {
	cl := testenv.StartCluster(t, testenv.ClusterConfig{Rabbit: true})
	dsn := testenv.PostgresDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(ctx, postgres.Pgx(pool), inbox.Config{})
	if err != nil {
		t.Fatal(err)
	}

	queue := testenv.Name(t, "qq")
	declare := func(_ context.Context, ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		return err
	}
	// The queue exists (and has its leader) before the run.
	{
		conn, err := amqp.Dial(cl.AMQPURLs[0])
		if err != nil {
			t.Fatal(err)
		}
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if err := declare(ctx, ch); err != nil {
			t.Fatal(err)
		}
		conn.Close()
	}
	leader := cl.Leader(queue)

	var applied atomic.Int64
	h := ib.Handler(func(ctx context.Context, tx pgx.Tx, d *idemq.Delivery) error {
		if _, err := tx.Exec(ctx, `INSERT INTO effects (id) VALUES ($1)`, d.MessageID); err != nil {
			return err
		}
		// Work that takes a while: the kill meets deliveries in flight.
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
		applied.Add(1)
		return nil
	})
	var recs [2]idemq.Counters
	for i := range recs {
		_, stop := runConsumer(t, idemq.ConsumerConfig{URLs: cl.AMQPURLs, Queue: queue, Setup: declare, Workers: 4, Prefetch: 50,
			Recorder: &recs[i], Reconnect: backoffFast(), Heartbeat: 2 * time.Second}, h)
		defer stop()
	}

	const n = 2000
	var pubRec idemq.Counters
	p, err := idemq.NewPublisher(idemq.PublisherConfig{URLs: cl.AMQPURLs, Setup: declare, Logger: quietLogger(), Recorder: &pubRec,
		Retry: backoffFast(), Heartbeat: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	publish := func(from, to int) error {
		sem := make(chan struct{}, 32)
		errs := make(chan error, to-from)
		for i := from; i < to; i++ {
			sem <- struct{}{}
			go func(i int) {
				defer func() { <-sem }()
				errs <- p.Publish(ctx, idemq.Message{ID: fmt.Sprintf("m-%d", i), RoutingKey: queue, Body: []byte("x")})
			}(i)
		}
		for i := from; i < to; i++ {
			if err := <-errs; err != nil {
				return err
			}
		}
		return nil
	}
	// The first half is published, a quarter applied; the second half is
	// published while the leader dies.
	if err := publish(0, n/2); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 2*time.Minute, "a quarter of the messages applied", func() bool { return applied.Load() >= n/4 })
	pubDone := make(chan error, 1)
	go func() { pubDone <- publish(n/2, n) }()
	atKill := applied.Load()
	cl.Run("kill", fmt.Sprint(leader))
	t.Logf("killed node %d (%s), the queue's leader, after %d of %d applied", leader, cl.Nodes[leader-1], atKill, n)
	if atKill >= n/2 {
		t.Errorf("the kill came after the backlog was consumed (%d of %d applied): it tested nothing", atKill, n)
	}

	if err := <-pubDone; err != nil {
		t.Fatalf("publish through the leader kill: %v", err)
	}
	countEffects := func() (rows, distinct int64) {
		_ = pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT id) FROM effects`).Scan(&rows, &distinct)
		return
	}
	testenv.Eventually(t, 2*time.Minute, "every message applied", func() bool {
		_, d := countEffects()
		return d >= n
	})
	// Let the redeliveries of the killed node's unacked deliveries settle:
	// the queue empties once every copy (resends included) is acked.
	survivor := cl.AMQPURLs[leader%3]
	testenv.Eventually(t, 2*time.Minute, "the queue drained", func() bool {
		conn, err := amqp.Dial(survivor)
		if err != nil {
			return false
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return false
		}
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err == nil && q.Messages == 0
	})
	rows, distinct := countEffects()
	var reconnects, redelivered, dups int64
	for i := range recs {
		s := recs[i].Snapshot()
		reconnects += s[idemq.CountReconnects]
		redelivered += s[idemq.CountRedelivered]
		dups += s[idemq.CountDuplicates]
	}
	t.Logf("applied rows %d (distinct %d) of %d; consumer reconnects %d, redelivered %d, duplicates suppressed %d; publish retries %d",
		rows, distinct, n, reconnects, redelivered, dups, pubRec.Snapshot()[idemq.CountPublishRetries])
	if distinct != n {
		t.Errorf("lost: %d of %d messages applied", distinct, n)
	}
	if rows != n {
		t.Errorf("inbox not exact: %d effect rows for %d messages", rows, n)
	}
}
