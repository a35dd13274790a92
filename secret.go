package sandbox

import (
	"encoding/json"
	"fmt"
	"log/slog"
)

// Mask is what a [Secret] shows wherever it is printed, logged or marshalled.
const Mask = "[REDACTED]"

// Secret holds a value that must never be shown: an environment value.
//
// Its String, GoString, Format (every fmt verb), LogValue (log/slog) and
// MarshalJSON all show [Mask]; only [Secret.Reveal] reads the value, and
// reflection-based printing of a struct holding a Secret in an unexported
// field prints an address, never the text. UnmarshalJSON reads a plain JSON string into a Secret, so a Secret
// can be received; it is sent only by code that calls Reveal on purpose.
//
// The zero Secret is the empty string. Secrets are not comparable with ==;
// use [Secret.Equal].
type Secret struct {
	// A closure, not a string or a pointer: fmt prints a func as an
	// address under every verb and at every depth, so not even the
	// bad-verb path (%s of a struct holding a Secret in an unexported
	// field) can reach the text.
	get func() string
}

// NewSecret wraps s.
func NewSecret(s string) Secret { return Secret{func() string { return s }} }

// Reveal returns the secret's value. Call it only to hand the value to the
// process that needs it.
func (s Secret) Reveal() string {
	if s.get == nil {
		return ""
	}
	return s.get()
}

// Equal reports whether s and o hold the same value.
func (s Secret) Equal(o Secret) bool { return s.Reveal() == o.Reveal() }

// String returns [Mask].
func (Secret) String() string { return Mask }

// GoString returns [Mask] (for %#v).
func (Secret) GoString() string { return Mask }

// Format prints [Mask] for every verb and flag.
func (Secret) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(Mask)) }

// LogValue makes log/slog print [Mask].
func (Secret) LogValue() slog.Value { return slog.StringValue(Mask) }

// MarshalJSON writes [Mask]: the default JSON of a Secret never carries it.
func (Secret) MarshalJSON() ([]byte, error) { return json.Marshal(Mask) }

// MarshalText writes [Mask] (used by encoders that prefer text, and by JSON
// when a Secret is a map key).
func (Secret) MarshalText() ([]byte, error) { return []byte(Mask), nil }

// UnmarshalJSON reads a JSON string as the secret's value.
func (s *Secret) UnmarshalJSON(b []byte) error {
	var v string
	if err := json.Unmarshal(b, &v); err != nil {
		return fmt.Errorf("secret: want a JSON string") // never echo the input
	}
	*s = NewSecret(v)
	return nil
}

// SecretEnv wraps each value of a plain map as a [Secret].
func SecretEnv(m map[string]string) map[string]Secret {
	if m == nil {
		return nil
	}
	out := make(map[string]Secret, len(m))
	for k, v := range m {
		out[k] = NewSecret(v)
	}
	return out
}
