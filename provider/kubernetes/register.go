package kubernetes

import (
	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
)

// Register registers the kubernetes provider in reg (nil: the process-wide
// registry) under [Name], opened on its first Require with the options
// opts returns then.
func Register(reg *sandbox.Registry, opts func() (Options, error)) error {
	return kit.Register(reg, Name, opts, New)
}
