package main

import (
	"errors"
	"strconv"
	"syscall"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
)

// Exit codes of tai42 itself. A command's own exit code passes through, so
// a command exiting 1, 2 or 124 looks like these (as with timeout(1)).
const (
	exitOK      = 0
	exitFailure = 1   // a sandbox or I/O error other than those below
	exitUsage   = 2   // a usage error, a rejected spec, an unknown provider
	exitTimeout = 124 // the command exceeded --timeout and was killed
)

// signalExit is the code of a run ended by sig: 128+sig, as a shell
// reports (130 for SIGINT, 143 for SIGTERM, 141 for SIGPIPE).
func signalExit(sig syscall.Signal) int { return 128 + int(sig) }

// exitError ends a command with code, printing err (when non-nil) on
// stderr as "tai42: <err>".
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return "exit status " + strconv.Itoa(e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// usageError marks an error in what the user asked for (flags, arguments,
// local files), which exits 2.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usagef(err error) error { return &usageError{err} }

// errorExitCode maps an error to tai42's exit code: 124 for an exec
// timeout; 2 for a usage error, a rejected spec, an unavailable provider or
// a refused pool;
// 1 for anything else.
func errorExitCode(err error) int {
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, sandbox.ErrExecTimeout):
		return exitTimeout
	case errors.As(err, &ue),
		errors.Is(err, sandbox.ErrSpecRejected),
		errors.Is(err, sandbox.ErrUnavailable),
		errors.Is(err, kit.ErrPoolRefused):
		return exitUsage
	}
	return exitFailure
}
