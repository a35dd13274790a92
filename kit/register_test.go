package kit_test

import (
	"context"
	"errors"
	"testing"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
)

// TestRegister: a kit-built provider registered by name opens on its
// first Require, once; a failed open reaches the caller as its error, and
// the next Require opens again; an open that returns a nil *kit.Sandbox
// and no error is an error too, not a non-nil Sandbox holding nil.
func TestRegister(t *testing.T) {
	var reg sandbox.Registry
	opens := 0
	fail := errors.New("the state directory is in use")
	err := kit.Register(&reg, "fake", noOptions, func(struct{}) (*kit.Sandbox, error) {
		opens++
		if opens == 1 {
			return nil, fail
		}
		return kit.New(&fakeProvider{iso: "none"}, kit.Options{Policy: open})
	})
	if err != nil {
		t.Fatal(err)
	}
	if opens != 0 {
		t.Fatalf("Register opened the provider (%d opens); want it opened at the first Require", opens)
	}
	sb, err := reg.Require("fake")
	if !errors.Is(err, fail) || sb != nil {
		t.Fatalf("Require over a failing open = %#v, %v; want no sandbox and the open's error", sb, err)
	}
	sb, err = reg.Require("fake")
	if err != nil {
		t.Fatal(err)
	}
	defer sb.(*kit.Sandbox).Close(context.Background())
	again, err := reg.Require("fake")
	if err != nil || again != sb || opens != 2 {
		t.Errorf("a second Require = %v, %v after %d opens; want the same sandbox, opened twice in all", again, err, opens)
	}
	if err := kit.Register(&reg, "fake", noOptions, func(struct{}) (*kit.Sandbox, error) { return nil, nil }); err == nil {
		t.Error("a second registration of one name succeeded")
	}
	if err := kit.Register(&reg, "nil", noOptions, func(struct{}) (*kit.Sandbox, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	if sb, err := reg.Require("nil"); err == nil || sb != nil {
		t.Errorf("Require over an open returning a nil *kit.Sandbox = %#v, %v; want no sandbox and an error", sb, err)
	}
}

func noOptions() (struct{}, error) { return struct{}{}, nil }

// TestWrap: a provider constructor that failed has its ledger closed by
// Wrap, once, and its error returned; one that did not is the kit's.
func TestWrap(t *testing.T) {
	l := &countingLedger{MemoryLedger: kit.NewMemoryLedger()}
	fail := errors.New("no state directory")
	if sb, err := kit.Wrap(nil, fail, kit.Options{Policy: open, Ledger: l}); sb != nil || !errors.Is(err, fail) || l.closes != 1 {
		t.Fatalf("Wrap of a failed constructor = %v, %v, ledger closed %d times; want its error and one close", sb, err, l.closes)
	}
	l = &countingLedger{MemoryLedger: kit.NewMemoryLedger()}
	sb, err := kit.Wrap(&fakeProvider{iso: "none"}, nil, kit.Options{Policy: open, Ledger: l})
	if err != nil {
		t.Fatal(err)
	}
	if l.closes != 0 {
		t.Errorf("Wrap closed the ledger of a sandbox it made (%d closes)", l.closes)
	}
	sb.Close(context.Background())
	if l.closes != 1 {
		t.Errorf("the sandbox's Close closed its ledger %d times, want once", l.closes)
	}
}

type countingLedger struct {
	*kit.MemoryLedger
	closes int
}

func (l *countingLedger) Close() error { l.closes++; return l.MemoryLedger.Close() }
