package fakemq

// The AMQP 0-9-1 wire format, the part of it a broker needs to talk to
// amqp091-go: frames, the methods listed in schemas, content headers with
// the basic properties, and field tables. Values decode to the Go types
// amqp091-go uses (amqp.Table, []any, time.Time, amqp.Decimal, …), so a
// table read here and written back is the table the client sent.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const (
	frameMethod    = 1
	frameHeader    = 2
	frameBody      = 3
	frameHeartbeat = 8
	frameEnd       = 0xCE
)

// methodID is a class and method id, class<<16 | method.
type methodID uint32

func mid(class, method uint16) methodID { return methodID(uint32(class)<<16 | uint32(method)) }

func (m methodID) class() uint16  { return uint16(m >> 16) }
func (m methodID) method() uint16 { return uint16(m) }

// The methods the fake reads or writes.
var (
	connStart     = mid(10, 10)
	connStartOk   = mid(10, 11)
	connTune      = mid(10, 30)
	connTuneOk    = mid(10, 31)
	connOpen      = mid(10, 40)
	connOpenOk    = mid(10, 41)
	connClose     = mid(10, 50)
	connCloseOk   = mid(10, 51)
	chOpen        = mid(20, 10)
	chOpenOk      = mid(20, 11)
	chFlow        = mid(20, 20)
	chFlowOk      = mid(20, 21)
	chClose       = mid(20, 40)
	chCloseOk     = mid(20, 41)
	exDeclare     = mid(40, 10)
	exDeclareOk   = mid(40, 11)
	exDelete      = mid(40, 20)
	exDeleteOk    = mid(40, 21)
	qDeclare      = mid(50, 10)
	qDeclareOk    = mid(50, 11)
	qBind         = mid(50, 20)
	qBindOk       = mid(50, 21)
	qPurge        = mid(50, 30)
	qPurgeOk      = mid(50, 31)
	qDelete       = mid(50, 40)
	qDeleteOk     = mid(50, 41)
	qUnbind       = mid(50, 50)
	qUnbindOk     = mid(50, 51)
	bQos          = mid(60, 10)
	bQosOk        = mid(60, 11)
	bConsume      = mid(60, 20)
	bConsumeOk    = mid(60, 21)
	bCancel       = mid(60, 30)
	bCancelOk     = mid(60, 31)
	bPublish      = mid(60, 40)
	bReturn       = mid(60, 50)
	bDeliver      = mid(60, 60)
	bGet          = mid(60, 70)
	bGetOk        = mid(60, 71)
	bGetEmpty     = mid(60, 72)
	bAck          = mid(60, 80)
	bReject       = mid(60, 90)
	bRecover      = mid(60, 110)
	bRecoverOk    = mid(60, 111)
	bNack         = mid(60, 120)
	confSelect    = mid(85, 10)
	confSelectOk  = mid(85, 11)
	classBasic    = uint16(60)
	frameOverhead = 8
)

// schemas are the methods' fields: o octet, s short, l long, L longlong,
// S shortstr, X longstr, b bit, t table.
var schemas = map[methodID]string{
	connStart: "ootXX", connStartOk: "tSXS", connTune: "sls", connTuneOk: "sls",
	connOpen: "SSb", connOpenOk: "S", connClose: "sSss", connCloseOk: "",
	chOpen: "S", chOpenOk: "X", chFlow: "b", chFlowOk: "b", chClose: "sSss", chCloseOk: "",
	exDeclare: "sSSbbbbbt", exDeclareOk: "", exDelete: "sSbb", exDeleteOk: "",
	qDeclare: "sSbbbbbt", qDeclareOk: "Sll", qBind: "sSSSbt", qBindOk: "",
	qPurge: "sSb", qPurgeOk: "l", qDelete: "sSbbb", qDeleteOk: "l", qUnbind: "sSSSt", qUnbindOk: "",
	bQos: "lsb", bQosOk: "", bConsume: "sSSbbbbt", bConsumeOk: "S", bCancel: "Sb", bCancelOk: "S",
	bPublish: "sSSbb", bReturn: "sSSS", bDeliver: "SLbSS", bGet: "sSb", bGetOk: "LbSSl", bGetEmpty: "S",
	bAck: "Lb", bReject: "Lb", bRecover: "b", bRecoverOk: "", bNack: "Lbb",
	confSelect: "b", confSelectOk: "",
}

// frame is one frame as read.
type frame struct {
	typ     byte
	channel uint16
	payload []byte
}

func readFrame(r *bufio.Reader, max int) (frame, error) {
	var h [7]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return frame{}, err
	}
	f := frame{typ: h[0], channel: binary.BigEndian.Uint16(h[1:3])}
	size := int(binary.BigEndian.Uint32(h[3:7]))
	if max > 0 && size > max {
		return frame{}, fmt.Errorf("frame of %d bytes over frame-max %d", size, max)
	}
	f.payload = make([]byte, size+1)
	if _, err := io.ReadFull(r, f.payload); err != nil {
		return frame{}, err
	}
	if f.payload[size] != frameEnd {
		return frame{}, errors.New("frame end octet missing")
	}
	f.payload = f.payload[:size]
	return f, nil
}

func appendFrame(dst []byte, typ byte, channel uint16, payload []byte) []byte {
	dst = append(dst, typ)
	dst = binary.BigEndian.AppendUint16(dst, channel)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(payload)))
	dst = append(dst, payload...)
	return append(dst, frameEnd)
}

// decoder reads fields from a payload; the first error sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || len(d.b) < n {
		d.err = io.ErrUnexpectedEOF
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) u8() uint8 {
	if b := d.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *decoder) u16() uint16 {
	if b := d.take(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if b := d.take(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if b := d.take(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (d *decoder) shortstr() string { return string(d.take(int(d.u8()))) }
func (d *decoder) longstr() string  { return string(d.take(int(d.u32()))) }

func (d *decoder) table(depth int) amqp.Table {
	n := int(d.u32())
	sub := &decoder{b: d.take(n)}
	if d.err != nil {
		return nil
	}
	t := amqp.Table{}
	for len(sub.b) > 0 && sub.err == nil {
		k := sub.shortstr()
		t[k] = sub.field(depth + 1)
	}
	if sub.err != nil {
		d.err = sub.err
	}
	return t
}

func (d *decoder) field(depth int) any {
	if depth > 64 {
		d.err = errors.New("field table nested too deep")
		return nil
	}
	switch typ := d.u8(); typ {
	case 't':
		return d.u8() != 0
	case 'B':
		return d.u8()
	case 'b':
		return int8(d.u8())
	case 's':
		return int16(d.u16())
	case 'u':
		return d.u16()
	case 'I':
		return int32(d.u32())
	case 'i':
		return d.u32()
	case 'l':
		return int64(d.u64())
	case 'f':
		return math.Float32frombits(d.u32())
	case 'd':
		return math.Float64frombits(d.u64())
	case 'D':
		scale := d.u8()
		return amqp.Decimal{Scale: scale, Value: int32(d.u32())}
	case 'S':
		return d.longstr()
	case 'x':
		return append([]byte(nil), d.take(int(d.u32()))...)
	case 'T':
		return time.Unix(int64(d.u64()), 0)
	case 'F':
		return d.table(depth)
	case 'A':
		sub := &decoder{b: d.take(int(d.u32()))}
		a := []any{}
		for len(sub.b) > 0 && sub.err == nil {
			a = append(a, sub.field(depth+1))
		}
		if sub.err != nil {
			d.err = sub.err
		}
		return a
	case 'V':
		return nil
	default:
		if d.err == nil {
			d.err = fmt.Errorf("unknown field type %q", typ)
		}
		return nil
	}
}

// encoder appends fields.
type encoder struct{ b []byte }

func (e *encoder) u8(v uint8)   { e.b = append(e.b, v) }
func (e *encoder) u16(v uint16) { e.b = binary.BigEndian.AppendUint16(e.b, v) }
func (e *encoder) u32(v uint32) { e.b = binary.BigEndian.AppendUint32(e.b, v) }
func (e *encoder) u64(v uint64) { e.b = binary.BigEndian.AppendUint64(e.b, v) }
func (e *encoder) shortstr(s string) {
	if len(s) > 255 {
		s = s[:255]
	}
	e.u8(uint8(len(s)))
	e.b = append(e.b, s...)
}
func (e *encoder) longstr(s string) { e.u32(uint32(len(s))); e.b = append(e.b, s...) }

func (e *encoder) table(t amqp.Table) {
	at := len(e.b)
	e.u32(0)
	for k, v := range t {
		e.shortstr(k)
		e.field(v)
	}
	binary.BigEndian.PutUint32(e.b[at:], uint32(len(e.b)-at-4))
}

func (e *encoder) field(v any) {
	switch v := v.(type) {
	case bool:
		e.u8('t')
		if v {
			e.u8(1)
		} else {
			e.u8(0)
		}
	case byte:
		e.u8('B')
		e.u8(v)
	case int8:
		e.u8('b')
		e.u8(uint8(v))
	case int16:
		e.u8('s')
		e.u16(uint16(v))
	case uint16:
		e.u8('u')
		e.u16(v)
	case int:
		e.u8('I')
		e.u32(uint32(v))
	case int32:
		e.u8('I')
		e.u32(uint32(v))
	case uint32:
		e.u8('i')
		e.u32(v)
	case int64:
		e.u8('l')
		e.u64(uint64(v))
	case float32:
		e.u8('f')
		e.u32(math.Float32bits(v))
	case float64:
		e.u8('d')
		e.u64(math.Float64bits(v))
	case amqp.Decimal:
		e.u8('D')
		e.u8(v.Scale)
		e.u32(uint32(v.Value))
	case string:
		e.u8('S')
		e.longstr(v)
	case []byte:
		e.u8('x')
		e.u32(uint32(len(v)))
		e.b = append(e.b, v...)
	case time.Time:
		e.u8('T')
		e.u64(uint64(v.Unix()))
	case amqp.Table:
		e.u8('F')
		e.table(v)
	case map[string]any:
		e.u8('F')
		e.table(amqp.Table(v))
	case []any:
		e.u8('A')
		at := len(e.b)
		e.u32(0)
		for _, x := range v {
			e.field(x)
		}
		binary.BigEndian.PutUint32(e.b[at:], uint32(len(e.b)-at-4))
	default:
		e.u8('V')
	}
}

// decodeMethod reads a method frame's payload into its id and fields
// (bits as bool, tables as amqp.Table).
func decodeMethod(p []byte) (methodID, []any, error) {
	d := &decoder{b: p}
	id := mid(d.u16(), d.u16())
	if d.err != nil {
		return 0, nil, d.err
	}
	schema, ok := schemas[id]
	if !ok {
		return id, nil, fmt.Errorf("method %d.%d not implemented", id.class(), id.method())
	}
	var args []any
	var bits uint8
	bit := 8
	for _, c := range schema {
		if c != 'b' {
			bit = 8
		}
		switch c {
		case 'o':
			args = append(args, d.u8())
		case 's':
			args = append(args, d.u16())
		case 'l':
			args = append(args, d.u32())
		case 'L':
			args = append(args, d.u64())
		case 'S':
			args = append(args, d.shortstr())
		case 'X':
			args = append(args, d.longstr())
		case 't':
			args = append(args, d.table(0))
		case 'b':
			if bit == 8 {
				bits, bit = d.u8(), 0
			}
			args = append(args, bits&(1<<bit) != 0)
			bit++
		}
	}
	return id, args, d.err
}

// encodeMethod writes a method's payload; args follow its schema (o uint8,
// s uint16, l uint32, L uint64, S and X string, b bool, t amqp.Table).
func encodeMethod(id methodID, args ...any) []byte {
	e := &encoder{}
	e.u16(id.class())
	e.u16(id.method())
	schema := schemas[id]
	if len(schema) != len(args) {
		panic(fmt.Sprintf("fakemq: method %d.%d takes %d fields, got %d", id.class(), id.method(), len(schema), len(args)))
	}
	bitAt, bit := -1, 8
	for i, c := range schema {
		if c != 'b' {
			bit = 8
		}
		switch c {
		case 'o':
			e.u8(args[i].(uint8))
		case 's':
			e.u16(args[i].(uint16))
		case 'l':
			e.u32(args[i].(uint32))
		case 'L':
			e.u64(args[i].(uint64))
		case 'S':
			e.shortstr(args[i].(string))
		case 'X':
			e.longstr(args[i].(string))
		case 't':
			t, _ := args[i].(amqp.Table)
			e.table(t)
		case 'b':
			if bit == 8 {
				e.u8(0)
				bitAt, bit = len(e.b)-1, 0
			}
			if args[i].(bool) {
				e.b[bitAt] |= 1 << bit
			}
			bit++
		}
	}
	return e.b
}

// properties are a message's basic properties.
type properties struct {
	ContentType, ContentEncoding  string
	Headers                       amqp.Table
	DeliveryMode, Priority        uint8
	CorrelationID, ReplyTo        string
	Expiration, MessageID         string
	Timestamp                     time.Time
	Type, UserID, AppID, Reserved string
	flags                         uint16 // as read: which were present
}

const (
	flagContentType     = 0x8000
	flagContentEncoding = 0x4000
	flagHeaders         = 0x2000
	flagDeliveryMode    = 0x1000
	flagPriority        = 0x0800
	flagCorrelationID   = 0x0400
	flagReplyTo         = 0x0200
	flagExpiration      = 0x0100
	flagMessageID       = 0x0080
	flagTimestamp       = 0x0040
	flagType            = 0x0020
	flagUserID          = 0x0010
	flagAppID           = 0x0008
	flagReserved        = 0x0004
)

// decodeHeader reads a content header frame: body size and properties.
func decodeHeader(p []byte) (uint64, properties, error) {
	d := &decoder{b: p}
	d.u16() // class
	d.u16() // weight
	size := d.u64()
	var pr properties
	pr.flags = d.u16()
	f := pr.flags
	if f&flagContentType != 0 {
		pr.ContentType = d.shortstr()
	}
	if f&flagContentEncoding != 0 {
		pr.ContentEncoding = d.shortstr()
	}
	if f&flagHeaders != 0 {
		pr.Headers = d.table(0)
	}
	if f&flagDeliveryMode != 0 {
		pr.DeliveryMode = d.u8()
	}
	if f&flagPriority != 0 {
		pr.Priority = d.u8()
	}
	if f&flagCorrelationID != 0 {
		pr.CorrelationID = d.shortstr()
	}
	if f&flagReplyTo != 0 {
		pr.ReplyTo = d.shortstr()
	}
	if f&flagExpiration != 0 {
		pr.Expiration = d.shortstr()
	}
	if f&flagMessageID != 0 {
		pr.MessageID = d.shortstr()
	}
	if f&flagTimestamp != 0 {
		pr.Timestamp = time.Unix(int64(d.u64()), 0)
	}
	if f&flagType != 0 {
		pr.Type = d.shortstr()
	}
	if f&flagUserID != 0 {
		pr.UserID = d.shortstr()
	}
	if f&flagAppID != 0 {
		pr.AppID = d.shortstr()
	}
	if f&flagReserved != 0 {
		pr.Reserved = d.shortstr()
	}
	return size, pr, d.err
}

// encodeHeader writes a content header frame's payload. A property is
// written when it was present as published (flags) or is set now.
func encodeHeader(size uint64, pr properties) []byte {
	e := &encoder{}
	e.u16(classBasic)
	e.u16(0)
	e.u64(size)
	f := pr.flags
	set := func(ok bool, flag uint16) {
		if ok {
			f |= flag
		}
	}
	set(pr.ContentType != "", flagContentType)
	set(pr.ContentEncoding != "", flagContentEncoding)
	set(len(pr.Headers) > 0, flagHeaders)
	set(pr.DeliveryMode != 0, flagDeliveryMode)
	set(pr.Priority != 0, flagPriority)
	set(pr.CorrelationID != "", flagCorrelationID)
	set(pr.ReplyTo != "", flagReplyTo)
	set(pr.Expiration != "", flagExpiration)
	set(pr.MessageID != "", flagMessageID)
	set(!pr.Timestamp.IsZero(), flagTimestamp)
	set(pr.Type != "", flagType)
	set(pr.UserID != "", flagUserID)
	set(pr.AppID != "", flagAppID)
	if pr.Expiration == "" {
		f &^= flagExpiration // dead-lettering removes it
	}
	e.u16(f)
	if f&flagContentType != 0 {
		e.shortstr(pr.ContentType)
	}
	if f&flagContentEncoding != 0 {
		e.shortstr(pr.ContentEncoding)
	}
	if f&flagHeaders != 0 {
		e.table(pr.Headers)
	}
	if f&flagDeliveryMode != 0 {
		e.u8(pr.DeliveryMode)
	}
	if f&flagPriority != 0 {
		e.u8(pr.Priority)
	}
	if f&flagCorrelationID != 0 {
		e.shortstr(pr.CorrelationID)
	}
	if f&flagReplyTo != 0 {
		e.shortstr(pr.ReplyTo)
	}
	if f&flagExpiration != 0 {
		e.shortstr(pr.Expiration)
	}
	if f&flagMessageID != 0 {
		e.shortstr(pr.MessageID)
	}
	if f&flagTimestamp != 0 {
		e.u64(uint64(pr.Timestamp.Unix()))
	}
	if f&flagType != 0 {
		e.shortstr(pr.Type)
	}
	if f&flagUserID != 0 {
		e.shortstr(pr.UserID)
	}
	if f&flagAppID != 0 {
		e.shortstr(pr.AppID)
	}
	if f&flagReserved != 0 {
		e.shortstr(pr.Reserved)
	}
	return e.b
}
