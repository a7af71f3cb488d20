package testenv

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
)

// Proxy is a loopback TCP proxy in front of a real server. Cut closes every
// connection through it (a network drop as the client sees it) while new
// connections keep working, so a test can kill its own connections without
// touching other tests' ones.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	paused bool
	stall  bool                  // accept and hold new connections, never answer (Stall)
	held   map[net.Conn]struct{} // connections held by a Stall
	cuts   int
}

// NewProxy starts a proxy to target ("host:port"), closed at cleanup.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// AMQPProxy starts a proxy to the test broker and returns it with the URL
// that goes through it.
func AMQPProxy(t testing.TB) (*Proxy, string) {
	t.Helper()
	RequireRealBroker(t, "cuts TCP connections through a proxy in front of RabbitMQ")
	raw := RequireAMQP(t)
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	p := NewProxy(t, u.Host)
	u.Host = p.Addr()
	return p, u.String()
}

// Addr is the proxy's listening address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.paused {
			p.mu.Unlock()
			c.Close()
			continue
		}
		if p.stall {
			// Accepted, never answered: held (read and dropped) until
			// Resume or Close closes it.
			if p.held == nil {
				p.held = map[net.Conn]struct{}{}
			}
			p.held[c] = struct{}{}
			p.mu.Unlock()
			go func() { _, _ = io.Copy(io.Discard, c) }()
			continue
		}
		p.mu.Unlock()
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c] = struct{}{}
		p.conns[s] = struct{}{}
		p.mu.Unlock()
		go p.pipe(c, s)
		go p.pipe(s, c)
	}
}

func (p *Proxy) pipe(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// Cut closes every open connection through the proxy.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cuts++
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

// Open reports how many sockets (both sides) are open through the proxy.
func (p *Proxy) Open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Pause refuses new connections (and cuts the open ones) until Resume.
func (p *Proxy) Pause() {
	p.mu.Lock()
	p.paused = true
	p.mu.Unlock()
	p.Cut()
}

// Stall makes the server look frozen (a black-holed network, a stopped
// process): open connections are cut, new ones are accepted and never
// answered, until Resume.
func (p *Proxy) Stall() {
	p.mu.Lock()
	p.stall = true
	p.mu.Unlock()
	p.Cut()
}

// Resume accepts and forwards connections again; connections held by a
// Stall are closed.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused, p.stall = false, false
	p.closeHeld()
}

// closeHeld closes the connections a Stall held. mu held.
func (p *Proxy) closeHeld() {
	for c := range p.held {
		c.Close()
	}
	p.held = nil
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() {
	p.ln.Close()
	p.Cut()
	p.mu.Lock()
	p.closeHeld()
	p.mu.Unlock()
}
