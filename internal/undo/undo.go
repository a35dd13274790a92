// Package undo runs a setup as named steps and keeps, for each step that
// made something, the function that undoes it, on a stack: when a step
// fails, what the steps before it made is undone last first; when the
// setup succeeds, its owner takes the stack and unwinds it at its
// teardown, so that a setup and its teardown are written once, side by
// side, and cannot drift apart.
//
// It is the pattern of firecracker-go-sdk's handler list and cleanup
// funcs, with the undos run whatever their errors: a teardown that stops
// at its first failure leaks everything below it.
package undo

import (
	"context"
	"errors"
)

// Func undoes one step. ctx is the teardown's, not the setup's: a setup's
// undos may run long after it, at its owner's teardown.
type Func func(ctx context.Context) error

// Stack holds the undos of the steps done so far, the last on top. The zero
// value is an empty stack, ready to use. A Stack is not safe for concurrent
// use: a setup and its teardown are each one goroutine's.
type Stack struct {
	// Fault, when set, is asked before each step of Do; an error it returns
	// fails that step in its stead, undoing what the steps before made as
	// a failure of the step's own would. It is how a test fails a setup at
	// each of its steps; nil in production.
	Fault func(step string) error

	undos []entry
}

type entry struct {
	step string
	fn   Func
}

// Push adds fn, the undo of step, on top of the stack. A nil fn is not
// pushed.
func (s *Stack) Push(step string, fn Func) {
	if fn != nil {
		s.undos = append(s.undos, entry{step: step, fn: fn})
	}
}

// Do runs step: fn does it and returns what undoes it (nil: it left
// nothing to undo). The undo is pushed whether fn succeeded or not: a step
// that fails halfway returns, with its error, what undoes the half it did.
// An error is returned as a *StepError naming step; Do does not unwind (the
// setup's deferred Unwind does, once, for every step).
func (s *Stack) Do(step string, fn func() (Func, error)) error {
	if s.Fault != nil {
		if err := s.Fault(step); err != nil {
			return &StepError{Step: step, Err: err}
		}
	}
	undo, err := fn()
	s.Push(step, undo)
	if err != nil {
		return &StepError{Step: step, Err: err}
	}
	return nil
}

// Step is one step of a setup: its name, and what does it and returns its
// undo (see Do).
type Step struct {
	Name string
	Do   func() (Func, error)
}

// Run does steps in order, each as Do does, and stops at the first that
// fails, returning its error: a setup written as the list of its steps.
func (s *Stack) Run(steps ...Step) error {
	for _, st := range steps {
		if err := s.Do(st.Name, st.Do); err != nil {
			return err
		}
	}
	return nil
}

// Unwind runs the undos on the stack, the last pushed first, every one of
// them even when one fails, and empties the stack. It returns their errors
// joined (errors.Join), nil when all succeeded or there were none.
func (s *Stack) Unwind(ctx context.Context) error {
	var errs []error
	for i := len(s.undos) - 1; i >= 0; i-- {
		if err := s.undos[i].fn(ctx); err != nil {
			errs = append(errs, err)
		}
		s.undos[i] = entry{} // let go of what the undo holds
	}
	s.undos = s.undos[:0]
	return errors.Join(errs...)
}

// Steps are the names of the undos on the stack, the first pushed first.
func (s *Stack) Steps() []string {
	names := make([]string, len(s.undos))
	for i, e := range s.undos {
		names[i] = e.step
	}
	return names
}

// StepError is the failure of a setup's step. Its text is the step's own
// error's, unchanged: that error already says what failed, in the words
// its callers see; the step's name is for programs (errors.As) and logs.
type StepError struct {
	Step string
	Err  error
}

func (e *StepError) Error() string { return e.Err.Error() }
func (e *StepError) Unwrap() error { return e.Err }

// FailedStep is the name of the step whose failure err is (or wraps), and
// "" when it is none.
func FailedStep(err error) string {
	var se *StepError
	if errors.As(err, &se) {
		return se.Step
	}
	return ""
}
