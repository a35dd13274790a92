package container

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// ahead holds a few things a create needs made ahead (session disks, user
// namespaces), so that a create takes one instead of making it. A
// goroutine refills it after each take, in the background: at the lowest
// CPU and I/O priority, and once no create has been running for
// refillQuiet (at the latest refillMaxDefer after the take), so that the
// refill does not slow the creates it would run beside. Safe for
// concurrent use.
type ahead[T any] struct {
	what    string            // what it holds, for the log: "session disks"
	want    int               // how many
	make    func() (T, error) // makes one
	discard func(T)           // lets go of one no create took
	creates *creates          // the creates the refill waits for
	log     *slog.Logger

	mu      sync.Mutex
	ready   []T
	closed  bool
	failed  error         // the refill's last failure, until the next take or success
	changed chan struct{} // closed and replaced at each change of the above

	kick chan struct{} // a take happened: make more
	stop chan struct{}
	done chan struct{}
}

// How the refill waits for the creates to be done. A disk or a user
// namespace is about a millisecond of work, mostly the kernel's: short
// enough to make in the pause between one create and the next of a client
// that creates, runs and destroys sessions one after another, which a
// longer wait (20 ms, when a disk was a mkfs.ext4) never found; each of its
// creates then made its own, and the deferred refill landed in one of
// them.
const (
	refillQuiet    = 2 * time.Millisecond
	refillMaxDefer = time.Second
)

func newAhead[T any](what string, want int, mk func() (T, error), discard func(T), c *creates, log *slog.Logger) *ahead[T] {
	a := &ahead[T]{what: what, want: want, make: mk, discard: discard, creates: c, log: log,
		changed: make(chan struct{}), kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go a.fill()
	return a
}

// notify wakes the waiters of a change; a.mu must be held.
func (a *ahead[T]) notify() {
	close(a.changed)
	a.changed = make(chan struct{})
}

// fill keeps want made until stop. One it cannot make is logged, and
// tried again at the next take.
func (a *ahead[T]) fill() {
	defer close(a.done)
	// The refill's own work at the lowest priority too: on a thread of
	// its own, which ends with it. Never the main thread, which outlives
	// it.
	runtime.LockOSThread()
	if tid := unix.Gettid(); tid != unix.Getpid() {
		lowPriority(tid)
	}
	for {
		for {
			a.mu.Lock()
			n := len(a.ready)
			a.mu.Unlock()
			if n >= a.want || !a.creates.waitQuiet(a.stop) {
				break
			}
			v, err := a.make()
			a.mu.Lock()
			if err != nil {
				a.failed = err
				a.notify()
				a.mu.Unlock()
				a.log.Warn("container: cannot make "+a.what+" ahead; creates make their own meanwhile", "err", err)
				break
			}
			if a.closed {
				a.mu.Unlock()
				a.discard(v)
				return
			}
			a.ready = append(a.ready, v)
			a.failed = nil
			a.notify()
			a.mu.Unlock()
		}
		select {
		case <-a.stop:
			return
		case <-a.kick:
		}
	}
}

// take returns one made ahead; false when none is ready.
func (a *ahead[T]) take() (T, bool) {
	a.mu.Lock()
	var v T
	ok := false
	if n := len(a.ready); n > 0 && !a.closed {
		v, ok = a.ready[n-1], true
		a.ready = a.ready[:n-1]
	}
	a.failed = nil // the refill tries again
	a.notify()
	a.mu.Unlock()
	select {
	case a.kick <- struct{}{}:
	default:
	}
	return v, ok
}

// wait waits until want are ready, and returns them (for a look: they
// stay). It fails with the refill's error when the refill failed since
// the last take, when it is closed, or when ctx ends.
func (a *ahead[T]) wait(ctx context.Context) ([]T, error) {
	for {
		a.mu.Lock()
		ready := append([]T(nil), a.ready...)
		closed, failed, changed := a.closed, a.failed, a.changed
		a.mu.Unlock()
		switch {
		case closed:
			return nil, fmt.Errorf("the pool of %s is closed", a.what)
		case len(ready) >= a.want:
			return ready, nil
		case failed != nil:
			return nil, fmt.Errorf("the refill of %s failed: %w", a.what, failed)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the pool of %s to be refilled (%d of %d ready): %w", a.what, len(ready), a.want, ctx.Err())
		}
	}
}

// close stops the refill and discards what is ready.
func (a *ahead[T]) close() {
	for _, v := range a.end() {
		a.discard(v)
	}
}

// abandon stops the refill and lets go of what is ready as the process's
// death would: the next start sweeps what it leaves.
func (a *ahead[T]) abandon() { a.end() }

// end stops the refill and returns what was ready.
func (a *ahead[T]) end() []T {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	ready := a.ready
	a.ready = nil
	a.notify()
	a.mu.Unlock()
	close(a.stop)
	<-a.done
	return ready
}

// creates counts the creates running, which the refills wait for. The
// zero value is ready to use; safe for concurrent use.
type creates struct {
	mu      sync.Mutex
	running int
	lastEnd time.Time // when the last create ended
}

// begin and end bracket a create.
func (c *creates) begin() {
	c.mu.Lock()
	c.running++
	c.mu.Unlock()
}

func (c *creates) end() {
	c.mu.Lock()
	c.running--
	c.lastEnd = time.Now()
	c.mu.Unlock()
}

// waitQuiet waits until no create has run for refillQuiet, or
// refillMaxDefer has passed; false when stop is closed meanwhile.
func (c *creates) waitQuiet(stop <-chan struct{}) bool {
	deadline := time.Now().Add(refillMaxDefer)
	for {
		c.mu.Lock()
		busy, since := c.running > 0, time.Since(c.lastEnd)
		c.mu.Unlock()
		wait := refillQuiet
		if !busy {
			if since >= refillQuiet {
				return true
			}
			wait -= since
		}
		left := time.Until(deadline)
		if left <= 0 {
			return true
		}
		timer := time.NewTimer(min(wait, left))
		select {
		case <-stop:
			timer.Stop()
			return false
		case <-timer.C:
		}
	}
}
