package doctor

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/retry"
	"github.com/idemq/idemq/sqldb"
	"github.com/idemq/idemq/topology"
)

// Status is a finding's verdict.
type Status string

const (
	// Pass: the setting keeps the guarantee.
	Pass Status = "PASS"
	// Warn: the guarantee holds today but rests on something unchecked
	// or fragile (not readable, no persistence behind an inbox, a lag).
	Warn Status = "WARN"
	// Fail: a message can be lost or applied twice with this setting.
	Fail Status = "FAIL"
)

func (s Status) rank() int {
	switch s {
	case Fail:
		return 2
	case Warn:
		return 1
	}
	return 0
}

// Finding is the result of one check on one subject.
type Finding struct {
	// Check is a stable name ("redis.maxmemory-policy", "broker.dlq").
	Check string `json:"check"`
	// Subject is what was checked: a queue, a Redis address, a table.
	Subject string `json:"subject"`
	Status  Status `json:"status"`
	// Detail is what was found.
	Detail string `json:"detail"`
	// Meaning is what a WARN or FAIL means for exactly-once.
	Meaning string `json:"meaning,omitempty"`
	// Fix is the change that makes the check pass.
	Fix string `json:"fix,omitempty"`
}

// Report is every finding of a [Run], in check order.
type Report struct {
	Findings []Finding `json:"findings"`
}

// Worst is the most severe status in the report (PASS when empty).
func (r Report) Worst() Status {
	w := Pass
	for _, f := range r.Findings {
		if f.Status.rank() > w.rank() {
			w = f.Status
		}
	}
	return w
}

// Count is how many findings have status s.
func (r Report) Count(s Status) int {
	n := 0
	for _, f := range r.Findings {
		if f.Status == s {
			n++
		}
	}
	return n
}

// Log logs each finding that is not PASS once: FAIL at error level, WARN
// at warn level, with its meaning and fix.
func (r Report) Log(log *slog.Logger) {
	if log == nil {
		log = slog.Default()
	}
	for _, f := range r.Findings {
		lvl := slog.LevelWarn
		switch f.Status {
		case Pass:
			continue
		case Fail:
			lvl = slog.LevelError
		}
		log.Log(context.Background(), lvl, "idemq doctor: "+f.Check+" "+string(f.Status),
			"subject", f.Subject, "detail", f.Detail, "meaning", f.Meaning, "fix", f.Fix)
	}
}

// AtStart returns a function that runs the doctor on cfg and logs each
// finding that is not PASS once (Report.Log). It never fails: the findings
// are for the operator, and a cancelled context stops it quietly. Long
// running processes call it at start in the background: idemq's relay and
// gate do, and a consumer does when it is given as
// idemq.ConsumerConfig.AtStart.
func AtStart(log *slog.Logger, cfg Config) func(context.Context) {
	return func(ctx context.Context) {
		rep, err := Run(ctx, cfg)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if log == nil {
				log = slog.Default()
			}
			log.Warn("idemq doctor: not run", "err", err)
			return
		}
		rep.Log(log)
	}
}

// Config describes the deployment to check. Each part is checked when it
// is given; the zero value checks nothing.
type Config struct {
	// Topology is the deployment's queues as declared (topology.LoadFile).
	// The broker and horizon checks run for each of its queues.
	Topology topology.Topology

	// AMQPURL is the broker: each queue, dead-letter queue and retry
	// queue of Topology must exist. Empty: no broker checks.
	AMQPURL string
	// ManagementURL is the broker's management API
	// (http://user:password@host:15672; the monitoring tag is enough): the
	// queues' types and arguments against the topology, the policies that
	// apply to them, the delivery limit the broker applies, a queue's
	// consumer timeout. Empty: those checks are WARN "not checked".
	ManagementURL string
	// HTTPClient for the management API. Default: one with a 10 s timeout.
	HTTPClient *http.Client

	// Redis is the dedup store's Redis (a *redis.Client, a failover or a
	// cluster client). nil: no Redis checks.
	Redis redis.UniversalClient
	// RedisAddr names the Redis in findings. Default: the client's
	// address.
	RedisAddr string
	// RedisOnlyLine says the Redis guard is the only defence (no inbox in
	// the business transaction): a Redis without persistence is then a
	// FAIL (a restart forgets every done record) and one with
	// appendfsync everysec a WARN. Without it the inbox is the last line
	// and both PASS.
	RedisOnlyLine bool

	// DB is the SQL database holding idemq's tables. nil: no SQL checks.
	DB sqldb.DB
	// DedupTable, InboxTable and OutboxTable are the tables checked in DB
	// (migrations applied; the outbox's lag and failed rows). Empty: that
	// component is not checked.
	DedupTable, InboxTable, OutboxTable string
	// OutboxLagWarn and OutboxLagFail bound the age of the oldest pending
	// outbox row. Defaults 1 minute and 1 hour.
	OutboxLagWarn, OutboxLagFail time.Duration

	// Retry is the consumers' retry policy, without its delays (they come
	// from each queue of Topology, as retry.ForTopology takes them):
	// MaxAttempts, QuickAttempts. Its zero value is retry's defaults.
	Retry retry.Config
	// DedupWindow is the dedup guard's window (dedup.Config.Window); 0:
	// no guard, not checked.
	DedupWindow time.Duration
	// InboxWindow is the inbox's retention (inbox.Config.Window); 0: no
	// inbox, not checked.
	InboxWindow time.Duration
	// DeadLetterRetention is how long a dead letter may wait before it is
	// replayed. A replayed copy of a message that was applied by another
	// delivery must still find its record: the windows must cover the
	// retry horizon plus this. 0: replays are not counted in (a WARN says
	// how late a replay may come).
	DeadLetterRetention time.Duration
	// HandlerTimeout is the consumers' handler deadline
	// (idemq.ConsumerConfig.HandlerTimeout): a queue's consumer timeout
	// must exceed it. 0: not checked.
	HandlerTimeout time.Duration

	// Timeout bounds each dependency's checks. Default 10 s.
	Timeout time.Duration
}

func (c Config) withDefaults() Config {
	if c.OutboxLagWarn <= 0 {
		c.OutboxLagWarn = time.Minute
	}
	if c.OutboxLagFail <= 0 {
		c.OutboxLagFail = time.Hour
	}
	if c.Timeout <= 0 {
		c.Timeout = 10 * time.Second
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	return c
}

// Run checks the deployment described by cfg and returns every finding.
// It changes nothing. A dependency it cannot reach is a FAIL finding, not
// an error: Run returns an error only for a configuration it cannot use
// (an invalid topology).
func Run(ctx context.Context, cfg Config) (Report, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Topology.Validate(); err != nil {
		return Report{}, fmt.Errorf("doctor: %w", err)
	}
	var r Report
	add := func(fs ...Finding) { r.Findings = append(r.Findings, fs...) }
	add(topologyFindings(cfg)...)
	add(horizonFindings(cfg)...)
	if cfg.AMQPURL != "" {
		add(within(ctx, cfg.Timeout, func(ctx context.Context) []Finding { return brokerFindings(ctx, cfg) })...)
	}
	if cfg.Redis != nil {
		add(within(ctx, cfg.Timeout, func(ctx context.Context) []Finding { return redisFindings(ctx, cfg) })...)
	}
	if cfg.DB != nil {
		add(within(ctx, cfg.Timeout, func(ctx context.Context) []Finding { return sqlFindings(ctx, cfg) })...)
	}
	return r, nil
}

func within(ctx context.Context, d time.Duration, f func(context.Context) []Finding) []Finding {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return f(ctx)
}

// topologyFindings checks what the topology itself declares: the retry
// route of each queue.
func topologyFindings(cfg Config) []Finding {
	var out []Finding
	for _, q := range cfg.Topology.Queues {
		p := topology.ForQueue(q)
		if len(p.Retries) == 0 {
			continue
		}
		f := Finding{Check: "topology.retry-route", Subject: "queue " + q.Name, Status: Pass,
			Detail: fmt.Sprintf("%s retry queues, route %s", retryType(q), p.RetryRoute)}
		switch {
		case p.RetryRoute == topology.RouteDeadLetter && p.Type == topology.Quorum && retryType(q) == topology.Classic:
			f.Status = Fail
			f.Meaning = "deliveries waiting for a retry are dropped when the broker restarts (RabbitMQ drops what classic retry queues dead-letter to a quorum queue without a leader: 300 of 900 lost through 3 restarts in idemq's tests)"
			f.Fix = "retry_route: release (the default; drain and delete the retry queues first, docs/OPERATIONS.md)"
		case p.RetryRoute == topology.RouteDeadLetter:
			f.Status = Warn
			f.Meaning = "after a broker restart RabbitMQ 3.10 can hold expired retries in its dead-letter path for minutes: they arrive late"
			f.Fix = "retry_route: release (the default; drain and delete the retry queues first, docs/OPERATIONS.md)"
		}
		out = append(out, f)
	}
	return out
}

func retryType(q topology.Queue) topology.QueueType {
	if q.RetryType == "" {
		return topology.Quorum
	}
	return q.RetryType
}

// horizonFindings checks the dedup window and the inbox retention against
// the longest retry horizon of the topology's queues, plus the
// dead-letter retention.
func horizonFindings(cfg Config) []Finding {
	if cfg.DedupWindow <= 0 && cfg.InboxWindow <= 0 {
		return nil
	}
	var horizon time.Duration
	var longest string
	for _, q := range cfg.Topology.Queues {
		if h := retry.Horizon(retry.ForTopology(q, cfg.Retry)); h >= horizon {
			horizon, longest = h, q.Name
		}
	}
	if longest == "" { // no queue: the policy's own delays
		horizon, longest = retry.Horizon(cfg.Retry), "the retry policy"
	}
	need := horizon + cfg.DeadLetterRetention
	var out []Finding
	for _, w := range []struct {
		check, name, field string
		window             time.Duration
	}{
		{"horizon.dedup-window", "dedup window", "dedup.Config.Window (idemq gate --window)", cfg.DedupWindow},
		{"horizon.inbox-window", "inbox retention", "inbox.Config.Window", cfg.InboxWindow},
	} {
		if w.window <= 0 {
			continue
		}
		f := Finding{Check: w.check, Subject: w.name}
		switch {
		case w.window < horizon:
			f.Status = Fail
			f.Detail = fmt.Sprintf("%s %v < retry horizon %v (%s)", w.name, w.window, horizon, longest)
			f.Meaning = fmt.Sprintf("a message retried after %v finds no record and applies its effect a second time", w.window)
			f.Fix = fmt.Sprintf("set %s to at least %v", w.field, need.Round(time.Second))
		case w.window < need:
			f.Status = Fail
			f.Detail = fmt.Sprintf("%s %v < retry horizon %v + dead-letter retention %v", w.name, w.window, horizon, cfg.DeadLetterRetention)
			f.Meaning = fmt.Sprintf("a dead letter replayed more than %v after its first delivery is applied again if another copy of it was applied", w.window-horizon)
			f.Fix = fmt.Sprintf("set %s to at least %v, or replay dead letters within %v", w.field, need.Round(time.Second), (w.window - horizon).Round(time.Second))
		case cfg.DeadLetterRetention == 0:
			f.Status = Warn
			f.Detail = fmt.Sprintf("%s %v covers the retry horizon %v (%s); dead-letter retention not given", w.name, w.window, horizon, longest)
			f.Meaning = fmt.Sprintf("a dead letter replayed more than %v after its first delivery is applied again if another copy of it was applied", (w.window - horizon).Round(time.Second))
			f.Fix = "give the dead-letter retention (--dead-letter-retention) to check it, or replay dead letters within that time"
		default:
			f.Status = Pass
			f.Detail = fmt.Sprintf("%s %v >= retry horizon %v + dead-letter retention %v", w.name, w.window, horizon, cfg.DeadLetterRetention)
		}
		out = append(out, f)
	}
	return out
}
