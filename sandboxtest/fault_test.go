package sandboxtest_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/execout"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/host"
)

// Faults a provider may meet that no exec can cause from outside: the exit
// status cannot be read, or the exec itself failed (input it accepted never
// reached the command) with its status known. The host runner's provider is
// wrapped so that its real execs' output goes through the sinks every
// provider hands its output to (internal/execout), ended with such a
// failure; through the kit, the caller must get the failure: never an
// invented exit code, and a failure decided before a kill is not cleared by
// the kill.

// errStatus is the failure of an exec whose exit status cannot be read;
// errFailed that of an exec that failed itself, its status known.
var (
	errStatus = sandbox.Errorf("exec", "cannot read the exec's exit status (injected)")
	errFailed = sandbox.Errorf("exec", "stdin input the provider accepted never reached the exec (injected)")
)

// faultProvider is the host runner's provider whose execs end with a fault.
type faultProvider struct{ kit.Provider }

func (f faultProvider) Create(ctx context.Context, req kit.CreateRequest) (kit.Resources, error) {
	res, err := f.Provider.Create(ctx, req)
	if err != nil {
		return nil, err
	}
	return faultRes{res}, nil
}

// Close closes the host runner's provider, which holds resources.
func (f faultProvider) Close() error {
	if c, ok := f.Provider.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

type faultRes struct{ kit.Resources }

// Exec runs the real exec, puts its output into the Buffer a provider's
// Exec collects into, and finishes it as a provider finishes an exec whose
// status it could not read: no item, the error, no exit.
func (r faultRes) Exec(ctx context.Context, req kit.ExecRequest) (sandbox.ExecResult, error) {
	res, err := r.Resources.Exec(ctx, req)
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	b := &execout.Buffer{Limit: 1 << 20}
	b.Write(0, []byte(res.Stdout))
	b.Write(1, []byte(res.Stderr))
	b.Finish(nil, errStatus, nil)
	return b.Result()
}

// ExecStart relays the real exec's stream into the Stream a provider's
// handle reads from, and finishes it with errFailed and the real exit, as a
// provider does on a failure of the exec itself.
func (r faultRes) ExecStart(ctx context.Context, req kit.ExecRequest) (sandbox.ExecHandle, error) {
	h, err := r.Resources.ExecStart(ctx, req)
	if err != nil {
		return nil, err
	}
	fh := &faultHandle{ExecHandle: h, st: execout.NewStream(1 << 20), pumped: make(chan struct{})}
	go fh.pump()
	return fh, nil
}

type faultHandle struct {
	sandbox.ExecHandle
	st     *execout.Stream
	pumped chan struct{} // closed once the stream's end is decided
}

func (h *faultHandle) pump() {
	defer close(h.pumped)
	for {
		item, err := h.ExecHandle.Next(context.Background())
		if err != nil {
			h.st.Finish(nil, err, nil)
			return
		}
		switch it := item.(type) {
		case *sandbox.StreamChunk:
			i := 0
			if it.Stream == sandbox.Stderr {
				i = 1
			}
			h.st.Write(i, it.Data)
		case *sandbox.StreamExit:
			h.st.Finish(nil, errFailed, it)
			return
		}
	}
}

func (h *faultHandle) Next(ctx context.Context) (sandbox.StreamItem, error) { return h.st.Next(ctx) }

// Kill is a provider's: the real kill, then the stream told that Kill
// returned.
func (h *faultHandle) Kill(ctx context.Context) error {
	if err := h.ExecHandle.Kill(ctx); err != nil {
		return err
	}
	h.st.NoTimeout()
	return nil
}

func newFaultSandbox(t *testing.T) *kit.Sandbox {
	t.Helper()
	p, err := host.NewProvider(host.Options{ProviderOptions: kit.ProviderOptions{StateDir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := kit.New(faultProvider{p}, kit.Options{
		Policy:       sandbox.Policy{Egress: sandbox.NetworkEgress, Isolation: sandbox.IsolationNone, Durable: true},
		ReapInterval: time.Hour,
	})
	if err != nil {
		p.(io.Closer).Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close(context.Background()) })
	return sb
}

func TestKitNeverInventsExitStatus(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	sb := newFaultSandbox(t)
	sess, err := sb.CreateSession(ctx, sandbox.SessionSpec{Image: "host", Durability: sandbox.Ephemeral, Network: sandbox.NetworkEgress, TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}

	res, err := sess.Exec(ctx, []string{"true"}, sandbox.ExecOptions{Timeout: 10 * time.Second})
	if !errors.Is(err, errStatus) || res != (sandbox.ExecResult{}) {
		t.Errorf("Exec whose status the provider could not read = %+v, %v; want no result and the provider's %q: an exit status is never invented", res, err, errStatus)
	}

	h, err := sess.ExecStart(ctx, []string{"sh", "-c", "printf out; exit 3"}, sandbox.StartOptions{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Kill(context.Background()) }()
	// The failure is decided, unread, when Kill is called.
	<-h.(*faultHandle).pumped
	if err := h.Kill(ctx); err != nil {
		t.Errorf("Kill after the exec ended: %v; once the exec has exited Kill never fails", err)
	}
	var out []byte
	for {
		item, err := h.Next(ctx)
		if err != nil {
			if !errors.Is(err, errFailed) {
				t.Fatalf("the stream ended with %v; want the %q reported before the kill: the kill never clears it", err, errFailed)
			}
			break
		}
		switch it := item.(type) {
		case *sandbox.StreamChunk:
			out = append(out, it.Data...)
		case *sandbox.StreamExit:
			t.Fatalf("the stream yielded StreamExit %d; want the %q reported before the kill: the kill never clears a failure of the exec", it.ExitCode, errFailed)
		}
	}
	if string(out) != "out" {
		t.Errorf("the stream yielded %q before the failure; want \"out\"", out)
	}
	if item, err := h.Next(ctx); !errors.Is(err, errFailed) {
		t.Errorf("Next after the stream ended = %#v, %v; once the stream has ended with an error, Next returns it again", item, err)
	}
}
