package dedup

import (
	"container/list"
	"context"
	"errors"
	"sync"
	"time"
)

// MemoryConfig configures a [Memory] store. The zero value is usable.
type MemoryConfig struct {
	// MaxEntries bounds the records kept; the least recently used record is
	// evicted past it (an evicted done record can let a duplicate through,
	// which the Evictions counter shows). Default 1,000,000.
	MaxEntries int
	// Now is the clock (tests). Default time.Now.
	Now func() time.Time
}

// Memory is an in-process store: single process only, bounded (LRU + TTL),
// safe for concurrent use. It is the embedded default.
type Memory struct {
	cfg MemoryConfig

	mu        sync.Mutex
	items     map[string]*list.Element
	lru       *list.List // front = most recently used
	evictions int64
	closed    bool
}

// ErrStoreClosed is the cause of every StoreError from a closed Memory store.
var ErrStoreClosed = errors.New("store closed")

type memEntry struct {
	key     string
	state   State
	owner   string
	expires time.Time
}

// NewMemory returns an in-memory store.
func NewMemory(cfg MemoryConfig) *Memory {
	if cfg.MaxEntries <= 0 {
		cfg.MaxEntries = 1_000_000
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Memory{cfg: cfg, items: map[string]*list.Element{}, lru: list.New()}
}

var _ Store = (*Memory)(nil)
var _ Inspector = (*Memory)(nil)

// live returns the unexpired entry for key, dropping an expired one.
func (m *Memory) live(key string, now time.Time) *memEntry {
	el, ok := m.items[key]
	if !ok {
		return nil
	}
	e := el.Value.(*memEntry)
	if !now.Before(e.expires) {
		m.lru.Remove(el)
		delete(m.items, key)
		return nil
	}
	m.lru.MoveToFront(el)
	return e
}

func (m *Memory) put(key string, e *memEntry) {
	if el, ok := m.items[key]; ok {
		el.Value = e
		m.lru.MoveToFront(el)
		return
	}
	m.items[key] = m.lru.PushFront(e)
	for len(m.items) > m.cfg.MaxEntries {
		back := m.lru.Back()
		m.lru.Remove(back)
		delete(m.items, back.Value.(*memEntry).key)
		m.evictions++
	}
}

// Claim implements [Store].
func (m *Memory) Claim(ctx context.Context, key, token string, lease time.Duration) (Claim, error) {
	if err := CheckOp(ctx, "claim", key); err != nil {
		return Claim{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return Claim{}, &StoreError{Op: "claim", Err: ErrStoreClosed}
	}
	now := m.cfg.Now()
	if e := m.live(key, now); e != nil {
		switch {
		case e.state == StateDone:
			return Claim{Result: Done}, nil
		case e.owner != token:
			return Claim{Result: InFlight, LeaseLeft: e.expires.Sub(now)}, nil
		}
	}
	m.put(key, &memEntry{key: key, state: StateProcessing, owner: token, expires: now.Add(lease)})
	return Claim{Result: Acquired}, nil
}

// Complete implements [Store].
func (m *Memory) Complete(ctx context.Context, key, token string, window time.Duration) error {
	if err := CheckOp(ctx, "complete", key); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return &StoreError{Op: "complete", Err: ErrStoreClosed}
	}
	now := m.cfg.Now()
	e := m.live(key, now)
	switch {
	case e != nil && e.state == StateProcessing && e.owner == token:
		m.put(key, &memEntry{key: key, state: StateDone, expires: now.Add(window)})
		return nil
	case e == nil:
		m.put(key, &memEntry{key: key, state: StateDone, expires: now.Add(window)})
	}
	return ErrLeaseLost
}

// Release implements [Store].
func (m *Memory) Release(ctx context.Context, key, token string) error {
	if err := CheckOp(ctx, "release", key); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return &StoreError{Op: "release", Err: ErrStoreClosed}
	}
	e := m.live(key, m.cfg.Now())
	if e == nil || e.state != StateProcessing || e.owner != token {
		return ErrLeaseLost
	}
	m.lru.Remove(m.items[key])
	delete(m.items, key)
	return nil
}

// Extend implements [Store].
func (m *Memory) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	if err := CheckOp(ctx, "extend", key); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return &StoreError{Op: "extend", Err: ErrStoreClosed}
	}
	now := m.cfg.Now()
	e := m.live(key, now)
	if e == nil || e.state != StateProcessing || e.owner != token {
		return ErrLeaseLost
	}
	e.expires = now.Add(lease)
	return nil
}

// Get implements [Inspector].
func (m *Memory) Get(ctx context.Context, key string) (Record, bool, error) {
	if err := CheckOp(ctx, "get", key); err != nil {
		return Record{}, false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.live(key, m.cfg.Now())
	if e == nil {
		return Record{}, false, nil
	}
	return Record{Key: key, State: e.state, Owner: e.owner, ExpiresAt: e.expires}, true, nil
}

// Forget implements [Inspector].
func (m *Memory) Forget(ctx context.Context, key string) error {
	if err := CheckOp(ctx, "forget", key); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if el, ok := m.items[key]; ok {
		m.lru.Remove(el)
		delete(m.items, key)
	}
	return nil
}

// Len returns the number of records held (expired ones included until touched).
func (m *Memory) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.items)
}

// Evictions returns how many records were evicted by the size bound.
func (m *Memory) Evictions() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.evictions
}

// Close makes every later operation fail with a [*StoreError].
func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}
