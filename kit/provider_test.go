package kit_test

import (
	"testing"
	"time"

	"github.com/tai42/sandbox/kit"
)

// Zero or negative bounds take the defaults; set ones and the state
// directory stay as given.
func TestProviderOptionsWithDefaults(t *testing.T) {
	want := kit.ProviderOptions{StateDir: "/s", MaxOutputBytes: kit.DefaultMaxOutputBytes,
		StreamBuffer: kit.DefaultStreamBuffer, ExitGrace: kit.DefaultExitGrace}
	for _, o := range []kit.ProviderOptions{{StateDir: "/s"}, {StateDir: "/s", MaxOutputBytes: -1, StreamBuffer: -1, ExitGrace: -1}} {
		if got := o.WithDefaults(); got != want {
			t.Errorf("%+v.WithDefaults() = %+v, want %+v", o, got, want)
		}
	}
	set := kit.ProviderOptions{StateDir: "/s", MaxOutputBytes: 5, StreamBuffer: 6, ExitGrace: time.Second}
	if got := set.WithDefaults(); got != set {
		t.Errorf("WithDefaults changed set bounds: %+v, want %+v", got, set)
	}
}
