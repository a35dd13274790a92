package main

import (
	"context"
	"errors"
	"sync/atomic"
	"syscall"
)

// interruption records the signal that ended a command, if one did.
type interruption struct{ sig atomic.Int32 }

// code returns the exit code of a command ended by a signal (128+sig) and
// whether a signal arrived.
func (in *interruption) code() (int, bool) {
	if sig := in.sig.Load(); sig != 0 {
		return signalExit(syscall.Signal(sig)), true
	}
	return 0, false
}

// signal returns the signal that arrived, if one did.
func (in *interruption) signal() (syscall.Signal, bool) {
	sig := in.sig.Load()
	return syscall.Signal(sig), sig != 0
}

// interruptible returns a context that a signal on c.signals cancels, the
// interruption recording which signal it was, and a stop function that
// stops watching and cancels the context (call it when done).
func (c *cli) interruptible() (context.Context, *interruption, func()) {
	return c.interruptibleWith(nil)
}

// interruptibleWith is interruptible, but a SIGHUP calls onHUP (on the
// watching goroutine, one at a time) rather than interrupting, when onHUP
// is not nil: a daemon's "reload".
func (c *cli) interruptibleWith(onHUP func()) (context.Context, *interruption, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	in := &interruption{}
	if c.signals == nil {
		return ctx, in, cancel
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case s := <-c.signals:
				if s == syscall.SIGHUP && onHUP != nil {
					onHUP()
					continue
				}
				if sig, ok := s.(syscall.Signal); ok {
					in.sig.Store(int32(sig))
				} else {
					in.sig.Store(int32(syscall.SIGTERM))
				}
				cancel()
			case <-stop:
			}
			return
		}
	}()
	return ctx, in, func() {
		close(stop)
		<-done
		cancel()
	}
}

// cleanupContext is the bounded context teardown (kill, destroy, close)
// runs under: never the cancelled one.
func cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
}

// finish maps a command's error to its *exitError: the signal's code when
// one interrupted it (the cancelled call's error is then not printed), an
// *exitError as is, anything else by errorExitCode with the error printed
// (explained first when it came from the daemon).
func (c *cli) finish(in *interruption, err error) error {
	if err == nil {
		return nil
	}
	if code, ok := in.code(); ok {
		return &exitError{code: code}
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee
	}
	err = c.explain(err)
	return &exitError{code: errorExitCode(err), err: err}
}
