package sandbox

import (
	"errors"
	"fmt"
	"slices"
	"sync"
)

// Registry maps provider names to sandboxes: registered ready-made
// ([Registry.Register]) or opened on first use ([Registry.RegisterFunc]).
// [Registry.Require] is the acquisition chokepoint: every consumer gets its
// sandbox there, and catches the one *UnavailableError when no provider
// backs the name. The zero value is ready to use; it is safe for
// concurrent use.
//
// The registry never closes a sandbox: whoever registered it (or its
// opener) owns what it is, and closes it when done.
type Registry struct {
	mu     sync.Mutex
	byName map[string]*entry
	order  []string
}

// entry is one registered name: a sandbox, or the opener that makes it on
// the first Require. mu serializes opens, so that the opener runs once
// while it succeeds; it is not the registry's lock, so that a slow open
// (a provider recovering its sessions) does not hold up other names.
type entry struct {
	mu   sync.Mutex
	sb   Sandbox                 // nil until opened
	open func() (Sandbox, error) // nil for a Register'ed sandbox
}

// Register adds sb under name. A name is registered once; registering it
// again is an error, as is an empty name or a nil sandbox. Require(name)
// returns sb itself.
func (r *Registry) Register(name string, sb Sandbox) error {
	if sb == nil {
		return fmt.Errorf("sandbox: register: a provider needs a name and a non-nil Sandbox")
	}
	return r.add(name, &entry{sb: sb})
}

// RegisterFunc adds name with an opener: the first Require of name (or of
// "" while name is the first registered) calls open and returns what it
// opened, and every later Require returns that same sandbox, as
// database/sql opens a driver's connection when first needed. So a process
// may register every provider it embeds and acquire only the one asked
// for: an unknown name is an *UnavailableError naming all of them.
//
// When open fails, Require returns its error (matching what open returned,
// with the name prepended) and keeps nothing: the next Require calls open
// again, as the cause (a state directory in use, say) may have gone. open
// owns what it acquired when it fails, and releases it itself. Concurrent
// Requires of one name wait for the open under way rather than open twice.
// The registry never closes the opened sandbox; its registrant does, when
// done, through the Sandbox's own Close (a kit-built sandbox has one).
//
// As with Register, a name is registered once, and an empty name or a nil
// opener is an error.
func (r *Registry) RegisterFunc(name string, open func() (Sandbox, error)) error {
	if open == nil {
		return fmt.Errorf("sandbox: register: a provider needs a name and a non-nil opener")
	}
	return r.add(name, &entry{open: open})
}

func (r *Registry) add(name string, e *entry) error {
	if name == "" {
		return fmt.Errorf("sandbox: register: a provider needs a name and a non-nil Sandbox")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.byName[name]; dup {
		return fmt.Errorf("sandbox: register: provider %q is already registered", name)
	}
	if r.byName == nil {
		r.byName = make(map[string]*entry)
	}
	r.byName[name] = e
	r.order = append(r.order, name)
	return nil
}

// Unregister removes name; it reports whether it was registered. A sandbox
// its opener made is not closed (see [Registry.RegisterFunc]).
func (r *Registry) Unregister(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.byName[name]; !ok {
		return false
	}
	delete(r.byName, name)
	r.order = slices.DeleteFunc(r.order, func(n string) bool { return n == name })
	return true
}

// Require returns the sandbox registered under name, or with name "" the
// first one registered, opening it first if it was registered with an
// opener ([Registry.RegisterFunc]). It is the acquisition chokepoint: when
// no provider backs the request it returns an *UnavailableError listing the
// registered names, the one type every consumer catches. A failed open is
// the opener's error, not an *UnavailableError: the provider exists and
// said why it cannot run.
func (r *Registry) Require(name string) (Sandbox, error) {
	e, name, err := r.lookup(name)
	if err != nil {
		return nil, err
	}
	return e.get(name)
}

// lookup finds the entry Require(name) returns, and its name.
func (r *Registry) lookup(name string) (*entry, string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if name == "" {
		if len(r.order) == 0 {
			return nil, "", &UnavailableError{}
		}
		name = r.order[0]
	}
	if e, ok := r.byName[name]; ok {
		return e, name, nil
	}
	return nil, "", &UnavailableError{Name: name, Registered: slices.Clone(r.order)}
}

// get returns the entry's sandbox, opening it if it is not yet.
func (e *entry) get(name string) (Sandbox, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sb != nil {
		return e.sb, nil
	}
	sb, err := e.open()
	if err == nil && sb == nil {
		err = errors.New("the opener returned no sandbox and no error")
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox: open provider %q: %w", name, err)
	}
	e.sb = sb
	return sb, nil
}

// Names lists the registered names in registration order.
func (r *Registry) Names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.order)
}

var defaultRegistry Registry

// Register adds sb to the process-wide registry; see [Registry.Register].
func Register(name string, sb Sandbox) error { return defaultRegistry.Register(name, sb) }

// RegisterFunc adds name with an opener to the process-wide registry; see
// [Registry.RegisterFunc].
func RegisterFunc(name string, open func() (Sandbox, error)) error {
	return defaultRegistry.RegisterFunc(name, open)
}

// Unregister removes name from the process-wide registry.
func Unregister(name string) bool { return defaultRegistry.Unregister(name) }

// Require returns a sandbox from the process-wide registry, opening it on
// first use; see [Registry.Require].
func Require(name string) (Sandbox, error) { return defaultRegistry.Require(name) }
