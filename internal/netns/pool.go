package netns

import "sync"

// Pool keeps a few network namespaces made ahead, refilled by one
// background goroutine, so that a session's setup does not wait for the
// kernel to build one (most of a network "none" create's cost otherwise).
// The goroutine starts at the first Take and stops at Close.
type Pool struct {
	size   int
	opts   Options
	start  sync.Once
	refill chan struct{}
	stop   chan struct{}
	done   chan struct{}

	mu     sync.Mutex
	ready  []*NS
	closed bool
}

// NewPool returns a pool keeping size namespaces made as o says.
func NewPool(size int, o Options) *Pool {
	return &Pool{size: size, opts: o, refill: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
}

// Take returns a namespace from the pool, or makes one when it is empty
// (or closed). Safe for concurrent use.
func (p *Pool) Take() (*NS, error) {
	p.start.Do(func() { go p.fill() })
	p.mu.Lock()
	var ns *NS
	if n := len(p.ready); n > 0 {
		ns, p.ready = p.ready[n-1], p.ready[:n-1]
	}
	p.mu.Unlock()
	select {
	case p.refill <- struct{}{}:
	default:
	}
	if ns != nil {
		return ns, nil
	}
	return New(p.opts)
}

func (p *Pool) fill() {
	defer close(p.done)
	for {
		select {
		case <-p.stop:
			return
		case <-p.refill:
		}
		for {
			p.mu.Lock()
			full := p.closed || len(p.ready) >= p.size
			p.mu.Unlock()
			if full {
				break
			}
			ns, err := New(p.opts)
			if err != nil {
				break // Take makes its own and reports the error
			}
			p.mu.Lock()
			if p.closed {
				p.mu.Unlock()
				ns.Close()
				return
			}
			p.ready = append(p.ready, ns)
			p.mu.Unlock()
		}
	}
}

// Close stops the refill goroutine and releases the namespaces made
// ahead. Idempotent: the owner's Close and Abandon may both reach it.
func (p *Pool) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	ready := p.ready
	p.ready = nil
	p.mu.Unlock()
	p.start.Do(func() { close(p.done) }) // never started: nothing to wait for
	close(p.stop)
	<-p.done
	for _, ns := range ready {
		ns.Close()
	}
}
