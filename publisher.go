package idemq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/backoff"
	"github.com/idemq/idemq/internal/failover"
	"github.com/idemq/idemq/internal/frame"
)

// Publisher publishes with confirms, mandatory routing and retries. It is
// safe for concurrent use; each publish waits only for its own confirm.
type Publisher struct {
	cfg PublisherConfig
	log *slog.Logger
	rec Recorder
	sem chan struct{}
	// semTurn, a lock that honours contexts, lets one batch at a time take
	// its slots of sem: two batches each holding part of the window and
	// waiting for the rest would never get it.
	semTurn chan struct{}
	brokers *failover.Brokers

	mu     sync.Mutex // guards cur and closed; held while (re)connecting
	cur    *pubChannel
	closed bool
}

// NewPublisher validates cfg ([PublisherConfig.Validate]), fills its
// defaults and returns a publisher. It connects on first use.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil { // IDEMQ_AMQP_URL, filled in by the defaults
		return nil, err
	}
	rec := cfg.Recorder
	if rec == nil {
		rec = nopRecorder{}
	}
	return &Publisher{cfg: cfg, log: cfg.Logger, rec: rec, sem: make(chan struct{}, cfg.MaxInFlight), semTurn: make(chan struct{}, 1),
		brokers: failover.New(cfg.URL, cfg.URLs)}, nil
}

// Publish sends msg and returns once the broker has confirmed it. A nack or
// a lost connection is retried with backoff (the resend keeps msg.ID, so the
// consumer may see it twice — that duplicate is the dedup guard's job). An
// unroutable message returns a [*ReturnedError]. When ctx ends first, the
// error wraps ctx.Err(): the message may or may not have reached the broker.
//
// Some messages are refused before anything is sent, and never retried:
// headers AMQP cannot encode ([ErrInvalidHeaders]), and properties plus
// headers that do not fit the connection's frame_max — the broker would
// close the connection, failing every publish in flight. The latter error
// is a [*PermanentError] wrapping [ErrMessageTooLarge].
//
// msg.Headers is not modified: the publisher sends a copy with
// [HeaderPublishSeq] added.
func (p *Publisher) Publish(ctx context.Context, msg Message) error {
	pm, err := p.prepare(&msg)
	if err != nil {
		return err
	}
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("idemq: publish %q: %w", msg.ID, ctx.Err())
	}
	p.rec.Add(GaugePublishInFlight, 1)
	defer func() { <-p.sem; p.rec.Add(GaugePublishInFlight, -1) }()

	for attempt := 0; ; attempt++ {
		if err := p.beforeAttempt(ctx, attempt, 1); err != nil {
			return pm.stopped(err, attempt)
		}
		pc, err := p.channel(ctx)
		if err != nil {
			if errors.Is(err, ErrClosed) {
				return err
			}
			pm.last = err
			continue
		}
		if err := pm.fits(pc); err != nil {
			return err
		}
		if done, err := p.settle(ctx, pc, pm, pc.publish(ctx, pm)); done {
			return err
		}
	}
}

// PublishBatch publishes msgs and waits for all their confirms; errs[i] is
// the outcome of msgs[i], as [Publisher.Publish] would return it (nil:
// confirmed). The messages go out back to back on one channel, without a
// goroutine or a lock round per message, so a batch costs the client and
// the broker less than as many concurrent Publish calls; each message is
// still retried on its own (a nack or a lost connection sends the
// unconfirmed ones again, keeping their IDs). A batch larger than
// MaxInFlight goes in slices of MaxInFlight. ctx bounds the whole batch.
func (p *Publisher) PublishBatch(ctx context.Context, msgs []Message) []error {
	errs := make([]error, len(msgs))
	for lo := 0; lo < len(msgs); lo += p.cfg.MaxInFlight {
		hi := min(lo+p.cfg.MaxInFlight, len(msgs))
		p.publishSlice(ctx, msgs[lo:hi], errs[lo:hi])
	}
	return errs
}

// publishSlice is PublishBatch for at most MaxInFlight messages.
func (p *Publisher) publishSlice(ctx context.Context, msgs []Message, errs []error) {
	todo := make([]*preparedPub, 0, len(msgs))
	for i := range msgs {
		pm, err := p.prepare(&msgs[i])
		if err != nil {
			errs[i] = err
			continue
		}
		pm.index = i
		todo = append(todo, pm)
	}
	held := 0
	defer func() {
		for range held {
			<-p.sem
		}
		p.rec.Add(GaugePublishInFlight, -int64(held))
	}()
	if err := p.takeSlots(ctx, len(todo), &held); err != nil {
		for _, pm := range todo {
			errs[pm.index] = fmt.Errorf("idemq: publish %q: %w", pm.msg.ID, err)
		}
		return
	}

	for attempt := 0; len(todo) > 0; attempt++ {
		if err := p.beforeAttempt(ctx, attempt, len(todo)); err != nil {
			for _, pm := range todo {
				errs[pm.index] = pm.stopped(err, attempt)
			}
			return
		}
		pc, err := p.channel(ctx)
		if err != nil {
			for _, pm := range todo {
				if errors.Is(err, ErrClosed) {
					errs[pm.index] = err
				}
				pm.last = err
			}
			if errors.Is(err, ErrClosed) {
				return
			}
			continue
		}
		sent := todo[:0:0]
		for _, pm := range todo {
			if err := pm.fits(pc); err != nil {
				errs[pm.index] = err
				continue
			}
			sent = append(sent, pm)
		}
		pps := pc.sendBatch(ctx, sent)
		todo = todo[:0]
		for i, pm := range sent {
			err := pps[i].err
			if err == nil {
				err = pc.await(ctx, pps[i].pp)
			}
			if done, err := p.settle(ctx, pc, pm, err); done {
				errs[pm.index] = err
				continue
			}
			todo = append(todo, pm)
		}
	}
}

// takeSlots takes n slots of the in-flight window for a batch, counting
// them in held (the caller gives them back), one batch at a time.
func (p *Publisher) takeSlots(ctx context.Context, n int, held *int) error {
	select {
	case p.semTurn <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-p.semTurn }()
	for range n {
		select {
		case p.sem <- struct{}{}:
			*held++
			p.rec.Add(GaugePublishInFlight, 1)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// preparedPub is a message checked and made into its AMQP publishing,
// with the error of its last failed attempt.
type preparedPub struct {
	msg       *Message
	pub       amqp.Publishing
	frameSize int // of the content header frame, without HeaderPublishSeq
	index     int // in the caller's batch
	last      error
}

// prepare refuses what no retry can send (see Publish) and makes the
// publishing, with the publisher's own copy of the headers.
func (p *Publisher) prepare(msg *Message) (*preparedPub, error) {
	if err := ValidateID(msg.ID); err != nil {
		return nil, err // already "idemq: missing message ID" / "idemq: invalid message ID: …"
	}
	if err := msg.Headers.Validate(); err != nil {
		// No retry can fix a header AMQP cannot encode.
		return nil, fmt.Errorf("idemq: publish %q: %w: %w", msg.ID, ErrInvalidHeaders, err)
	}
	pub := msg.publishing(time.Now())
	pub.Headers = nil
	if len(msg.Headers) > 0 {
		pub.Headers = make(amqp.Table, len(msg.Headers)+1)
		for k, v := range msg.Headers {
			pub.Headers[k] = v
		}
		// An attempt carries HeaderPublishSeq only when another publish
		// of the same ID is in flight on its channel (pubChannel.send). A
		// stale value the caller's headers carry (a republished delivery)
		// is dropped here.
		delete(pub.Headers, HeaderPublishSeq)
	}
	size, err := frame.ContentHeaderPayloadSize(&pub)
	if err != nil {
		// A property or key over 255 bytes: amqp091-go would fail after
		// writing the method frame, breaking the connection.
		return nil, fmt.Errorf("idemq: publish %q: %w: %w", msg.ID, ErrInvalidHeaders, err)
	}
	return &preparedPub{msg: msg, pub: pub, frameSize: size + frame.Overhead}, nil
}

// fits refuses a message whose content header frame exceeds the
// connection's frame_max. Permanent: the same broker negotiates the same
// frame_max on every connection.
func (pm *preparedPub) fits(pc *pubChannel) error {
	if pc.frameMax > 0 && pm.frameSize > pc.frameMax {
		return Permanent(fmt.Errorf("idemq: publish %q: %w: content header frame is %d bytes (properties and %d headers), frame_max is %d",
			pm.msg.ID, ErrMessageTooLarge, pm.frameSize, len(pm.msg.Headers), pc.frameMax))
	}
	return nil
}

// errGaveUp: a publish is out of attempts (PublisherConfig.MaxAttempts).
var errGaveUp = errors.New("gave up")

// beforeAttempt checks MaxAttempts and sleeps the backoff before a retry
// of n messages. An error (errGaveUp, or ctx's while sleeping) means no
// further attempt: preparedPub.stopped makes each message's error of it.
func (p *Publisher) beforeAttempt(ctx context.Context, attempt, n int) error {
	if p.cfg.MaxAttempts > 0 && attempt >= p.cfg.MaxAttempts {
		return errGaveUp
	}
	if attempt > 0 {
		p.rec.Add(CountPublishRetries, int64(n))
		if err := backoff.Sleep(ctx, p.cfg.Retry.Delay(attempt-1)); err != nil {
			return err
		}
	}
	return nil
}

// stopped is the error of a publish that beforeAttempt stopped after
// attempt attempts.
func (pm *preparedPub) stopped(err error, attempt int) error {
	if errors.Is(err, errGaveUp) {
		return fmt.Errorf("idemq: publish %q: gave up after %d attempts: %w", pm.msg.ID, attempt, pm.last)
	}
	return fmt.Errorf("idemq: publish %q: %w (last error: %w)", pm.msg.ID, err, pm.last)
}

// settle reads one attempt's outcome: done (with the publish's error, nil
// when confirmed) or to be retried (pm.last set).
func (p *Publisher) settle(ctx context.Context, pc *pubChannel, pm *preparedPub, err error) (bool, error) {
	switch {
	case err == nil:
		p.rec.Add(CountPublished, 1)
		return true, nil
	case errors.Is(err, ErrUnroutable):
		p.rec.Add(CountPublishReturned, 1)
		return true, err
	case ctx.Err() != nil:
		return true, fmt.Errorf("idemq: publish %q: confirm not received: %w", pm.msg.ID, ctx.Err())
	}
	pm.last = err
	if errors.Is(err, ErrNacked) {
		p.retire(pc)
	}
	p.log.Debug("idemq: publish attempt failed; retrying", "message_id", pm.msg.ID, "err", err)
	return false, nil
}

// errChannelRetired fails the publishes still awaiting a confirm on a
// channel the publisher retired after a nack; they are retried on a new
// one.
var errChannelRetired = errors.New("idemq: channel retired after a nack")

// retire drops a channel that nacked a publish, and its connection: the
// next attempt opens new ones. RabbitMQ 3.10 nacks every publish, for as
// long as the channel lives, on a channel that was publishing to a quorum
// queue whose leader node died, while a new channel publishes at once
// (TestFaultClusterLeaderKill saw minutes of nacks after the kill). A nack
// is rare otherwise (an internal error, a reject-publish overflow), so a
// new connection for it costs little; the backoff between attempts still
// applies.
func (p *Publisher) retire(pc *pubChannel) {
	p.mu.Lock()
	if p.cur == pc {
		p.cur = nil
		p.rec.Add(CountReconnects, 1)
	}
	p.mu.Unlock()
	_ = pc.conn.Close()
	pc.fail(errChannelRetired)
}

// Close closes the connection. Publishes in flight fail with [ErrClosed].
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.cur != nil {
		p.cur.close()
		p.cur = nil
	}
	return nil
}

// channel returns the live channel, connecting if there is none.
func (p *Publisher) channel(ctx context.Context) (*pubChannel, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	if p.cur != nil && !p.cur.isDead() {
		return p.cur, nil
	}
	if p.cur != nil {
		p.cur.close()
		p.cur = nil
		p.rec.Add(CountReconnects, 1)
	}
	pc, err := p.connect(ctx)
	if err != nil {
		return nil, err
	}
	p.cur = pc
	return pc, nil
}

func (p *Publisher) connect(ctx context.Context) (*pubChannel, error) {
	conn, _, err := p.brokers.Dial(p.cfg.Dial, amqp.Config{
		Heartbeat:  p.cfg.Heartbeat,
		Locale:     "en_US",
		Properties: amqp.Table{"connection_name": "idemq publisher"},
	})
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		conn.Close()
		return nil, fmt.Errorf("enable confirms: %w", err)
	}
	if p.cfg.Setup != nil {
		if err := p.cfg.Setup(ctx, ch); err != nil {
			conn.Close()
			return nil, fmt.Errorf("setup topology: %w", err)
		}
	}
	pc := &pubChannel{
		conn:     conn,
		ch:       ch,
		log:      p.log,
		frameMax: conn.Config.FrameSize, // negotiated in connection.tune; 0 means no limit
		pending:  map[uint64]*pendingPub{},
		byID:     map[string]uint64{},
		dead:     make(chan struct{}),
	}
	// Returns must be read on an unbuffered channel by the same goroutine
	// that reads confirms: the client hands a return over before it
	// processes the ack that follows it, so the dispatcher always sees a
	// message's return before its confirm.
	returns := ch.NotifyReturn(make(chan amqp.Return))
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, p.cfg.MaxInFlight+16))
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	go pc.dispatch(returns, confirms, closed)
	return pc, nil
}

type pendingPub struct {
	done     chan error // buffered 1
	id       string     // the message ID
	returned *ReturnedError
	// dc is the broker's own answer for this publish. amqp091-go's
	// NotifyPublish (which the dispatcher reads, for the order of returns
	// and confirms) resequences confirms and reports every tag up to a
	// multiple ack as acked, a nack that came earlier out of order
	// included; the deferred confirmation keeps that nack.
	dc *amqp.DeferredConfirmation
	// notified: the dispatcher saw this publish's confirm before publish
	// attached dc; publish settles it.
	notified bool
}

// result is the outcome of a publish whose confirm the dispatcher saw.
// Called with pc.mu held, once dc is set.
func (pp *pendingPub) result() error {
	if pp.returned != nil {
		return pp.returned
	}
	select {
	case <-pp.dc.Done():
	default:
		// Not expected: amqp091-go settles the deferred confirmation
		// before it notifies. Unknown outcome: the caller retries.
		return errConfirmUnknown
	}
	if pp.dc.Acked() {
		return nil
	}
	return ErrNacked
}

var errConfirmUnknown = errors.New("idemq: confirm notified before the broker's answer was known")

// pubChannel is one connection+channel in confirm mode.
type pubChannel struct {
	conn     *amqp.Connection
	ch       *amqp.Channel
	log      *slog.Logger
	frameMax int // the connection's negotiated frame_max; 0 means unlimited

	pubMu   sync.Mutex             // serialises publishes on the channel
	mu      sync.Mutex             // guards the fields below
	pending map[uint64]*pendingPub // publish seq → publish awaiting its confirm
	// byID maps a message ID to the seq of the publish in pending that
	// was sent without HeaderPublishSeq: a return without the header is
	// that publish's (see send).
	byID    map[string]uint64
	dead    chan struct{}
	deadErr error
}

var errChannelLost = errors.New("idemq: channel lost before the confirm")

// errIDInFlight: another publish of the message ID is in flight on the
// channel, and the message's content header frame has no room left for
// HeaderPublishSeq. A retry sends it once that publish is confirmed.
var errIDInFlight = errors.New("idemq: another publish of this message ID awaits its confirm, and the header that would tell their returns apart does not fit frame_max")

func (pc *pubChannel) isDead() bool {
	select {
	case <-pc.dead:
		return true
	default:
		return false
	}
}

// publish sends one attempt of pm and waits for its confirm.
func (pc *pubChannel) publish(ctx context.Context, pm *preparedPub) error {
	pc.pubMu.Lock()
	pp, err := pc.send(ctx, pm)
	pc.pubMu.Unlock()
	if err != nil {
		return err
	}
	return pc.await(ctx, pp)
}

// sent is the outcome of one send of a batch.
type sent struct {
	pp  *pendingPub
	err error
}

// sendBatch sends one attempt of each message back to back, holding the
// channel for the whole batch.
func (pc *pubChannel) sendBatch(ctx context.Context, pms []*preparedPub) []sent {
	out := make([]sent, len(pms))
	pc.pubMu.Lock()
	defer pc.pubMu.Unlock()
	for i, pm := range pms {
		out[i].pp, out[i].err = pc.send(ctx, pm)
	}
	return out
}

// send writes one publish and registers it for its confirm. pubMu, held by
// the caller, makes "next sequence number" and "publish" one step; mu (the
// bookkeeping) is never held across a network write, so the dispatcher can
// always take returns and confirms off the client's reader.
func (pc *pubChannel) send(ctx context.Context, pm *preparedPub) (*pendingPub, error) {
	msg, pub := pm.msg, pm.pub
	pp := &pendingPub{done: make(chan error, 1), id: msg.ID}
	pc.mu.Lock()
	if pc.isDead() {
		pc.mu.Unlock()
		return nil, errChannelLost
	}
	seq := pc.ch.GetNextPublishSeqNo()
	// A basic.return carries the message's properties and headers, so the
	// dispatcher matches it by message ID. Only when another publish of
	// this ID is in flight on the channel does this one carry its own
	// sequence number (HeaderPublishSeq) to tell the two apart. Most
	// publishes carry no header of idemq's: a header table costs the
	// broker about a fifth of its publish rate (docs/BENCHMARKS.md).
	_, shared := pc.byID[msg.ID]
	if shared && pc.frameMax > 0 && pm.frameSize+frame.Int64HeaderSize(HeaderPublishSeq, len(pub.Headers)) > pc.frameMax {
		// No room for the header: wait (the publisher's backoff) until
		// the other publish of this ID is confirmed.
		pc.mu.Unlock()
		return nil, errIDInFlight
	}
	pc.pending[seq] = pp
	if !shared {
		pc.byID[msg.ID] = seq
	}
	pc.mu.Unlock()
	if shared {
		// This attempt's own table: pm's stays without the header.
		h := make(amqp.Table, len(pub.Headers)+1)
		maps.Copy(h, pub.Headers)
		h[HeaderPublishSeq] = int64(seq)
		pub.Headers = h
	}
	dc, err := pc.ch.PublishWithDeferredConfirmWithContext(ctx, msg.Exchange, msg.RoutingKey, true, false, pub)
	if err == nil && dc == nil {
		err = errors.New("channel not in confirm mode")
	}
	if err != nil {
		pc.mu.Lock()
		pc.forget(seq, pp)
		pc.mu.Unlock()
		return nil, fmt.Errorf("publish frame: %w", err)
	}
	pc.mu.Lock()
	pp.dc = dc
	if pp.notified && pc.pending[seq] == pp {
		pc.forget(seq, pp)
		pp.done <- pp.result()
	}
	pc.mu.Unlock()
	return pp, nil
}

// forget drops a publish from pending (and byID). Called with mu held.
func (pc *pubChannel) forget(seq uint64, pp *pendingPub) {
	delete(pc.pending, seq)
	if s, ok := pc.byID[pp.id]; ok && s == seq {
		delete(pc.byID, pp.id)
	}
}

// await waits for the confirm of a publish sent.
func (pc *pubChannel) await(ctx context.Context, pp *pendingPub) error {
	select {
	case err := <-pp.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (pc *pubChannel) dispatch(returns <-chan amqp.Return, confirms <-chan amqp.Confirmation, closed <-chan *amqp.Error) {
	var why error = errChannelLost
	defer func() { pc.fail(why) }()
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			// A return carries the publish's own sequence number when its
			// message ID was shared by another publish in flight (send);
			// otherwise the ID names it. The client hands a return over
			// before the ack that follows it, so that publish is still
			// pending here.
			seq, ok := returnSeq(r.Headers)
			pc.mu.Lock()
			if !ok {
				seq, ok = pc.byID[r.MessageId]
			}
			pp := pc.pending[seq]
			if ok && pp != nil && pp.returned == nil {
				pp.returned = &ReturnedError{MessageID: r.MessageId, Exchange: r.Exchange,
					RoutingKey: r.RoutingKey, ReplyCode: r.ReplyCode, ReplyText: r.ReplyText}
			}
			pc.mu.Unlock()
			if !ok || pp == nil {
				pc.log.Error("idemq: a returned message matches no publish awaiting its confirm",
					"message_id", r.MessageId, "exchange", r.Exchange, "routing_key", r.RoutingKey,
					"reply_code", r.ReplyCode, HeaderPublishSeq, r.Headers[HeaderPublishSeq])
			}
		case c, ok := <-confirms:
			if !ok {
				return
			}
			// c.Ack is not trusted (see pendingPub.dc): the deferred
			// confirmation says whether the broker acked this tag.
			pc.mu.Lock()
			pp := pc.pending[c.DeliveryTag]
			switch {
			case pp == nil:
			case pp.dc == nil:
				pp.notified = true // publish has not attached dc yet: it settles
			default:
				pc.forget(c.DeliveryTag, pp)
				pp.done <- pp.result()
			}
			pc.mu.Unlock()
		case e := <-closed:
			if e != nil {
				why = fmt.Errorf("%w: %v", errChannelLost, e)
			}
			return
		}
	}
}

// fail marks the channel dead and fails every publish awaiting a confirm.
func (pc *pubChannel) fail(why error) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if !pc.isDead() {
		pc.deadErr = why
		close(pc.dead)
	}
	for seq, pp := range pc.pending {
		pp.done <- why
		pc.forget(seq, pp)
	}
}

// returnSeq reads the publish sequence number a returned message carries.
func returnSeq(h amqp.Table) (uint64, bool) {
	switch v := h[HeaderPublishSeq].(type) {
	case int64:
		return uint64(v), v > 0
	}
	return 0, false
}

func (pc *pubChannel) close() {
	_ = pc.conn.Close()
	pc.fail(ErrClosed)
}
