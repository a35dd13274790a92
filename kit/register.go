package kit

import "github.com/tai42/sandbox"

// Register registers a kit-built provider in reg (nil: the process-wide
// registry) under name, opened by open on its first Require (see
// [sandbox.Registry.RegisterFunc]). It is what a provider package's own
// Register is made of, so that the provider registers itself under the
// name it knows. A nil *Sandbox reaches the registry as no Sandbox, never
// as a non-nil [sandbox.Sandbox] holding nil.
func Register(reg *sandbox.Registry, name string, open func() (*Sandbox, error)) error {
	f := func() (sandbox.Sandbox, error) {
		sb, err := open()
		if err != nil || sb == nil {
			return nil, err
		}
		return sb, nil
	}
	if reg == nil {
		return sandbox.RegisterFunc(name, f)
	}
	return reg.RegisterFunc(name, f)
}
