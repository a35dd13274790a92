package undo_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tai42/sandbox/internal/undo"
)

// setup is a setup of steps a, b, c, d recorded in log: each step logs its
// do and its undo; fail names a step that fails (after doing half, which
// its undo undoes), undoErr the steps whose undo fails.
func setup(s *undo.Stack, log *[]string, fail string, undoErr ...string) error {
	for _, step := range []string{"a", "b", "c", "d"} {
		err := s.Do(step, func() (undo.Func, error) {
			*log = append(*log, "do "+step)
			u := func(context.Context) error {
				*log = append(*log, "undo "+step)
				if slices.Contains(undoErr, step) {
					return fmt.Errorf("undo %s failed", step)
				}
				return nil
			}
			if step == fail {
				return u, fmt.Errorf("step %s failed", step)
			}
			return u, nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func TestUnwindLastFirst(t *testing.T) {
	var s undo.Stack
	var log []string
	err := setup(&s, &log, "c")
	if err == nil {
		t.Fatal("the setup succeeded; step c fails")
	}
	if err := s.Unwind(context.Background()); err != nil {
		t.Fatalf("Unwind: %v", err)
	}
	want := []string{"do a", "do b", "do c", "undo c", "undo b", "undo a"}
	if !slices.Equal(log, want) {
		t.Errorf("ran %q, want %q", log, want)
	}
}

func TestFailedStepNamed(t *testing.T) {
	var s undo.Stack
	var log []string
	err := setup(&s, &log, "b")
	if got := undo.FailedStep(err); got != "b" {
		t.Errorf("FailedStep = %q, want b", got)
	}
	var se *undo.StepError
	if !errors.As(err, &se) || se.Step != "b" {
		t.Errorf("errors.As: %#v", err)
	}
	// The text is the step's own: what users saw before the steps.
	if err.Error() != "step b failed" {
		t.Errorf("the error says %q, want the step's own %q", err, "step b failed")
	}
	if undo.FailedStep(errors.New("other")) != "" || undo.FailedStep(nil) != "" {
		t.Error("FailedStep names a step of an error that is none's")
	}
	_ = s.Unwind(context.Background())
}

func TestStepErrorWraps(t *testing.T) {
	sentinel := errors.New("sentinel")
	var s undo.Stack
	err := s.Do("x", func() (undo.Func, error) { return nil, fmt.Errorf("x: %w", sentinel) })
	if !errors.Is(err, sentinel) {
		t.Errorf("errors.Is(%v, sentinel) = false", err)
	}
	if steps := s.Steps(); len(steps) != 0 {
		t.Errorf("a step that failed with no undo left %q on the stack", steps)
	}
}

func TestEveryUndoRuns(t *testing.T) {
	var s undo.Stack
	var log []string
	if err := setup(&s, &log, "d", "c", "a"); err == nil {
		t.Fatal("the setup succeeded; step d fails")
	}
	err := s.Unwind(context.Background())
	want := []string{"do a", "do b", "do c", "do d", "undo d", "undo c", "undo b", "undo a"}
	if !slices.Equal(log, want) {
		t.Errorf("ran %q, want %q", log, want)
	}
	if err == nil || err.Error() != "undo c failed\nundo a failed" {
		t.Errorf("Unwind = %v, want both undos' errors joined, the later step's first", err)
	}
}

func TestUnwindEmpties(t *testing.T) {
	var s undo.Stack
	var log []string
	_ = setup(&s, &log, "b", "a")
	if err := s.Unwind(context.Background()); err == nil {
		t.Fatal("the first Unwind lost the failing undo's error")
	}
	log = nil
	if err := s.Unwind(context.Background()); err != nil || len(log) != 0 {
		t.Errorf("a second Unwind ran %q and returned %v; the first emptied the stack", log, err)
	}
	var empty undo.Stack
	if err := empty.Unwind(context.Background()); err != nil {
		t.Errorf("Unwind of an empty stack: %v", err)
	}
}

// TestTeardownAfterSuccess is the setup's success: nothing is undone
// then, and the stack, kept by the setup's owner, undoes everything at the
// teardown.
func TestTeardownAfterSuccess(t *testing.T) {
	var log []string
	var teardown undo.Stack
	if err := setup(&teardown, &log, ""); err != nil {
		t.Fatalf("setup: %v", err)
	}
	want := []string{"do a", "do b", "do c", "do d"}
	if !slices.Equal(log, want) {
		t.Fatalf("after a successful setup, ran %q, want %q", log, want)
	}
	if got := teardown.Steps(); !slices.Equal(got, []string{"a", "b", "c", "d"}) {
		t.Errorf("the kept stack holds %q", got)
	}
	log = nil
	if err := teardown.Unwind(context.Background()); err != nil {
		t.Fatal(err)
	}
	if want := []string{"undo d", "undo c", "undo b", "undo a"}; !slices.Equal(log, want) {
		t.Errorf("the teardown ran %q, want %q", log, want)
	}
}

func TestFault(t *testing.T) {
	var s undo.Stack
	var asked []string
	s.Fault = func(step string) error {
		asked = append(asked, step)
		if step == "c" {
			return errors.New("injected")
		}
		return nil
	}
	var log []string
	err := setup(&s, &log, "")
	if undo.FailedStep(err) != "c" || !strings.Contains(err.Error(), "injected") {
		t.Errorf("setup = %v, want the injected failure of step c", err)
	}
	if !slices.Equal(asked, []string{"a", "b", "c"}) {
		t.Errorf("Fault asked of %q, want a, b, c", asked)
	}
	// The faulted step is not done, so nothing of it is undone.
	_ = s.Unwind(context.Background())
	if want := []string{"do a", "do b", "undo b", "undo a"}; !slices.Equal(log, want) {
		t.Errorf("ran %q, want %q", log, want)
	}
}

func TestPushNil(t *testing.T) {
	var s undo.Stack
	s.Push("nothing", nil)
	if n := len(s.Steps()); n != 0 {
		t.Errorf("a nil undo was pushed: %d on the stack", n)
	}
	if err := s.Unwind(context.Background()); err != nil {
		t.Error(err)
	}
}

func TestUnwindContext(t *testing.T) {
	type key struct{}
	var s undo.Stack
	var got any
	s.Push("x", func(ctx context.Context) error { got = ctx.Value(key{}); return nil })
	_ = s.Unwind(context.WithValue(context.Background(), key{}, "teardown"))
	if got != "teardown" {
		t.Errorf("the undo saw context value %v, want the teardown's", got)
	}
}

func TestRun(t *testing.T) {
	var s undo.Stack
	var log []string
	step := func(name string, fail bool) undo.Step {
		return undo.Step{Name: name, Do: func() (undo.Func, error) {
			log = append(log, "do "+name)
			if fail {
				return nil, errors.New(name + " failed")
			}
			return func(context.Context) error { log = append(log, "undo "+name); return nil }, nil
		}}
	}
	err := s.Run(step("a", false), step("b", true), step("c", false))
	if undo.FailedStep(err) != "b" {
		t.Fatalf("Run = %v, want step b's failure", err)
	}
	_ = s.Unwind(context.Background())
	if want := []string{"do a", "do b", "undo a"}; !slices.Equal(log, want) {
		t.Errorf("ran %q, want %q: Run stops at the failing step", log, want)
	}
	log = nil
	if err := s.Run(step("a", false), step("c", false)); err != nil {
		t.Fatal(err)
	}
	if got := s.Steps(); !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("after Run, the stack holds %q", got)
	}
}
