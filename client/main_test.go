package client

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind: an exec
// handle's reader and writers, the client's connections, the servers'.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
