package kit

import "github.com/tai42/sandbox"

// Register registers a kit-built provider in reg (nil: the process-wide
// registry) under name, opened on its first Require (see
// [sandbox.Registry.RegisterFunc]) by build, with the options opts returns
// then: what they need opened (a durable ledger) is opened only for the
// provider asked for. It is the whole of a provider package's own
// Register, so that the provider registers itself under the name it
// knows. A nil *Sandbox reaches the registry as no Sandbox, never as a
// non-nil [sandbox.Sandbox] holding nil.
func Register[O any](reg *sandbox.Registry, name string, opts func() (O, error), build func(O) (*Sandbox, error)) error {
	open := func() (sandbox.Sandbox, error) {
		o, err := opts()
		if err != nil {
			return nil, err
		}
		sb, err := build(o)
		if err != nil || sb == nil {
			return nil, err
		}
		return sb, nil
	}
	if reg == nil {
		return sandbox.RegisterFunc(name, open)
	}
	return reg.RegisterFunc(name, open)
}

// Wrap is a provider constructor's last line: the provider its own
// constructor returned (with err) wrapped by [New]. The sandbox owns
// opts.Ledger from the start, as New does: when the constructor failed,
// Wrap closes the ledger, once, so that its caller never does.
func Wrap(prov Provider, err error, opts Options) (*Sandbox, error) {
	if err != nil {
		if opts.Ledger != nil {
			_ = opts.Ledger.Close() // the constructor's error is the one to report
		}
		return nil, err
	}
	return New(prov, opts)
}
