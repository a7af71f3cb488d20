package fakemq

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"sort"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// conn is the broker's end of one client connection. Frames are handled
// one at a time on the reader goroutine under the broker's lock; what is
// sent is queued (never blocking under the lock) and written by a writer
// goroutine.
type conn struct {
	b        *Broker
	rw       net.Conn
	frameMax int
	channels map[uint16]*channel
	gone     bool // released (under b.mu)

	outMu   sync.Mutex
	outCond *sync.Cond
	out     []byte
	outDone bool
	once    sync.Once
}

func newConn(b *Broker, rw net.Conn) *conn {
	c := &conn{b: b, rw: rw, frameMax: b.cfg.FrameMax, channels: map[uint16]*channel{}}
	c.outCond = sync.NewCond(&c.outMu)
	return c
}

// channel is one AMQP channel's state.
type channel struct {
	id             uint16
	c              *conn
	nextTag        uint64
	unacked        map[uint64]*pending
	consumers      map[string]*consumer
	prefetch       int // per consumer, for consumers created after
	prefetchGlobal int
	confirm        bool
	publishSeq     uint64
	closing        bool // a server-side close awaits the client's close-ok
	flow           bool
	pub            *publishing
}

type pending struct {
	m    *message
	q    *queue
	cons *consumer // nil for basic.get
}

// publishing is a basic.publish awaiting its content.
type publishing struct {
	exchange, key string
	mandatory     bool
	props         properties
	size          uint64
	body          []byte
	gotHeader     bool
}

func (c *conn) sendFrames(frames []byte) {
	c.outMu.Lock()
	c.out = append(c.out, frames...)
	c.outMu.Unlock()
	c.outCond.Signal()
}

func (c *conn) send(ch uint16, method []byte) {
	c.sendFrames(appendFrame(nil, frameMethod, ch, method))
}

// sendContent sends a method with a message's header and body frames, in
// one piece so nothing interleaves.
func (c *conn) sendContent(ch uint16, method []byte, props properties, body []byte) {
	f := appendFrame(nil, frameMethod, ch, method)
	f = appendFrame(f, frameHeader, ch, encodeHeader(uint64(len(body)), props))
	max := c.frameMax - frameOverhead
	for len(body) > 0 {
		n := min(max, len(body))
		f = appendFrame(f, frameBody, ch, body[:n])
		body = body[n:]
	}
	c.sendFrames(f)
}

func (c *conn) writer() {
	for {
		c.outMu.Lock()
		for len(c.out) == 0 && !c.outDone {
			c.outCond.Wait()
		}
		buf, done := c.out, c.outDone
		c.out = nil
		c.outMu.Unlock()
		if len(buf) > 0 {
			if _, err := c.rw.Write(buf); err != nil {
				c.drop()
				return
			}
		}
		if done {
			c.rw.Close()
			return
		}
	}
}

// closeAfterFlush closes the connection once what is queued is written.
func (c *conn) closeAfterFlush() {
	c.outMu.Lock()
	c.outDone = true
	c.outMu.Unlock()
	c.outCond.Signal()
}

// drop closes the socket at once.
func (c *conn) drop() {
	c.once.Do(func() {
		c.rw.Close()
		c.outMu.Lock()
		c.outDone = true
		c.out = nil
		c.outMu.Unlock()
		c.outCond.Signal()
	})
}

// serve runs the connection: handshake, then frames until it ends.
func (c *conn) serve() {
	defer func() {
		c.drop()
		c.b.mu.Lock()
		c.release()
		c.b.mu.Unlock()
	}()
	go c.writer()
	r := bufio.NewReader(c.rw)
	var hdr [8]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return
	}
	if string(hdr[:]) != "AMQP\x00\x00\x09\x01" {
		c.sendFrames([]byte("AMQP\x00\x00\x09\x01"))
		c.closeAfterFlush()
		return
	}
	c.send(0, encodeMethod(connStart, uint8(0), uint8(9), amqp.Table{
		"product": "fakemq", "version": "3.10-model", "platform": "Go",
		"capabilities": amqp.Table{"publisher_confirms": true, "basic.nack": true, "consumer_cancel_notify": true,
			"exchange_exchange_bindings": false, "connection.blocked": true, "per_consumer_qos": true,
			"authentication_failure_close": true},
	}, "PLAIN AMQPLAIN", "en_US"))
	hb := uint16(c.b.cfg.Heartbeat / time.Second)
	for {
		f, err := readFrame(r, 0)
		if err != nil {
			return
		}
		if f.typ == frameHeartbeat {
			continue
		}
		if f.typ != frameMethod || f.channel != 0 {
			return
		}
		id, args, err := decodeMethod(f.payload)
		if err != nil {
			return
		}
		switch id {
		case connStartOk:
			c.send(0, encodeMethod(connTune, uint16(2047), uint32(c.frameMax), hb))
		case connTuneOk:
			if fm := int(args[1].(uint32)); fm > 0 && fm < c.frameMax {
				c.frameMax = fm
			}
			if s := args[2].(uint16); s > 0 {
				go c.heartbeats(time.Duration(s) * time.Second)
			}
		case connOpen:
			c.send(0, encodeMethod(connOpenOk, ""))
			c.loop(r)
			return
		default:
			return
		}
	}
}

func (c *conn) heartbeats(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for range t.C {
		c.outMu.Lock()
		done := c.outDone
		c.outMu.Unlock()
		if done {
			return
		}
		c.sendFrames(appendFrame(nil, frameHeartbeat, 0, nil))
	}
}

// loop handles frames after the handshake.
func (c *conn) loop(r *bufio.Reader) {
	for {
		f, err := readFrame(r, c.frameMax)
		if err != nil {
			return
		}
		c.b.mu.Lock()
		stop := c.frame(f)
		c.b.mu.Unlock()
		if stop {
			return
		}
	}
}

// connError closes the connection with a connection exception.
func (c *conn) connError(e *amqpError, id methodID) bool {
	c.release()
	c.send(0, encodeMethod(connClose, e.code, e.text, id.class(), id.method()))
	c.closeAfterFlush()
	return true
}

// frame handles one frame under b.mu; true ends the connection.
func (c *conn) frame(f frame) bool {
	if c.gone {
		return true
	}
	switch f.typ {
	case frameHeartbeat:
		return false
	case frameMethod:
	case frameHeader, frameBody:
		ch := c.channels[f.channel]
		if ch == nil || ch.closing {
			return false
		}
		if ch.pub == nil {
			return c.connError(chErr(codeUnexpectedFrame, "UNEXPECTED_FRAME - content frame without a publish"), 0)
		}
		return c.content(ch, f)
	default:
		return c.connError(chErr(codeFrameError, "FRAME_ERROR - unknown frame type %d", f.typ), 0)
	}
	id, args, err := decodeMethod(f.payload)
	if err != nil {
		return c.connError(&amqpError{code: codeNotImplemented, text: "NOT_IMPLEMENTED - " + err.Error(), conn: true}, id)
	}
	if f.channel == 0 {
		switch id {
		case connClose:
			c.release()
			c.send(0, encodeMethod(connCloseOk))
			c.closeAfterFlush()
			return true
		case connCloseOk:
			return true
		default:
			return c.connError(chErr(codeCommandInvalid, "COMMAND_INVALID - method %d.%d on channel 0", id.class(), id.method()), id)
		}
	}
	ch := c.channels[f.channel]
	if id == chOpen {
		if ch != nil {
			return c.connError(chErr(codeNotAllowed, "NOT_ALLOWED - channel %d already open", f.channel), id)
		}
		c.channels[f.channel] = &channel{id: f.channel, c: c, unacked: map[uint64]*pending{}, consumers: map[string]*consumer{}, flow: true}
		c.send(f.channel, encodeMethod(chOpenOk, ""))
		return false
	}
	if ch == nil {
		return c.connError(chErr(codeCommandInvalid, "COMMAND_INVALID - channel %d not open", f.channel), id)
	}
	if ch.closing {
		if id == chCloseOk || id == chClose {
			delete(c.channels, ch.id)
			if id == chClose {
				c.send(ch.id, encodeMethod(chCloseOk))
			}
		}
		return false
	}
	if ch.pub != nil {
		return c.connError(chErr(codeUnexpectedFrame, "UNEXPECTED_FRAME - method %d.%d inside a publish's content", id.class(), id.method()), id)
	}
	if e := c.method(ch, id, args); e != nil {
		if e.conn {
			return c.connError(e, id)
		}
		c.releaseChannel(ch)
		ch.closing = true
		c.send(ch.id, encodeMethod(chClose, e.code, e.text, id.class(), id.method()))
	}
	return false
}

// release gives back every channel's deliveries, and deletes the
// connection's exclusive queues.
func (c *conn) release() {
	if c.gone {
		return
	}
	c.gone = true
	delete(c.b.conns, c)
	ids := make([]int, 0, len(c.channels))
	for id := range c.channels {
		ids = append(ids, int(id))
	}
	sort.Ints(ids)
	for _, id := range ids {
		c.releaseChannel(c.channels[uint16(id)])
	}
	for _, q := range c.b.queues {
		if q.exclusive && q.owner == c {
			c.b.deleteQueue(q)
		}
	}
}

// releaseChannel cancels ch's consumers and requeues its unacked
// deliveries (marked redelivered), in delivery order.
func (c *conn) releaseChannel(ch *channel) {
	for _, cons := range ch.consumers {
		c.b.removeConsumer(cons)
	}
	tags := make([]uint64, 0, len(ch.unacked))
	for t := range ch.unacked {
		tags = append(tags, t)
	}
	sort.Slice(tags, func(i, j int) bool { return tags[i] < tags[j] })
	touched := map[*queue]bool{}
	now := time.Now()
	for _, t := range tags {
		p := ch.unacked[t]
		delete(ch.unacked, t)
		p.q.unacked--
		c.b.requeue(p.q, p.m, now)
		touched[p.q] = true
	}
	ch.pub = nil
	for q := range touched {
		if c.b.queues[q.name] == q {
			c.b.dispatch(q, now)
		}
	}
}

// deliver sends m from q to cons.
func (ch *channel) deliver(cons *consumer, q *queue, m *message) {
	ch.nextTag++
	tag := ch.nextTag
	if !cons.noAck {
		ch.unacked[tag] = &pending{m: m, q: q, cons: cons}
		cons.unacked++
		q.unacked++
	}
	ch.c.sendContent(ch.id, encodeMethod(bDeliver, cons.tag, tag, m.redelivered, m.exchange, m.routingKey), deliveryProps(q, m), m.body)
}

// deliveryProps are m's properties as delivered from q: a quorum queue
// adds x-delivery-count once the message was given back.
func deliveryProps(q *queue, m *message) properties {
	p := m.props
	if q.quorum && m.returned > 0 {
		h := amqp.Table{}
		for k, v := range p.Headers {
			h[k] = v
		}
		h["x-delivery-count"] = m.returned
		p.Headers = h
	}
	return p
}

// content handles a publish's header and body frames.
func (c *conn) content(ch *channel, f frame) bool {
	p := ch.pub
	if f.typ == frameHeader {
		if p.gotHeader {
			return c.connError(chErr(codeUnexpectedFrame, "UNEXPECTED_FRAME - second content header"), bPublish)
		}
		size, props, err := decodeHeader(f.payload)
		if err != nil {
			return c.connError(chErr(codeFrameError, "FRAME_ERROR - content header: %v", err), bPublish)
		}
		p.gotHeader, p.size, p.props = true, size, props
	} else {
		if !p.gotHeader {
			return c.connError(chErr(codeUnexpectedFrame, "UNEXPECTED_FRAME - body before header"), bPublish)
		}
		p.body = append(p.body, f.payload...)
	}
	if !p.gotHeader || uint64(len(p.body)) < p.size {
		return false
	}
	ch.pub = nil
	c.publish(ch, p)
	return false
}

// publish routes a complete message, returns it if mandatory and
// unroutable, and confirms it.
func (c *conn) publish(ch *channel, p *publishing) {
	b := c.b
	ex, ok := b.exchanges[p.exchange]
	if !ok {
		c.releaseChannel(ch)
		ch.closing = true
		e := notFound("exchange", p.exchange)
		c.send(ch.id, encodeMethod(chClose, e.code, e.text, bPublish.class(), bPublish.method()))
		return
	}
	m := &message{exchange: p.exchange, routingKey: p.key, props: p.props, body: p.body}
	qs := b.route(ex, p.key)
	if len(qs) == 0 && p.mandatory {
		c.sendContent(ch.id, encodeMethod(bReturn, uint16(codeNoRoute), "NO_ROUTE", p.exchange, p.key), p.props, p.body)
	}
	b.enqueue(m, qs, time.Now())
	if ch.confirm {
		ch.publishSeq++
		c.send(ch.id, encodeMethod(bAck, ch.publishSeq, false))
	}
}

// method handles a channel method; a returned error closes the channel
// (or the connection, if it says so).
func (c *conn) method(ch *channel, id methodID, a []any) *amqpError {
	b := c.b
	now := time.Now()
	switch id {
	case chClose:
		c.releaseChannel(ch)
		delete(c.channels, ch.id)
		c.send(ch.id, encodeMethod(chCloseOk))
	case chFlow:
		ch.flow = a[0].(bool)
		c.send(ch.id, encodeMethod(chFlowOk, ch.flow))
		if ch.flow {
			for _, q := range b.queues {
				b.dispatch(q, now)
			}
		}
	case bQos:
		if a[0].(uint32) != 0 {
			return &amqpError{code: codeNotImplemented, text: "NOT_IMPLEMENTED - prefetch_size!=0 (" + strconv.Itoa(int(a[0].(uint32))) + ")", conn: true}
		}
		if a[2].(bool) {
			ch.prefetchGlobal = int(a[1].(uint16))
		} else {
			ch.prefetch = int(a[1].(uint16))
		}
		c.send(ch.id, encodeMethod(bQosOk))
		for _, q := range b.queues {
			b.dispatch(q, now)
		}
	case confSelect:
		ch.confirm = true
		if !a[0].(bool) {
			c.send(ch.id, encodeMethod(confSelectOk))
		}
	case exDeclare:
		name, typ, passive, durable, autoDelete, internal, nowait, args := a[1].(string), a[2].(string), a[3].(bool), a[4].(bool), a[5].(bool), a[6].(bool), a[7].(bool), a[8].(amqp.Table)
		ex, ok := b.exchanges[name]
		switch {
		case passive && !ok:
			return notFound("exchange", name)
		case passive:
		case ok:
			if ex.typ != typ || ex.durable != durable || ex.autoDelete != autoDelete || ex.internal != internal {
				return chErr(codePrecondition, "PRECONDITION_FAILED - inequivalent arg 'type' for exchange '%s' in vhost '/': received '%s' but current is '%s'", name, typ, ex.typ)
			}
		default:
			if len(name) >= 4 && name[:4] == "amq." {
				return chErr(codeAccessRefused, "ACCESS_REFUSED - exchange name '%s' contains reserved prefix 'amq.*'", name)
			}
			switch typ {
			case "direct", "fanout", "topic":
			case "headers":
				return &amqpError{code: codeNotImplemented, text: "NOT_IMPLEMENTED - fakemq does not model headers exchanges", conn: true}
			default:
				return &amqpError{code: codeCommandInvalid, text: fmt.Sprintf("COMMAND_INVALID - unknown exchange type '%s'", typ), conn: true}
			}
			b.exchanges[name] = &exchange{name: name, typ: typ, durable: durable, autoDelete: autoDelete, internal: internal, args: args}
		}
		if !nowait {
			c.send(ch.id, encodeMethod(exDeclareOk))
		}
	case exDelete:
		name, nowait := a[1].(string), a[3].(bool)
		if name == "" || (len(name) >= 4 && name[:4] == "amq.") {
			return chErr(codeAccessRefused, "ACCESS_REFUSED - operation not permitted on the default exchange")
		}
		delete(b.exchanges, name)
		if !nowait {
			c.send(ch.id, encodeMethod(exDeleteOk))
		}
	case qDeclare:
		name, passive, durable, exclusive, autoDelete, nowait, args := a[1].(string), a[2].(bool), a[3].(bool), a[4].(bool), a[5].(bool), a[6].(bool), a[7].(amqp.Table)
		q, ok := b.queues[name]
		if ok && q.exclusive && q.owner != c {
			return chErr(codeResourceLocked, "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '%s' in vhost '/'", name)
		}
		switch {
		case passive && !ok:
			return notFound("queue", name)
		case passive:
		case ok:
			if e := q.equivalent(durable, exclusive, autoDelete, args); e != nil {
				return e
			}
		default:
			if name == "" {
				name = randName("amq.gen-")
			} else if len(name) >= 4 && name[:4] == "amq." {
				return chErr(codeAccessRefused, "ACCESS_REFUSED - queue name '%s' contains reserved prefix 'amq.*'", name)
			}
			nq, e := newQueue(name, durable, exclusive, autoDelete, args)
			if e != nil {
				return e
			}
			if exclusive {
				nq.owner = c
			}
			b.queues[name] = nq
			q = nq
		}
		b.expireHead(q, now)
		if !nowait {
			c.send(ch.id, encodeMethod(qDeclareOk, q.name, uint32(len(q.ready)), uint32(len(q.consumers))))
		}
	case qBind, qUnbind:
		qn, exn, key := a[1].(string), a[2].(string), a[3].(string)
		if _, ok := b.queues[qn]; !ok {
			return notFound("queue", qn)
		}
		ex, ok := b.exchanges[exn]
		if !ok {
			return notFound("exchange", exn)
		}
		if exn == "" {
			return chErr(codeAccessRefused, "ACCESS_REFUSED - operation not permitted on the default exchange")
		}
		bd := binding{queue: qn, key: key}
		kept := ex.bindings[:0]
		for _, x := range ex.bindings {
			if x != bd {
				kept = append(kept, x)
			}
		}
		ex.bindings = kept
		if id == qBind {
			ex.bindings = append(ex.bindings, bd)
			if !a[4].(bool) {
				c.send(ch.id, encodeMethod(qBindOk))
			}
		} else {
			if ex.autoDelete && len(ex.bindings) == 0 {
				delete(b.exchanges, exn)
			}
			c.send(ch.id, encodeMethod(qUnbindOk))
		}
	case qPurge:
		q, ok := b.queues[a[1].(string)]
		if !ok {
			return notFound("queue", a[1].(string))
		}
		n := len(q.ready)
		q.ready = nil
		if !a[2].(bool) {
			c.send(ch.id, encodeMethod(qPurgeOk, uint32(n)))
		}
	case qDelete:
		name, ifUnused, ifEmpty, nowait := a[1].(string), a[2].(bool), a[3].(bool), a[4].(bool)
		q, ok := b.queues[name]
		n := 0
		if ok {
			if ifUnused && len(q.consumers) > 0 {
				return chErr(codePrecondition, "PRECONDITION_FAILED - queue '%s' in vhost '/' in use", name)
			}
			if ifEmpty && len(q.ready) > 0 {
				return chErr(codePrecondition, "PRECONDITION_FAILED - queue '%s' in vhost '/' is not empty", name)
			}
			n = b.deleteQueue(q)
		}
		if !nowait {
			c.send(ch.id, encodeMethod(qDeleteOk, uint32(n)))
		}
	case bConsume:
		qn, tag, noAck, exclusive, nowait := a[1].(string), a[2].(string), a[4].(bool), a[5].(bool), a[6].(bool)
		q, ok := b.queues[qn]
		if !ok {
			return notFound("queue", qn)
		}
		if tag == "" {
			tag = randName("amq.ctag-")
		}
		if _, dup := ch.consumers[tag]; dup {
			return &amqpError{code: codeNotAllowed, text: fmt.Sprintf("NOT_ALLOWED - attempt to reuse consumer tag '%s'", tag), conn: true}
		}
		if exclusive && len(q.consumers) > 0 {
			return chErr(codeAccessRefused, "ACCESS_REFUSED - queue '%s' in vhost '/' in exclusive use", qn)
		}
		cons := &consumer{tag: tag, ch: ch, q: q, noAck: noAck, prefetch: ch.prefetch}
		ch.consumers[tag] = cons
		q.consumers = append(q.consumers, cons)
		q.hadConsumer = true
		if !nowait {
			c.send(ch.id, encodeMethod(bConsumeOk, tag))
		}
		b.dispatch(q, now)
	case bCancel:
		tag, nowait := a[0].(string), a[1].(bool)
		if cons, ok := ch.consumers[tag]; ok {
			b.removeConsumer(cons)
		}
		if !nowait {
			c.send(ch.id, encodeMethod(bCancelOk, tag))
		}
	case bPublish:
		ch.pub = &publishing{exchange: a[1].(string), key: a[2].(string), mandatory: a[3].(bool)}
	case bGet:
		qn, noAck := a[1].(string), a[2].(bool)
		q, ok := b.queues[qn]
		if !ok {
			return notFound("queue", qn)
		}
		b.expireHead(q, now)
		if len(q.ready) == 0 {
			c.send(ch.id, encodeMethod(bGetEmpty, ""))
			return nil
		}
		m := q.ready[0]
		q.ready = q.ready[1:]
		ch.nextTag++
		if !noAck {
			ch.unacked[ch.nextTag] = &pending{m: m, q: q}
			q.unacked++
		}
		c.sendContent(ch.id, encodeMethod(bGetOk, ch.nextTag, m.redelivered, m.exchange, m.routingKey, uint32(len(q.ready))), deliveryProps(q, m), m.body)
	case bAck:
		return c.settle(ch, a[0].(uint64), a[1].(bool), func(p *pending) {})
	case bNack:
		requeue := a[2].(bool)
		return c.settle(ch, a[0].(uint64), a[1].(bool), func(p *pending) { c.reject(p, requeue, now) })
	case bReject:
		requeue := a[1].(bool)
		return c.settle(ch, a[0].(uint64), false, func(p *pending) { c.reject(p, requeue, now) })
	case bRecover:
		c.releaseChannelDeliveries(ch)
		c.send(ch.id, encodeMethod(bRecoverOk))
	default:
		return &amqpError{code: codeNotImplemented, text: fmt.Sprintf("NOT_IMPLEMENTED - fakemq does not model method %d.%d", id.class(), id.method()), conn: true}
	}
	return nil
}

// releaseChannelDeliveries requeues ch's unacked deliveries, keeping its
// consumers (basic.recover with requeue).
func (c *conn) releaseChannelDeliveries(ch *channel) {
	cons := ch.consumers
	ch.consumers = map[string]*consumer{}
	c.releaseChannel(ch)
	ch.consumers = cons
	for _, x := range cons {
		x.unacked = 0
	}
}

func (c *conn) reject(p *pending, requeue bool, now time.Time) {
	if c.b.queues[p.q.name] != p.q {
		return
	}
	if requeue {
		c.b.requeue(p.q, p.m, now)
	} else {
		c.b.deadLetter(p.q, p.m, "rejected", now)
	}
}

// settle takes the deliveries tag names (all up to tag if multiple, every
// one if tag is 0 and multiple) off ch and applies fn to each, in delivery
// order. An unknown tag is a channel error, as on RabbitMQ.
func (c *conn) settle(ch *channel, tag uint64, multiple bool, fn func(*pending)) *amqpError {
	var tags []uint64
	if multiple {
		for t := range ch.unacked {
			if tag == 0 || t <= tag {
				tags = append(tags, t)
			}
		}
		sort.Slice(tags, func(i, j int) bool { return tags[i] < tags[j] })
		if tag != 0 && ch.unacked[tag] == nil {
			return chErr(codePrecondition, "PRECONDITION_FAILED - unknown delivery tag %d", tag)
		}
	} else {
		if ch.unacked[tag] == nil {
			return chErr(codePrecondition, "PRECONDITION_FAILED - unknown delivery tag %d", tag)
		}
		tags = []uint64{tag}
	}
	touched := map[*queue]bool{}
	for _, t := range tags {
		p := ch.unacked[t]
		delete(ch.unacked, t)
		p.q.unacked--
		if p.cons != nil {
			p.cons.unacked--
		}
		fn(p)
		touched[p.q] = true
	}
	now := time.Now()
	for q := range touched {
		if c.b.queues[q.name] == q {
			c.b.dispatch(q, now)
		}
	}
	// Room on this channel may let other queues' consumers go on.
	if ch.prefetchGlobal > 0 {
		for _, cons := range ch.consumers {
			c.b.dispatch(cons.q, now)
		}
	}
	return nil
}
