package doctor

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/internal/mgmt"
	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/topology"
)

// defaultConsumerTimeout is idemq.ConsumerConfig's default ConsumerTimeout
// (the broker's default consumer_timeout).
const defaultConsumerTimeout = 30 * time.Minute

const fixApply = "idemq topology apply -f FILE (declares what is missing; existing queues are left as they are)"

// brokerQueue is one queue the topology declares.
type brokerQueue struct {
	role  string // "queue", "dlq", "retry-queue"
	name  string
	typ   topology.QueueType
	args  amqp.Table
	route topology.RetryRoute // retry queues
}

// missingMeaning is what a missing queue of a role means.
var missingMeaning = map[string]string{
	"queue":       "publishes to it are returned as unroutable and no consumer can start without declaring it",
	"dlq":         "a message that fails for good cannot be dead-lettered: the retry policy holds it back in a retry queue, or the broker drops it",
	"retry-queue": "a failed message cannot wait for its delayed retry: the retry policy holds the delivery, then dead-letters it",
}

func brokerQueues(t topology.Topology) []brokerQueue {
	var out []brokerQueue
	for _, q := range t.Queues {
		p := topology.ForQueue(q)
		out = append(out, brokerQueue{role: "queue", name: p.Queue, typ: p.Type, args: p.Args})
		if p.DLQ != "" {
			out = append(out, brokerQueue{role: "dlq", name: p.DLQ, typ: p.DLQType, args: p.DLQArgs})
		}
		for _, r := range p.Retries {
			out = append(out, brokerQueue{role: "retry-queue", name: r.Name, typ: retryType(q), args: r.Args, route: p.RetryRoute})
		}
	}
	return out
}

func brokerFindings(ctx context.Context, cfg Config) []Finding {
	subject := redact.URL(cfg.AMQPURL)
	conn, err := amqp.DialConfig(cfg.AMQPURL, amqp.Config{Dial: amqp.DefaultDial(cfg.Timeout)})
	if err != nil {
		return []Finding{{Check: "broker.reach", Subject: subject, Status: Fail, Detail: err.Error(),
			Meaning: "nothing can be published or consumed", Fix: "check the AMQP URL (--url, IDEMQ_AMQP_URL) and that the broker runs"}}
	}
	defer conn.Close()
	vhost := "/"
	if u, err := amqp.ParseURI(cfg.AMQPURL); err == nil && u.Vhost != "" {
		vhost = u.Vhost
	}
	var mc *mgmt.Client
	var out []Finding
	if cfg.ManagementURL != "" {
		if mc, err = mgmt.New(cfg.ManagementURL, cfg.HTTPClient); err != nil {
			out = append(out, Finding{Check: "broker.management", Subject: "management API", Status: Fail, Detail: err.Error(),
				Fix: "give the management API URL as http://user:password@host:15672 (--management-url)"})
			mc = nil
		}
	} else {
		out = append(out, Finding{Check: "broker.management", Subject: "management API", Status: Warn,
			Detail:  "not checked: no management URL",
			Meaning: "queue types, arguments, policies and the delivery limit the broker applies are not compared with the topology",
			Fix:     "give --management-url (IDEMQ_RABBITMQ_MGMT_URL; a user with the monitoring tag is enough)"})
	}
	qs := brokerQueues(cfg.Topology)
	per := make([][]Finding, len(qs))
	var wg sync.WaitGroup
	for i, bq := range qs {
		exists, err := queueExists(ctx, conn, bq.name)
		switch {
		case err != nil:
			per[i] = []Finding{{Check: "broker." + bq.role, Subject: bq.name, Status: Fail, Detail: "could not check: " + err.Error(),
				Fix: "check the user's permissions on the vhost"}}
		case !exists:
			per[i] = []Finding{{Check: "broker." + bq.role, Subject: bq.name, Status: Fail, Detail: "does not exist",
				Meaning: missingMeaning[bq.role], Fix: fixApply}}
		case mc == nil:
			per[i] = []Finding{{Check: "broker." + bq.role, Subject: bq.name, Status: Pass, Detail: "exists"}}
		default:
			// The management API reports a queue's policies only after its
			// first statistics collection (every few seconds after a
			// declare): the reads wait for it side by side.
			wg.Add(1)
			go func() {
				defer wg.Done()
				per[i] = managedFindings(ctx, cfg, mc, vhost, bq)
			}()
		}
	}
	wg.Wait()
	for _, fs := range per {
		out = append(out, fs...)
	}
	return out
}

// queueExists declares name passively on a channel of its own (a missing
// queue closes the channel), within ctx: a broker that stops answering
// does not hold the doctor past its timeout (the connection is closed
// when the checks return, which ends the call left behind).
func queueExists(ctx context.Context, conn *amqp.Connection, name string) (bool, error) {
	type result struct {
		ok  bool
		err error
	}
	res := make(chan result, 1)
	go func() {
		ok, err := declarePassive(conn, name)
		res <- result{ok, err}
	}()
	select {
	case r := <-res:
		return r.ok, r.err
	case <-ctx.Done():
		return false, fmt.Errorf("passive declare of %s: %w", name, ctx.Err())
	}
}

func declarePassive(conn *amqp.Connection, name string) (bool, error) {
	ch, err := conn.Channel()
	if err != nil {
		return false, err
	}
	_, err = ch.QueueDeclarePassive(name, true, false, false, false, nil)
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.NotFound {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	_ = ch.Close()
	return true, nil
}

// managedFindings compares what the management API shows of bq with the
// topology: type, arguments, the policies that apply, the delivery limit
// and the consumer timeout.
func managedFindings(ctx context.Context, cfg Config, mc *mgmt.Client, vhost string, bq brokerQueue) []Finding {
	q, err := mc.QueueNow(ctx, vhost, bq.name)
	if err != nil {
		return []Finding{{Check: "broker." + bq.role, Subject: bq.name, Status: Warn, Detail: "exists; arguments not checked: " + err.Error(),
			Fix: "give the management user the monitoring tag and access to the vhost"}}
	}
	if !q.StatsIn() {
		// Type and arguments are there; the policies come with the first
		// statistics collection after a declare: wait for them.
		if full, err := mc.Queue(ctx, vhost, bq.name); err == nil {
			q = full
		}
	}
	var out []Finding
	check := "broker." + bq.role
	var problems []string
	if q.Type != string(bq.typ) {
		problems = append(problems, fmt.Sprintf("type %s, the topology declares %s", q.Type, bq.typ))
	}
	for _, k := range sortedKeys(bq.args) {
		if k == "x-queue-type" {
			continue
		}
		got, ok := q.Arguments[k]
		if !ok || fmt.Sprint(got) != fmt.Sprint(bq.args[k]) {
			problems = append(problems, fmt.Sprintf("argument %s = %v, the topology declares %v", k, show(got, ok), bq.args[k]))
		}
	}
	for _, k := range sortedKeys(q.Arguments) {
		if _, declared := bq.args[k]; !declared && k != "x-queue-type" {
			problems = append(problems, fmt.Sprintf("argument %s = %v, not in the topology", k, q.Arguments[k]))
		}
	}
	if len(problems) > 0 {
		f := Finding{Check: check, Subject: bq.name, Status: Fail, Detail: strings.Join(problems, "; "),
			Meaning: "the queue is not the one idemq plans for: consumers that declare the topology fail (PRECONDITION_FAILED), and the failure flow may not be idemq's",
			Fix:     "drain and delete the queue, then " + fixApply + "; or change the topology to match"}
		if bq.role == "retry-queue" && bq.route == topology.RouteRelease {
			if _, ttl := q.Arguments["x-message-ttl"]; ttl {
				f.Meaning = "a retry queue declared by an earlier idemq (retry_route: dead-letter): the broker's dead-letter path moves its deliveries, and consumers that declare the topology fail"
				f.Fix = "set retry_route: dead-letter in the topology, or drain and delete the retry queues (docs/OPERATIONS.md, upgrading)"
			}
		}
		out = append(out, f)
	} else {
		out = append(out, Finding{Check: check, Subject: bq.name, Status: Pass, Detail: fmt.Sprintf("exists, %s, arguments as declared", q.Type)})
	}
	if !q.StatsIn() {
		return append(out, Finding{Check: "broker.policy", Subject: bq.name, Status: Warn,
			Detail:  "not checked: the management API has not reported the queue's policies yet (it was declared a moment ago, or the broker is busy)",
			Meaning: "a policy that expires, drops or limits this queue's messages would not be seen",
			Fix:     "run the doctor again in a few seconds, or give it a longer --timeout"})
	}
	out = append(out, policyFindings(cfg, q, bq)...)
	return out
}

func show(v any, ok bool) string {
	if !ok {
		return "(none)"
	}
	return fmt.Sprint(v)
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// policyFindings checks the policy keys that apply to q (and the same
// settings given as arguments) for what drops, expires or limits
// messages behind idemq's back.
func policyFindings(cfg Config, q mgmt.Queue, bq brokerQueue) []Finding {
	def, err := q.Definition()
	if err != nil {
		return []Finding{{Check: "broker.policy", Subject: bq.name, Status: Warn, Detail: "not checked: " + err.Error()}}
	}
	var out []Finding
	policy := q.Policy
	if q.OperatorPolicy != "" {
		policy = strings.TrimPrefix(policy+", operator policy "+q.OperatorPolicy, ", ")
	}
	from := func(k string) string { return fmt.Sprintf("%s = %v (policy %s)", k, def[k], policy) }
	fixPolicy := fmt.Sprintf("remove the key from policy %s, or narrow its pattern so it does not match %s", policy, bq.name)
	if _, ok := def["message-ttl"]; ok && bq.role != "retry-queue" || ok && bq.route == topology.RouteRelease {
		out = append(out, Finding{Check: "broker.policy", Subject: bq.name, Status: Fail, Detail: from("message-ttl"),
			Meaning: "messages expire in the queue: the broker drops them or dead-letters them without idemq's reason",
			Fix:     fixPolicy})
	}
	if _, ok := def["expires"]; ok {
		out = append(out, Finding{Check: "broker.policy", Subject: bq.name, Status: Fail, Detail: from("expires"),
			Meaning: "the broker deletes the queue, with every message in it, once it is unused for that long",
			Fix:     fixPolicy})
	}
	for _, k := range []string{"max-length", "max-length-bytes"} {
		if _, ok := def[k]; !ok {
			continue
		}
		overflow := fmt.Sprint(def["overflow"])
		if overflow == "reject-publish" || overflow == "reject-publish-dlx" {
			out = append(out, Finding{Check: "broker.policy", Subject: bq.name, Status: Warn, Detail: from(k) + ", overflow " + overflow,
				Meaning: "publishes are refused (nacked) while the queue is full: idemq's publisher and relay retry them, so they wait", Fix: fixPolicy})
			continue
		}
		out = append(out, Finding{Check: "broker.policy", Subject: bq.name, Status: Fail, Detail: from(k) + ", overflow drop-head",
			Meaning: "when the queue is full the broker drops its oldest messages", Fix: fixPolicy + ", or set overflow: reject-publish"})
	}
	if bq.role == "retry-queue" && bq.route == topology.RouteRelease {
		if _, ok := def["dead-letter-exchange"]; ok {
			out = append(out, Finding{Check: "broker.policy", Subject: bq.name, Status: Warn, Detail: from("dead-letter-exchange"),
				Meaning: "a released retry queue needs no dead-letter route; with one, a message the broker drops goes somewhere idemq does not look",
				Fix:     fixPolicy})
		}
	}
	if bq.role == "queue" {
		out = append(out, limitFindings(q, bq)...)
		out = append(out, consumerTimeoutFindings(cfg, q, bq)...)
	}
	return out
}

// limitFindings compares the delivery limit the broker applies with the
// declared one.
func limitFindings(q mgmt.Queue, bq brokerQueue) []Finding {
	if bq.typ != topology.Quorum {
		return nil
	}
	l, err := mgmt.Resolve(q)
	if err != nil {
		return []Finding{{Check: "broker.delivery-limit", Subject: bq.name, Status: Warn, Detail: "not checked: " + err.Error()}}
	}
	declared, _ := bq.args[topology.ArgDeliveryLimit].(int64)
	if l.Source == mgmt.SourceNone || l.Source == mgmt.SourceArgument || (declared > 0 && int64(l.N) >= declared) {
		return []Finding{{Check: "broker.delivery-limit", Subject: bq.name, Status: Pass, Detail: "the broker applies " + l.String()}}
	}
	return []Finding{{Check: "broker.delivery-limit", Subject: bq.name, Status: Warn,
		Detail:  fmt.Sprintf("the broker applies %s, below the declared %d", l, declared),
		Meaning: "a consumer that does not read the policy keeps in-place requeues below the declared limit, not this one: a message deferred or given back often enough is dropped by the broker without idemq's reason",
		Fix:     fmt.Sprintf("give the consumers ConsumerConfig.ManagementURL (they then read it), or set retry.Config.RequeueLimit <= %d, or raise the policy's delivery-limit", l.N)}}
}

// consumerTimeoutFindings compares a queue's consumer timeout (argument
// x-consumer-timeout, or policy key consumer-timeout) with the handler
// deadline.
func consumerTimeoutFindings(cfg Config, q mgmt.Queue, bq brokerQueue) []Finding {
	timeout, source, ok, err := mgmt.ConsumerTimeout(q)
	if err != nil {
		return []Finding{{Check: "broker.consumer-timeout", Subject: bq.name, Status: Warn, Detail: "not checked: " + err.Error()}}
	}
	if !ok {
		return nil
	}
	f := Finding{Check: "broker.consumer-timeout", Subject: bq.name, Status: Pass, Detail: fmt.Sprintf("consumer timeout %v (%s)", timeout, source)}
	switch {
	case cfg.HandlerTimeout <= 0 && timeout < defaultConsumerTimeout:
		f.Status = Warn
		f.Detail += "; handler deadline not given"
		f.Meaning = fmt.Sprintf("a consumer without ManagementURL bounds its handlers below ConsumerTimeout (default %v), above this queue's timeout: a handler running longer than %v has its channel closed by the broker, and every delivery in flight on it is redelivered", defaultConsumerTimeout, timeout)
		f.Fix = fmt.Sprintf("give the consumers ManagementURL (they then bound handlers below it) or ConsumerConfig.ConsumerTimeout %v, and --handler-timeout to check the deadline", timeout)
	case cfg.HandlerTimeout <= 0:
		f.Detail += "; handler deadline not given, not compared"
	case timeout <= cfg.HandlerTimeout:
		f.Status = Fail
		f.Detail += fmt.Sprintf(" <= handler deadline %v", cfg.HandlerTimeout)
		f.Meaning = "the broker closes the channel of a consumer whose handler runs that long: every delivery in flight on it is redelivered, the slow one again and again"
		f.Fix = fmt.Sprintf("raise the queue's consumer timeout above %v, or give the consumers ManagementURL (they then bound handlers below it) or ConsumerConfig.ConsumerTimeout %v", cfg.HandlerTimeout, timeout)
	}
	return []Finding{f}
}
