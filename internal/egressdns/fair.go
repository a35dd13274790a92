package egressdns

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
)

// slots shares the queries the server answers at once among its clients
// (sessions, told apart by source address: the fences redirect a session's
// DNS without masquerading it). One pool for all let one session hold
// every slot with queries for a name that never answers, and every other
// session's DNS failed until those timed out. So a client holds at most
// perClient slots, and a query that finds the pool full takes the slot of
// the oldest query of the client holding the most, when that client holds
// at least two more than the asker: however many sessions flood, one that
// asks less than they do still gets its share.
type slots struct {
	limit, perClient int

	mu      sync.Mutex
	total   int
	clients map[netip.Addr][]*slot // by client, oldest first
}

// slot is one query's (or one TCP connection's) hold on the pool.
type slot struct {
	client    netip.Addr
	stop      func()      // ends the query's upstream exchanges, or closes the connection
	preempted atomic.Bool // its hold was given to another client
}

func newSlots(limit, perClient int) *slots {
	return &slots{limit: limit, perClient: perClient, clients: make(map[netip.Addr][]*slot)}
}

// acquire takes a slot for a query from client, with the context its
// upstream exchanges run in (ended when the slot is taken from it, or
// when parent ends; the caller cancels it when done), or returns nil when
// the client may not have one now.
func (p *slots) acquire(parent context.Context, client netip.Addr) (*slot, context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	sl := p.take(client, cancel)
	if sl == nil {
		cancel()
		return nil, nil, nil
	}
	return sl, ctx, cancel
}

// take takes a slot for client, whose holder stop ends should another
// client's take it, or returns nil when the client may not have one now.
func (p *slots) take(client netip.Addr, stop func()) *slot {
	p.mu.Lock()
	defer p.mu.Unlock()
	held := len(p.clients[client])
	if held >= p.perClient {
		return nil
	}
	if p.total >= p.limit && !p.preemptLocked(held) {
		return nil
	}
	sl := &slot{client: client, stop: stop}
	p.clients[client] = append(p.clients[client], sl)
	p.total++
	return sl
}

// preemptLocked frees the slot of the oldest holder of the client holding
// the most, when it holds at least two more than held (with one more, the
// taking would only swap which of the two holds more).
func (p *slots) preemptLocked(held int) bool {
	var victim netip.Addr
	most := 0
	for c, q := range p.clients {
		if len(q) > most {
			victim, most = c, len(q)
		}
	}
	if most < held+2 {
		return false
	}
	q := p.clients[victim]
	old := q[0]
	p.removeLocked(victim, q, 0)
	old.preempted.Store(true)
	old.stop()
	return true
}

func (p *slots) removeLocked(client netip.Addr, q []*slot, i int) {
	q = slices.Delete(q, i, i+1)
	if len(q) == 0 {
		delete(p.clients, client)
	} else {
		p.clients[client] = q
	}
	p.total--
}

// release gives sl back, unless it was taken already.
func (p *slots) release(sl *slot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if sl.preempted.Load() {
		return
	}
	q := p.clients[sl.client]
	if i := slices.Index(q, sl); i >= 0 {
		p.removeLocked(sl.client, q, i)
	}
}

// fairListener shares the TCP connections the server keeps open among
// clients by the same rules as the queries: a client over its bound has
// its connection closed at once, and one that finds them all taken takes
// the oldest of the client holding the most (at least two more). Without
// it, one session holding every connection open kept every other
// session's TCP queries waiting in the kernel's backlog.
type fairListener struct {
	net.Listener
	conns *slots
}

func (l *fairListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		var client netip.Addr
		if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
			client = a.AddrPort().Addr().Unmap()
		}
		fc := &fairConn{Conn: c, conns: l.conns}
		if fc.sl = l.conns.take(client, func() { c.Close() }); fc.sl == nil {
			c.Close()
			continue
		}
		return fc, nil
	}
}

// fairConn gives its slot back when closed.
type fairConn struct {
	net.Conn
	conns *slots
	sl    *slot
	once  sync.Once
}

func (c *fairConn) Close() error {
	c.once.Do(func() { c.conns.release(c.sl) })
	return c.Conn.Close()
}
