package kubernetes

import (
	"errors"
	"slices"
	"testing"

	"github.com/tai42/sandbox"
)

func TestRegister(t *testing.T) {
	var reg sandbox.Registry
	calls := 0
	if err := Register(&reg, func() (Options, error) { calls++; return Options{}, nil }); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(reg.Names(), Name) {
		t.Fatalf("names %v", reg.Names())
	}
	if calls != 0 {
		t.Fatal("options read before Require")
	}
	// Opened on Require: no agent image is a setup error, no sandbox.
	sb, err := reg.Require(Name)
	var se *SetupError
	if !errors.As(err, &se) || se.Check != CheckOptions || sb != nil {
		t.Fatalf("Require: %v %v", sb, err)
	}
}
