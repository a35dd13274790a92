package container

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// stdioKeep is how much of what a container writes to its stdout and
// stderr is kept: the runtime's messages and the agent's at the start,
// for the error of a create that failed (a failed start writes a few
// lines).
const stdioKeep = 16 << 10

// stdioLog is a container's stdout and stderr: a pipe this process
// drains for as long as the container holds it, keeping the first
// stdioKeep bytes until the start is over and nothing after.
//
// Not a file: PID 1 inherits the runtime's stdout and stderr, and a
// session reaches them through /proc/1/fd. A file on the host (the
// bundle's log, as they were) names a host path there and, to a session
// without a user namespace (root on the host) or one crun hands them to
// (it gives the container's root the ownership of its stdio), is a file
// it may write without the disk cap's bound. The pipe is named by no path
// and holds nothing: what a session writes into it is read and thrown
// away. (After this process ends, nobody reads it: a write from the
// session blocks, or fails with EPIPE, which the agent takes for an
// error, not a signal; see the agent's Run.)
type stdioLog struct {
	w   *os.File // the write end, for the runtime to hand on; nil once it has
	r   *os.File // the read end, non-blocking, on the runtime's poller
	raw syscall.RawConn

	// mu orders the reads: both the drain and text read the pipe, and
	// what each read gets is kept in the order it was written.
	mu      sync.Mutex
	kept    []byte
	settled bool // the start is over: nothing more is kept

	done chan struct{} // closed when the drain has ended
}

// newStdioLog makes a container's stdout and stderr and starts draining
// them.
func newStdioLog() (*stdioLog, error) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		return nil, fmt.Errorf("the container's stdout and stderr (a pipe): %w", err)
	}
	// The read end alone is non-blocking: the runtime's messages and the
	// agent's logging write to a blocking pipe, as to any other stdout.
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, fmt.Errorf("the container's stdout and stderr (a pipe): %w", err)
	}
	l := &stdioLog{
		r:    os.NewFile(uintptr(fds[0]), "|stdio"),
		w:    os.NewFile(uintptr(fds[1]), "|stdio"),
		done: make(chan struct{}),
	}
	var err error
	if l.raw, err = l.r.SyscallConn(); err != nil {
		l.r.Close()
		l.w.Close()
		return nil, fmt.Errorf("the container's stdout and stderr (a pipe): %w", err)
	}
	go l.drain()
	return l, nil
}

// handedOn closes this process's copy of the write end, once the runtime
// has its own: the drain then ends when the container's last process
// does.
func (l *stdioLog) handedOn() {
	if l.w != nil {
		l.w.Close()
		l.w = nil
	}
}

// drain reads the pipe until every writer is gone or close closes it. It
// waits on the runtime's poller, not on a thread of its own.
func (l *stdioLog) drain() {
	defer close(l.done)
	_ = l.raw.Read(func(fd uintptr) bool {
		buf := make([]byte, 4096)
		for {
			n, err := l.readOnce(int(fd), buf)
			switch {
			case err == unix.EINTR:
			case err == unix.EAGAIN:
				return false // wait for more
			case n <= 0:
				return true // every writer is gone, or the pipe fails
			}
		}
	})
}

// readOnce reads the pipe once, keeping what it got while the start is
// not over.
func (l *stdioLog) readOnce(fd int, buf []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, err := unix.Read(fd, buf)
	if n > 0 && !l.settled {
		l.kept = append(l.kept, buf[:min(n, stdioKeep-len(l.kept))]...)
	}
	return n, err
}

// text is the end of what was kept, at most n bytes, for an error: what
// the pipe holds now is read first, so that it has everything the
// runtime wrote before it exited, whether or not the drain has woken up
// to it yet.
func (l *stdioLog) text(n int) string {
	_ = l.raw.Control(func(fd uintptr) {
		buf := make([]byte, 4096)
		// Bounded: a pipe holds 64 KiB, and a writer that never stops
		// must not hold this here.
		for range 64 {
			if k, err := l.readOnce(int(fd), buf); k <= 0 && err != unix.EINTR {
				return
			}
		}
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.TrimSpace(string(l.kept[max(0, len(l.kept)-n):]))
}

// settle ends the start: what was kept is let go of, and what comes
// after is read and thrown away.
func (l *stdioLog) settle() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.settled, l.kept = true, nil
}

// close stops the drain and closes the pipe's ends this process holds.
func (l *stdioLog) close() {
	l.handedOn()
	l.r.Close() // wakes the drain's wait
	<-l.done
}
