package sandbox

import (
	"fmt"
	"slices"
	"sync"
)

// Registry maps provider names to registered sandboxes. The zero value is
// ready to use; it is safe for concurrent use.
type Registry struct {
	mu    sync.Mutex
	byNm  map[string]Sandbox
	order []string
}

// Register adds sb under name. A name is registered once; registering it
// again is an error, as is an empty name or a nil sandbox.
func (r *Registry) Register(name string, sb Sandbox) error {
	if name == "" || sb == nil {
		return fmt.Errorf("sandbox: register: a provider needs a name and a non-nil Sandbox")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.byNm[name]; dup {
		return fmt.Errorf("sandbox: register: provider %q is already registered", name)
	}
	if r.byNm == nil {
		r.byNm = make(map[string]Sandbox)
	}
	r.byNm[name] = sb
	r.order = append(r.order, name)
	return nil
}

// Unregister removes name; it reports whether it was registered.
func (r *Registry) Unregister(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.byNm[name]; !ok {
		return false
	}
	delete(r.byNm, name)
	r.order = slices.DeleteFunc(r.order, func(n string) bool { return n == name })
	return true
}

// Require returns the sandbox registered under name, or with name "" the
// first one registered. It is the acquisition chokepoint: when no provider
// backs the request it returns an *UnavailableError, the one type every
// consumer catches.
func (r *Registry) Require(name string) (Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if name == "" {
		if len(r.order) == 0 {
			return nil, &UnavailableError{}
		}
		return r.byNm[r.order[0]], nil
	}
	if sb, ok := r.byNm[name]; ok {
		return sb, nil
	}
	return nil, &UnavailableError{Name: name, Registered: slices.Clone(r.order)}
}

// Names lists the registered names in registration order.
func (r *Registry) Names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.order)
}

var defaultRegistry Registry

// Register adds sb to the process-wide registry.
func Register(name string, sb Sandbox) error { return defaultRegistry.Register(name, sb) }

// Unregister removes name from the process-wide registry.
func Unregister(name string) bool { return defaultRegistry.Unregister(name) }

// Require returns a sandbox from the process-wide registry; see
// [Registry.Require].
func Require(name string) (Sandbox, error) { return defaultRegistry.Require(name) }
