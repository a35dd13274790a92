package container_test

import (
	"context"
	"debug/elf"
	"os"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/provider/container"
	"github.com/tai42/sandbox/provider/container/containertest"
	"github.com/tai42/sandbox/sandboxtest"
)

// TestDynamicAgent runs sessions whose agent is tai42 built with cgo (as
// `go build` builds it where a C compiler is installed: dynamically
// linked), on each runtime, in each user namespace mode, in the host image
// and in the busybox image, which has no libc: the agent runs through its
// own loader and libraries, the commands it starts see no LD_* variable
// and load the image's libraries, files go in and out, and the destroy
// leaves nothing.
func TestDynamicAgent(t *testing.T) {
	agent := containertest.DynamicAgent(t)
	forEachRuntime(t, func(t *testing.T, rt string) {
		for _, mode := range userNSModes {
			t.Run("userns-"+string(mode), func(t *testing.T) {
				p := newProviderMode(t, rt, mode, func(o *container.Options) { o.AgentBinary = agent })
				for _, image := range images {
					t.Run(imageName(image), func(t *testing.T) { checkDynamicSession(t, p, agent, image) })
				}
			})
		}
	})
}

func checkDynamicSession(t *testing.T, p *testProvider, agent, image string) {
	sess, err := p.sb.CreateSession(ctxFor(t), spec(image, sandbox.NetworkNone))
	if err != nil {
		t.Fatalf("CreateSession: %v", err)
	}
	id := sess.ID()
	destroyed := false
	t.Cleanup(func() {
		if !destroyed {
			_ = sess.Destroy(context.Background())
		}
	})
	checkAgentLibs(t, p, id, agent)

	cmdline := strings.ReplaceAll(mustSh(t, sess, `cat /proc/1/cmdline`), "\x00", " ")
	if !strings.HasPrefix(cmdline, "/.tai42/lib/ld-") || !strings.HasSuffix(cmdline, " --library-path /.tai42/lib /.tai42/agent agent --listen-fd 3 ") {
		t.Errorf("PID 1's command line %q: want the agent's own loader running /.tai42/agent", cmdline)
	}
	out := mustSh(t, sess, `echo ok; env`)
	first, env, _ := strings.Cut(out, "\n")
	if first != "ok" {
		t.Errorf("echo ok printed %q", first)
	}
	for kv := range strings.SplitSeq(env, "\n") {
		if strings.HasPrefix(kv, "LD_") {
			t.Errorf("the command's environment holds %q", kv)
		}
	}
	// A command links against the image's libraries, never the agent's.
	maps := mustSh(t, sess, `cat /proc/self/maps`)
	if strings.Contains(maps, "/.tai42") {
		t.Errorf("a command mapped the agent's libraries:\n%s", maps)
	}
	if image == sandbox.HostImage && !strings.Contains(maps, "libc.so.6") {
		t.Errorf("cat in the host image did not map the image's libc:\n%s", maps)
	}

	data := []byte("through the dynamic agent\n")
	if err := sess.PutFile(ctxFor(t), "dir/f", data); err != nil {
		t.Fatalf("PutFile: %v", err)
	}
	if got := mustSh(t, sess, `cat /workspace/dir/f`); got != string(data) {
		t.Errorf("the put file reads %q in the session", got)
	}
	got, err := sess.GetFile(ctxFor(t), "dir/f")
	if err != nil || string(got) != string(data) {
		t.Errorf("GetFile: %q, %v", got, err)
	}

	pids := sessionPIDs(t, id)
	if len(pids) == 0 {
		t.Error("no process in the session's cgroup")
	}
	if err := sess.Destroy(ctxFor(t)); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	destroyed = true
	if _, err := os.Stat(p.bundle(id)); !os.IsNotExist(err) {
		t.Errorf("the session's bundle after the destroy: %v", err)
	}
	if m := hostMountsNaming(t, []string{id}); len(m) > 0 {
		t.Errorf("mounts left naming the session: %v", m)
	}
	if d := cgroupDirs(id); len(d) > 0 {
		t.Errorf("cgroups left: %v", d)
		removeCgroups(t, id)
	}
	// Exited, a process may wait a moment for its parent to reap it.
	agentStat, err := os.Stat(agent)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		left := leftProcesses(t, agentStat, []string{id})
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("processes of the session %v run on after the destroy: %v", pids, left)
			break
		}
	}
}

// checkAgentLibs checks the binds of session id's config under
// /.tai42/lib: the agent's loader and every library it needs, recursively
// (each bound file's own needs included), and nothing else: every bound
// file is the loader or reached from the agent by DT_NEEDED.
func checkAgentLibs(t *testing.T, p *testProvider, id, agent string) {
	t.Helper()
	s := p.config(t, id)
	bound := map[string]string{} // name in /.tai42/lib -> the host file
	for _, m := range s.Mounts {
		if dir, name := path.Split(m.Destination); dir == "/.tai42/lib/" {
			bound[name] = m.Source
			if !slices.Contains(m.Options, "ro") {
				t.Errorf("%s is bound writable: %v", m.Destination, m.Options)
			}
		}
	}
	interp, needed := elfDeps(t, agent)
	if interp == "" {
		t.Fatalf("%s has no PT_INTERP", agent)
	}
	if _, ok := bound[path.Base(interp)]; !ok {
		t.Errorf("the loader %s is not bound (bound: %v)", interp, bound)
	}
	reached := map[string]bool{path.Base(interp): true}
	queue := needed
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		if reached[name] {
			continue
		}
		reached[name] = true
		src, ok := bound[name]
		if !ok {
			t.Errorf("%s is needed but not bound (bound: %v)", name, bound)
			continue
		}
		_, more := elfDeps(t, src)
		queue = append(queue, more...)
	}
	for name := range bound {
		if !reached[name] {
			t.Errorf("%s (%s) is bound, but the agent does not need it", name, bound[name])
		}
	}
}

// elfDeps is the PT_INTERP and DT_NEEDED of the ELF file at name.
func elfDeps(t *testing.T, name string) (string, []string) {
	t.Helper()
	f, err := elf.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var interp string
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				t.Fatal(err)
			}
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	needed, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	return interp, needed
}

// TestDynamicAgentRecover: a session whose agent is dynamically linked
// comes back after its provider's process died (a durable ledger, the
// provider abandoned as SIGKILL leaves it): same session, its process left
// running still there, and new execs run through the same agent.
func TestDynamicAgentRecover(t *testing.T) {
	agent := containertest.DynamicAgent(t)
	forEachRuntime(t, func(t *testing.T, rt string) {
		sb, restart := containertest.RestartableAgent(rt, agent)(t, sandboxtest.Config{Policy: permissive, ReapInterval: time.Hour})
		sess, err := sb.CreateSession(ctxFor(t), spec(containertest.Busybox, sandbox.NetworkNone))
		if err != nil {
			t.Fatalf("CreateSession: %v", err)
		}
		mustSh(t, sess, `setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $! > /workspace/pid`)
		sb = restart(true)
		back, err := sb.GetSession(ctxFor(t), sess.ID())
		if err != nil {
			t.Fatalf("the session after the restart: %v", err)
		}
		out := mustSh(t, back, `kill -0 "$(cat /workspace/pid)" && tr '\0' ' ' </proc/1/cmdline; echo; echo ok; env`)
		cmdline, rest, _ := strings.Cut(out, "\n")
		if !strings.HasPrefix(cmdline, "/.tai42/lib/ld-") {
			t.Errorf("PID 1 after the restart: %q", cmdline)
		}
		if !strings.HasPrefix(rest, "ok\n") || strings.Contains(rest, "\nLD_") {
			t.Errorf("an exec after the restart printed %q", rest)
		}
		if err := back.Destroy(ctxFor(t)); err != nil {
			t.Errorf("Destroy after the restart: %v", err)
		}
	})
}
