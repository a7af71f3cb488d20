package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"time"
)

// cutProxy is a loopback TCP proxy between the consumers and the broker. cut
// closes every connection through it at once (a network drop as both sides
// see it) while new connections keep working, so the demo can cut its own
// consumers' connections without touching anybody else's.
type cutProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	pairs  map[*proxyPair]struct{}
	closed bool
	wg     sync.WaitGroup
}

type proxyPair struct{ client, server net.Conn }

func (p *proxyPair) close() {
	p.client.Close()
	p.server.Close()
}

// startProxy listens on a free loopback port and forwards to target
// ("host:port").
func startProxy(target string) (*cutProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy listen: %w", err)
	}
	p := &cutProxy{ln: ln, target: target, pairs: map[*proxyPair]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// proxyURL is amqpURL with its host replaced by the proxy's address.
func (p *cutProxy) proxyURL(amqpURL string) (string, error) {
	u, err := url.Parse(amqpURL)
	if err != nil {
		return "", fmt.Errorf("amqp URL: %w", err)
	}
	u.Host = p.ln.Addr().String()
	return u.String(), nil
}

func (p *cutProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		pair := &proxyPair{client: c, server: s}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			pair.close()
			return
		}
		p.pairs[pair] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(pair, s, c)
		go p.pipe(pair, c, s)
	}
}

func (p *cutProxy) pipe(pair *proxyPair, dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	pair.close()
	p.mu.Lock()
	delete(p.pairs, pair)
	p.mu.Unlock()
}

func (p *cutProxy) open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pairs)
}

// cut closes every connection through the proxy and returns how many it
// closed. A cut with nothing to cut proves nothing, so it first waits (up to
// within) for at least one connection to be open.
func (p *cutProxy) cut(ctx context.Context, within time.Duration) int {
	deadline := time.Now().Add(within)
	for p.open() == 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.pairs)
	for pair := range p.pairs {
		pair.close()
		delete(p.pairs, pair)
	}
	return n
}

// close stops listening, closes every connection and waits for the pipes.
func (p *cutProxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.ln.Close()
	p.cut(context.Background(), 0)
	p.wg.Wait()
}
