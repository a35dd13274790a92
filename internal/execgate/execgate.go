// Package execgate is the admission gate of a session's exec starts,
// shared by the providers: a start is admitted only while the session is
// open, and closing the session waits for the admitted starts to finish,
// so every exec that started is among those the closer then ends. Without
// the wait, an exec could start after the destroy took its list and run
// on in a session whose resources are gone.
package execgate

import "sync"

// Gate admits the starts of execs P and holds the running ones. The zero
// Gate is open and empty.
type Gate[P comparable] struct {
	starting sync.WaitGroup // admitted starts not yet Done

	mu     sync.Mutex
	closed bool
	procs  map[P]struct{}
}

// Admit admits a start unless the gate is closed. An admitted start calls
// Done once it has added its exec ([Gate.Add]) or failed.
func (g *Gate[P]) Admit() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.starting.Add(1)
	return true
}

// Done ends an admitted start.
func (g *Gate[P]) Done() { g.starting.Done() }

// Add records a started exec; an admitted start adds it before Done.
func (g *Gate[P]) Add(p P) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.procs == nil {
		g.procs = make(map[P]struct{})
	}
	g.procs[p] = struct{}{}
}

// Remove drops an exec that ended; one not held is ignored.
func (g *Gate[P]) Remove(p P) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.procs, p)
}

// Closed reports whether Close has begun.
func (g *Gate[P]) Closed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}

// Close refuses every later start, waits for the admitted ones, and
// returns the execs then held, for the caller to end. first is false when
// the gate was closed already (procs is then nil): the session's end is
// another caller's.
func (g *Gate[P]) Close() (procs []P, first bool) {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil, false
	}
	g.closed = true
	g.mu.Unlock()
	g.starting.Wait()
	g.mu.Lock()
	defer g.mu.Unlock()
	procs = make([]P, 0, len(g.procs))
	for p := range g.procs {
		procs = append(procs, p)
	}
	return procs, true
}
