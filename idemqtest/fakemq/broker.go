package fakemq

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Config configures a [Broker]. The zero value is usable.
type Config struct {
	// FrameMax is the largest frame the broker proposes (the client may
	// ask for less). Default 131072, RabbitMQ's.
	FrameMax int
	// Heartbeat is the heartbeat interval the broker proposes; the
	// client's wins when both are set (amqp091-go asks for 10s). The
	// broker sends heartbeats at the negotiated interval. Default 0
	// (the client's).
	Heartbeat time.Duration
}

// ErrClosed is returned by [Broker.Dial] after [Broker.Close].
var ErrClosed = errors.New("fakemq: broker closed")

// Broker is an in-memory AMQP 0-9-1 broker with one virtual host. Connect
// to it with [Broker.Dial], which has the signature of idemq's
// ConsumerConfig.Dial and PublisherConfig.Dial. It is safe for concurrent
// use.
type Broker struct {
	cfg Config

	mu        sync.Mutex
	closed    bool
	exchanges map[string]*exchange
	queues    map[string]*queue
	conns     map[*conn]struct{}
	seq       uint64 // enqueue order, for requeues
}

// New returns a running broker with the default exchange and amq.direct,
// amq.fanout and amq.topic declared.
func New(cfg Config) *Broker {
	if cfg.FrameMax <= 0 {
		cfg.FrameMax = 131072
	}
	if cfg.FrameMax < 4096 {
		cfg.FrameMax = 4096
	}
	b := &Broker{cfg: cfg, exchanges: map[string]*exchange{}, queues: map[string]*queue{}, conns: map[*conn]struct{}{}}
	for name, typ := range map[string]string{"": "direct", "amq.direct": "direct", "amq.fanout": "fanout", "amq.topic": "topic"} {
		b.exchanges[name] = &exchange{name: name, typ: typ, durable: true}
	}
	return b
}

// Dial opens a connection to the broker, whatever the URL (its user,
// password, host and virtual host are not checked), with cfg's SASL,
// heartbeat, frame size and properties negotiated as with RabbitMQ. Pass
// it as idemq's ConsumerConfig.Dial or PublisherConfig.Dial.
func (b *Broker) Dial(url string, cfg amqp.Config) (*amqp.Connection, error) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, ErrClosed
	}
	// As amqp.DialConfig does: credentials and virtual host from the URL.
	if uri, err := amqp.ParseURI(url); err == nil {
		if cfg.SASL == nil {
			cfg.SASL = []amqp.Authentication{uri.PlainAuth()}
		}
		if cfg.Vhost == "" {
			cfg.Vhost = uri.Vhost
		}
	} else if cfg.SASL == nil {
		cfg.SASL = []amqp.Authentication{&amqp.PlainAuth{Username: "guest", Password: "guest"}}
	}
	client, server := net.Pipe()
	c := newConn(b, server)
	b.conns[c] = struct{}{}
	b.mu.Unlock()
	go c.serve()
	conn, err := amqp.Open(client, cfg)
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("fakemq: open: %w", err)
	}
	return conn, nil
}

// DropConnections cuts every open connection without a close handshake,
// as a network failure or a broker restart does: the clients see their
// connection die, and the broker gives every unacknowledged delivery
// back to its queue, marked redelivered. Queues and their messages stay.
func (b *Broker) DropConnections() {
	b.mu.Lock()
	conns := make([]*conn, 0, len(b.conns))
	for c := range b.conns {
		conns = append(conns, c)
	}
	b.mu.Unlock()
	for _, c := range conns {
		c.drop()
	}
}

// Close drops every connection and refuses new ones.
func (b *Broker) Close() {
	b.mu.Lock()
	b.closed = true
	for _, q := range b.queues {
		if q.timer != nil {
			q.timer.Stop()
		}
	}
	b.mu.Unlock()
	b.DropConnections()
}

// QueueInfo is a queue's state as [Broker.Queue] reads it.
type QueueInfo struct {
	Name string
	// Ready is how many messages wait for a consumer; Unacked how many
	// were delivered and not yet settled.
	Ready, Unacked int
	Consumers      int
	// Args are the queue's arguments as declared.
	Args amqp.Table
}

// Queue reports on a queue, false if it does not exist.
func (b *Broker) Queue(name string) (QueueInfo, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	q, ok := b.queues[name]
	if !ok {
		return QueueInfo{}, false
	}
	return QueueInfo{Name: q.name, Ready: len(q.ready), Unacked: q.unacked, Consumers: len(q.consumers), Args: q.args}, true
}

type exchange struct {
	name, typ  string
	durable    bool
	autoDelete bool
	internal   bool
	args       amqp.Table
	bindings   []binding
}

type binding struct{ queue, key string }

// message is one copy of a message in one queue.
type message struct {
	exchange, routingKey string
	props                properties
	body                 []byte
	seq                  uint64
	redelivered          bool
	returned             int64     // quorum: deliveries given back (x-delivery-count)
	expires              time.Time // zero: never
}

type queue struct {
	name                          string
	durable, exclusive, autoDelet bool
	owner                         *conn
	args                          amqp.Table
	quorum                        bool
	ttl                           time.Duration
	hasTTL                        bool
	dlx, dlrk                     *string
	deliveryLimit                 int64 // -1: none
	ready                         []*message
	consumers                     []*consumer
	rr                            int
	unacked                       int
	timer                         *time.Timer
	timerAt                       time.Time
	hadConsumer                   bool
}

type consumer struct {
	tag      string
	ch       *channel
	q        *queue
	noAck    bool
	prefetch int
	unacked  int
}

func randName(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// amqpError is a channel or connection exception to send.
type amqpError struct {
	code uint16
	text string
	conn bool // a connection exception
}

func (e *amqpError) Error() string { return strconv.Itoa(int(e.code)) + " " + e.text }

func chErr(code uint16, format string, args ...any) *amqpError {
	return &amqpError{code: code, text: fmt.Sprintf(format, args...)}
}

const (
	codeNoRoute         = 312
	codeAccessRefused   = 403
	codeNotFound        = 404
	codeResourceLocked  = 405
	codePrecondition    = 406
	codeConnForced      = 320
	codeCommandInvalid  = 503
	codeNotAllowed      = 530
	codeNotImplemented  = 540
	codeFrameError      = 501
	codeUnexpectedFrame = 505
)

func notFound(kind, name string) *amqpError {
	return chErr(codeNotFound, "NOT_FOUND - no %s '%s' in vhost '/'", kind, name)
}

// toInt64 reads an integer argument of any integer type.
func toInt64(v any) (int64, bool) {
	switch v := v.(type) {
	case int8:
		return int64(v), true
	case uint8:
		return int64(v), true
	case int16:
		return int64(v), true
	case uint16:
		return int64(v), true
	case int32:
		return int64(v), true
	case uint32:
		return int64(v), true
	case int64:
		return v, true
	case int:
		return int64(v), true
	}
	return 0, false
}

// queueArgs are the arguments compared on a redeclare and the ones the
// fake acts on.
var queueArgs = []string{"x-queue-type", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
	"x-delivery-limit", "x-max-length", "x-max-length-bytes", "x-overflow", "x-dead-letter-strategy", "x-expires", "x-max-priority"}

func argString(v any) string {
	if n, ok := toInt64(v); ok {
		return strconv.FormatInt(n, 10)
	}
	return fmt.Sprint(v)
}

// newQueue checks a declaration's arguments and builds the queue.
func newQueue(name string, durable, exclusive, autoDelete bool, args amqp.Table) (*queue, *amqpError) {
	q := &queue{name: name, durable: durable, exclusive: exclusive, autoDelet: autoDelete, args: args, deliveryLimit: -1}
	switch t := args["x-queue-type"]; t {
	case nil, "classic":
	case "quorum":
		if !durable || exclusive || autoDelete {
			return nil, chErr(codePrecondition, "PRECONDITION_FAILED - invalid property '%s' for queue '%s' in vhost '/'",
				map[bool]string{true: "exclusive", false: map[bool]string{true: "auto-delete", false: "non-durable"}[autoDelete]}[exclusive], name)
		}
		q.quorum = true
	default:
		return nil, chErr(codePrecondition, "PRECONDITION_FAILED - invalid arg 'x-queue-type' for queue '%s' in vhost '/': fakemq models classic and quorum queues, not %v", name, t)
	}
	for _, k := range []string{"x-max-length", "x-max-length-bytes", "x-max-priority", "x-expires"} {
		if _, ok := args[k]; ok {
			return nil, chErr(codeNotImplemented, "NOT_IMPLEMENTED - fakemq does not model queue argument %s", k)
		}
	}
	if v, ok := args["x-message-ttl"]; ok {
		n, isInt := toInt64(v)
		if !isInt || n < 0 {
			return nil, chErr(codePrecondition, "PRECONDITION_FAILED - invalid arg 'x-message-ttl' for queue '%s' in vhost '/': {value_negative,%v}", name, v)
		}
		q.ttl, q.hasTTL = time.Duration(n)*time.Millisecond, true
	}
	if v, ok := args["x-dead-letter-exchange"]; ok {
		s, _ := v.(string)
		q.dlx = &s
	}
	if v, ok := args["x-dead-letter-routing-key"]; ok {
		s, _ := v.(string)
		q.dlrk = &s
	}
	if v, ok := args["x-delivery-limit"]; ok && q.quorum {
		if n, isInt := toInt64(v); isInt && n >= 0 {
			q.deliveryLimit = n
		}
	}
	return q, nil
}

// equivalent reports how a redeclaration differs from q, nil if it does not.
func (q *queue) equivalent(durable, exclusive, autoDelete bool, args amqp.Table) *amqpError {
	if durable != q.durable {
		return chErr(codePrecondition, "PRECONDITION_FAILED - inequivalent arg 'durable' for queue '%s' in vhost '/': received '%v' but current is '%v'", q.name, durable, q.durable)
	}
	if autoDelete != q.autoDelet {
		return chErr(codePrecondition, "PRECONDITION_FAILED - inequivalent arg 'auto_delete' for queue '%s' in vhost '/': received '%v' but current is '%v'", q.name, autoDelete, q.autoDelet)
	}
	for _, k := range queueArgs {
		a, aok := args[k]
		c, cok := q.args[k]
		if k == "x-queue-type" {
			// An absent type matches the queue's own (RabbitMQ 3.x).
			if !aok {
				continue
			}
			if !cok {
				c, cok = "classic", true
			}
		}
		if aok != cok || (aok && argString(a) != argString(c)) {
			return chErr(codePrecondition, "PRECONDITION_FAILED - inequivalent arg '%s' for queue '%s' in vhost '/': received %s but current is %s",
				k, q.name, describeArg(a, aok), describeArg(c, cok))
		}
	}
	return nil
}

func describeArg(v any, ok bool) string {
	if !ok {
		return "none"
	}
	return fmt.Sprintf("'%v'", v)
}

// route returns the queues a message published to ex with key goes to.
func (b *Broker) route(ex *exchange, key string) []*queue {
	if ex.name == "" {
		if q, ok := b.queues[key]; ok {
			return []*queue{q}
		}
		return nil
	}
	seen := map[string]bool{}
	var out []*queue
	for _, bd := range ex.bindings {
		var match bool
		switch ex.typ {
		case "fanout":
			match = true
		case "topic":
			match = topicMatch(strings.Split(bd.key, "."), strings.Split(key, "."))
		default:
			match = bd.key == key
		}
		if q, ok := b.queues[bd.queue]; match && ok && !seen[bd.queue] {
			seen[bd.queue] = true
			out = append(out, q)
		}
	}
	return out
}

// topicMatch matches a binding pattern (* one word, # zero or more) to a key.
func topicMatch(pattern, key []string) bool {
	if len(pattern) == 0 {
		return len(key) == 0
	}
	switch pattern[0] {
	case "#":
		for i := 0; i <= len(key); i++ {
			if topicMatch(pattern[1:], key[i:]) {
				return true
			}
		}
		return false
	case "*":
		return len(key) > 0 && topicMatch(pattern[1:], key[1:])
	default:
		return len(key) > 0 && key[0] == pattern[0] && topicMatch(pattern[1:], key[1:])
	}
}

// enqueue puts a copy of m on each queue and delivers what it can.
func (b *Broker) enqueue(m *message, qs []*queue, now time.Time) {
	for _, q := range qs {
		cp := *m
		b.seq++
		cp.seq = b.seq
		cp.redelivered, cp.returned = false, 0
		cp.expires = time.Time{}
		if q.hasTTL {
			cp.expires = now.Add(q.ttl)
		}
		if m.props.Expiration != "" {
			if ms, err := strconv.ParseInt(m.props.Expiration, 10, 64); err == nil && ms >= 0 {
				if at := now.Add(time.Duration(ms) * time.Millisecond); cp.expires.IsZero() || at.Before(cp.expires) {
					cp.expires = at
				}
			}
		}
		q.ready = append(q.ready, &cp)
		b.dispatch(q, now)
	}
}

// requeue gives m back to q at its original place, marked redelivered.
// A quorum queue counts the return and dead-letters the message past its
// delivery limit.
func (b *Broker) requeue(q *queue, m *message, now time.Time) {
	if b.queues[q.name] != q {
		return // deleted meanwhile
	}
	m.redelivered = true
	if q.quorum {
		m.returned++
		if q.deliveryLimit >= 0 && m.returned > q.deliveryLimit {
			b.deadLetter(q, m, "delivery_limit", now)
			return
		}
	}
	i := sort.Search(len(q.ready), func(i int) bool { return q.ready[i].seq > m.seq })
	q.ready = append(q.ready, nil)
	copy(q.ready[i+1:], q.ready[i:])
	q.ready[i] = m
}

// expireHead dead-letters the expired messages at the head of q (RabbitMQ
// expires a message when it reaches the head) and arms q's timer for the
// next one.
func (b *Broker) expireHead(q *queue, now time.Time) {
	for len(q.ready) > 0 && !q.ready[0].expires.IsZero() && !now.Before(q.ready[0].expires) {
		m := q.ready[0]
		q.ready = q.ready[1:]
		b.deadLetter(q, m, "expired", now)
	}
	if len(q.ready) == 0 || q.ready[0].expires.IsZero() || b.closed {
		return
	}
	at := q.ready[0].expires
	if q.timer != nil && q.timerAt.Equal(at) {
		return
	}
	if q.timer != nil {
		q.timer.Stop()
	}
	q.timerAt = at
	q.timer = time.AfterFunc(at.Sub(now), func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.queues[q.name] != q {
			return
		}
		q.timer = nil
		b.dispatch(q, time.Now())
	})
}

// deadLetter republishes m from q to q's dead-letter exchange with an
// x-death entry for reason (rejected, expired, delivery_limit), as
// RabbitMQ 3.x does; without a dead-letter exchange it drops m.
func (b *Broker) deadLetter(q *queue, m *message, reason string, now time.Time) {
	if q.dlx == nil {
		return
	}
	ex, ok := b.exchanges[*q.dlx]
	if !ok {
		return // RabbitMQ drops it too
	}
	key := m.routingKey
	if q.dlrk != nil {
		key = *q.dlrk
	}
	h := amqp.Table{}
	for k, v := range m.props.Headers {
		h[k] = v
	}
	entry := amqp.Table{"reason": reason, "queue": q.name, "time": now.Truncate(time.Second),
		"exchange": m.exchange, "routing-keys": []any{m.routingKey}}
	if m.props.Expiration != "" {
		entry["original-expiration"] = m.props.Expiration
	}
	entry["count"] = int64(1)
	old, had := h["x-death"].([]any)
	var deaths []any
	for _, d := range old {
		t, ok := d.(amqp.Table)
		if ok && t["queue"] == q.name && t["reason"] == reason {
			// The entry for this queue and reason moves to the front with
			// its count up by one; the rest of it stays as it was.
			entry = amqp.Table{}
			for k, v := range t {
				entry[k] = v
			}
			n, _ := toInt64(t["count"])
			entry["count"] = n + 1
			continue
		}
		deaths = append(deaths, d)
	}
	h["x-death"] = append([]any{entry}, deaths...)
	if !had {
		h["x-first-death-reason"] = reason
		h["x-first-death-queue"] = q.name
		h["x-first-death-exchange"] = m.exchange
	}
	dl := &message{exchange: ex.name, routingKey: key, props: m.props, body: m.body}
	dl.props.Headers = h
	dl.props.Expiration = ""
	var targets []*queue
	for _, t := range b.route(ex, key) {
		if reason != "rejected" && cycles(old, t.name) {
			continue // RabbitMQ drops a message that would go round a cycle with no rejection in it
		}
		targets = append(targets, t)
	}
	b.enqueue(dl, targets, now)
}

// cycles reports whether dead-lettering to target closes a cycle without a
// rejection: target appears in x-death, and no entry up to it was rejected.
func cycles(deaths []any, target string) bool {
	for _, d := range deaths {
		t, _ := d.(amqp.Table)
		if t["reason"] == "rejected" {
			return false
		}
		if t["queue"] == target {
			return true
		}
	}
	return false
}

// dispatch expires q's head and hands ready messages to its consumers in
// turn while they have room under their prefetch.
func (b *Broker) dispatch(q *queue, now time.Time) {
	for {
		b.expireHead(q, now)
		if len(q.ready) == 0 || len(q.consumers) == 0 {
			return
		}
		var cons *consumer
		for i := 0; i < len(q.consumers); i++ {
			c := q.consumers[(q.rr+i)%len(q.consumers)]
			if c.hasRoom() {
				cons = c
				q.rr = (q.rr + i + 1) % len(q.consumers)
				break
			}
		}
		if cons == nil {
			return
		}
		m := q.ready[0]
		q.ready = q.ready[1:]
		cons.ch.deliver(cons, q, m)
	}
}

func (c *consumer) hasRoom() bool {
	if c.ch.closing || !c.ch.flow {
		return false
	}
	if c.noAck {
		return true
	}
	if c.prefetch > 0 && c.unacked >= c.prefetch {
		return false
	}
	return c.ch.prefetchGlobal == 0 || len(c.ch.unacked) < c.ch.prefetchGlobal
}

// deleteQueue removes q, cancelling its consumers (with a basic.cancel to
// their clients) and dropping its messages. It returns how many were ready.
func (b *Broker) deleteQueue(q *queue) int {
	n := len(q.ready)
	delete(b.queues, q.name)
	if q.timer != nil {
		q.timer.Stop()
	}
	for _, c := range q.consumers {
		delete(c.ch.consumers, c.tag)
		c.ch.c.send(c.ch.id, encodeMethod(bCancel, c.tag, true))
	}
	q.consumers = nil
	for _, ex := range b.exchanges {
		kept := ex.bindings[:0]
		for _, bd := range ex.bindings {
			if bd.queue != q.name {
				kept = append(kept, bd)
			}
		}
		ex.bindings = kept
	}
	return n
}

// removeConsumer takes c off its queue; an auto-delete queue goes with its
// last consumer.
func (b *Broker) removeConsumer(c *consumer) {
	q := c.q
	for i, x := range q.consumers {
		if x == c {
			q.consumers = append(q.consumers[:i], q.consumers[i+1:]...)
			break
		}
	}
	delete(c.ch.consumers, c.tag)
	if q.autoDelet && q.hadConsumer && len(q.consumers) == 0 && b.queues[q.name] == q {
		b.deleteQueue(q)
	}
}
