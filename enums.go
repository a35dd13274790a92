package sandbox

import (
	"encoding/json"
	"fmt"
)

// Durability says whether a session's workspace outlives the session.
type Durability string

const (
	// Ephemeral workspaces are new and empty at create and removed at destroy.
	Ephemeral Durability = "ephemeral"
	// Persistent workspaces belong to the spec's workspace_key: created on
	// first use, they survive destroy and reap, and the next persistent
	// session with the same key sees the same files.
	Persistent Durability = "persistent"
)

// Valid reports whether d is one of the contract's durabilities.
func (d Durability) Valid() bool { return d == Ephemeral || d == Persistent }

// Isolation is a strength tier: none < container < vm.
//
// In a [SessionSpec] the empty Isolation means "the provider's own level"
// (the contract's None); it marshals to JSON null.
type Isolation string

const (
	IsolationNone      Isolation = "none"
	IsolationContainer Isolation = "container"
	IsolationVM        Isolation = "vm"
)

// Valid reports whether i is one of the contract's isolation tiers. The empty
// value (unset) is not valid here; callers that allow it check for it first.
func (i Isolation) Valid() bool {
	return i == IsolationNone || i == IsolationContainer || i == IsolationVM
}

// MarshalJSON writes the empty (unset) Isolation as null.
func (i Isolation) MarshalJSON() ([]byte, error) {
	if i == "" {
		return []byte("null"), nil
	}
	return json.Marshal(string(i))
}

// UnmarshalJSON reads null as the empty (unset) Isolation.
func (i *Isolation) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*i = ""
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("isolation: %w", err)
	}
	*i = Isolation(s)
	return nil
}

// Network is a network tier: none < internal < egress.
type Network string

const (
	// NetworkNone is loopback only.
	NetworkNone Network = "none"
	// NetworkInternal reaches other internal sessions of the same host, no
	// route out.
	NetworkInternal Network = "internal"
	// NetworkEgress reaches out.
	NetworkEgress Network = "egress"
)

// Valid reports whether n is one of the contract's network tiers.
func (n Network) Valid() bool {
	return n == NetworkNone || n == NetworkInternal || n == NetworkEgress
}

// IsolationStrength is the strength rank of an isolation tier
// (none=0 < container=1 < vm=2). An invalid or empty tier ranks -1.
func IsolationStrength(i Isolation) int {
	switch i {
	case IsolationNone:
		return 0
	case IsolationContainer:
		return 1
	case IsolationVM:
		return 2
	}
	return -1
}

// NetworkOpenness is the openness rank of a network tier
// (none=0 < internal=1 < egress=2). An invalid tier ranks -1.
func NetworkOpenness(n Network) int {
	switch n {
	case NetworkNone:
		return 0
	case NetworkInternal:
		return 1
	case NetworkEgress:
		return 2
	}
	return -1
}

// StreamName names one of an exec's two output streams.
type StreamName string

const (
	Stdout StreamName = "stdout"
	Stderr StreamName = "stderr"
)

// Valid reports whether s is stdout or stderr.
func (s StreamName) Valid() bool { return s == Stdout || s == Stderr }
