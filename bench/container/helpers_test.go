package container_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tai42/sandbox/provider/container/containertest"
)

func TestMeminfoField(t *testing.T) {
	const s = "Rss:                9876 kB\nPss:                1234 kB\nPss_Anon:            100 kB\n"
	if n, err := meminfoField(s, "Pss"); err != nil || n != 1234<<10 {
		t.Errorf("Pss: %d, %v; want %d", n, err, 1234<<10)
	}
	if _, err := meminfoField(s, "Swap"); err == nil {
		t.Error("a missing key gave no error")
	}
	if _, err := meminfoField("Pss: 12 MB\n", "Pss"); err == nil {
		t.Error("a unit other than kB gave no error")
	}
}

func TestParseStatPpid(t *testing.T) {
	// A command with spaces and parentheses must not shift the fields.
	if p, err := parseStatPpid("4242 (a) b (c)) S 17 4242 4242 0 -1"); err != nil || p != 17 {
		t.Errorf("ppid %d, %v; want 17", p, err)
	}
	if _, err := parseStatPpid("4242 no command"); err == nil {
		t.Error("a line without a command gave no error")
	}
}

func TestParseProcCgroup(t *testing.T) {
	const v1 = "12:pids:/docker/abc\n11:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/docker/abc\n"
	if p, err := parseProcCgroup(v1, false); err != nil || p != "/docker/abc" {
		t.Errorf("v1: %q, %v", p, err)
	}
	if p, err := parseProcCgroup("0::/tai42/s1\n", true); err != nil || p != "/tai42/s1" {
		t.Errorf("v2: %q, %v", p, err)
	}
	if _, err := parseProcCgroup("12:pids:/x\n", false); err == nil {
		t.Error("no memory line gave no error")
	}
}

func TestPercentile(t *testing.T) {
	var l latencies
	for i := 100; i >= 1; i-- {
		l.add(time.Duration(i))
	}
	if p := l.percentile(0.5); p != 51 {
		t.Errorf("p50 of 1..100 = %d; want 51", p)
	}
	if p := l.percentile(0.99); p != 100 {
		t.Errorf("p99 of 1..100 = %d; want 100", p)
	}
	if p := (latencies{}).percentile(0.5); p != 0 {
		t.Errorf("p50 of none = %d", p)
	}
}

// TestMeasurements runs each measurement of the benchmarks once and checks
// that it reads what it should and leaves nothing behind: a session's
// create, exec, memory and destroy; a bare runc run, exec and delete.
func TestMeasurements(t *testing.T) {
	containertest.Require(t)
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	ctx := context.Background()

	t.Run("ours", func(t *testing.T) {
		opts := containertest.Options(t, "runc", policy)
		opts.ReapInterval = -1
		sb := containertest.New(t, opts)
		s, err := sb.CreateSession(ctx, sessionSpec(containertest.Busybox))
		if err != nil {
			t.Fatal(err)
		}
		if err := execTrue(ctx, s); err != nil {
			t.Fatal(err)
		}
		m, err := oursIdleMemory(s.ID())
		if err != nil {
			t.Fatal(err)
		}
		// An agent is a Go program: it holds at least a few hundred KiB.
		if m.cgroup <= 0 || m.pss < 100<<10 {
			t.Errorf("idle memory %+v: want a cgroup charge and an agent PSS of at least 100 KiB", m)
		}
		if err := sb.DestroySession(ctx, s.ID()); err != nil {
			t.Fatal(err)
		}
		if _, err := oursIdleMemory(s.ID()); err == nil {
			t.Error("the destroyed session's cgroup can still be read")
		}
		// Once the provider is closed: until then its pool's disks, made
		// ahead for no session, are mounted under the state directory.
		if err := sb.Close(ctx); err != nil {
			t.Fatal(err)
		}
		d, c, mnt := leftovers(filepath.Join(opts.StateDir, "container", "sessions"), opts.StateDir, []string{s.ID()}, nil)
		if len(d)+len(c)+len(mnt) > 0 {
			t.Errorf("left: %v %v %v", d, c, mnt)
		}
	})

	for _, rt := range []string{"runc", "crun"} {
		t.Run("live-bundle-"+rt, func(t *testing.T) {
			sb, opts := newProvider(t, rt)
			lb := newLiveBundle(t, sb, opts, rt, nil)
			tm, undo, err := lb.start(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range runSteps {
				if tm.durs[s] <= 0 {
					t.Errorf("step %s was not timed: %v", s, tm.durs)
				}
			}
			if len(tm.durs) != len(runSteps) {
				t.Errorf("timed %v; want the steps %v", tm.durs, runSteps)
			}
			ids := lb.rt.list()
			if len(ids) != 1 {
				t.Fatalf("%s lists %v; want the one container started from the bundle", rt, ids)
			}
			if err := undo(); err != nil {
				t.Fatal(err)
			}
			if left := lb.rt.list(); len(left) > 0 {
				t.Errorf("%s left containers %v", rt, left)
			}
			if _, c, _ := leftovers(lb.base, lb.base, ids, nil); len(c) > 0 {
				t.Errorf("the container left cgroups %v", c)
			}
			if entries, _ := os.ReadDir(lb.base); len(entries) > 0 {
				t.Errorf("the container left %d entries in its directory", len(entries))
			}
		})
		t.Run("bare-"+rt, func(t *testing.T) {
			rootfs := busyboxRootfs(t)
			r := newBareRuntime(t, rt)
			if err := r.run(ctx, r.bundle(t, rootfs, trueArgv...)); err != nil {
				t.Fatal(err)
			}
			if err := r.run(ctx, r.bundle(t, rootfs, "/bin/false")); err == nil {
				t.Error("a run of /bin/false gave no error")
			}
			log, err := os.Create(filepath.Join(t.TempDir(), "log"))
			if err != nil {
				t.Fatal(err)
			}
			defer log.Close()
			id, err := r.runDetached(ctx, r.bundle(t, rootfs, idleArgv...), log)
			if err != nil {
				t.Fatal(err)
			}
			if err := r.exec(ctx, id, trueArgv...); err != nil {
				t.Error(err)
			}
			if err := r.exec(ctx, id, "/bin/false"); err == nil {
				t.Error("an exec of /bin/false gave no error")
			}
			if err := r.delete(ctx, id); err != nil {
				t.Fatal(err)
			}
			if left := r.list(); len(left) > 0 {
				t.Errorf("%s left containers %v", rt, left)
			}
		})
	}
}
