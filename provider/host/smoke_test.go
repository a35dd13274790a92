package host_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/provider/host"
)

func TestSmoke(t *testing.T) {
	ctx := context.Background()
	sb, err := host.New(host.Options{StateDir: t.TempDir(), Policy: sandbox.Policy{Egress: "egress", Isolation: "none", Durable: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close(ctx)
	s, err := sb.CreateSession(ctx, sandbox.SessionSpec{Image: "host", Durability: "ephemeral", Network: "none", TTLSeconds: 60, Env: sandbox.SecretEnv(map[string]string{"A": "1"})})
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Exec(ctx, []string{"sh", "-c", "echo $A; pwd; cat /proc/net/dev; env; echo err >&2; exit 3"}, sandbox.ExecOptions{Timeout: 5 * time.Second})
	fmt.Printf("%+v %v\n", res, err)
	res, err = s.Exec(ctx, []string{"nosuch"}, sandbox.ExecOptions{Timeout: 5 * time.Second})
	fmt.Printf("%+v %v\n", res, err)
	res, err = s.Exec(ctx, []string{"sh", "-c", "printf abc; sleep 10"}, sandbox.ExecOptions{Timeout: 500 * time.Millisecond})
	fmt.Printf("%+v %v\n", res, err)
	start := time.Now()
	res, err = s.Exec(ctx, []string{"sh", "-c", "sleep 30 & echo $!"}, sandbox.ExecOptions{Timeout: 5 * time.Second})
	fmt.Printf("%+v %v %v\n", res, err, time.Since(start))
	h, err := s.ExecStart(ctx, []string{"sh", "-c", "echo ready; cat; echo done >&2"}, sandbox.StartOptions{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	h.WriteStdin(ctx, []byte("hello\n"))
	h.CloseStdin(ctx)
	for {
		it, err := h.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch v := it.(type) {
		case *sandbox.StreamChunk:
			fmt.Printf("%s %q\n", v.Stream, v.Data)
		case *sandbox.StreamExit:
			fmt.Printf("exit %d\n", v.ExitCode)
		}
	}
	fmt.Println(h.WriteStdin(ctx, []byte("x")), h.Kill(ctx), h.Kill(ctx))
	if err := s.PutFile(ctx, "a/b/c.txt", []byte("data")); err != nil {
		t.Fatal(err)
	}
	b, err := s.GetFile(ctx, "a/b/c.txt")
	fmt.Println(string(b), err)
	_, err = s.GetFile(ctx, "a/b")
	fmt.Println(err, errors.Is(err, sandbox.ErrFileNotFound))
	_, err = s.GetFile(ctx, "nope")
	fmt.Println(err, errors.Is(err, sandbox.ErrFileNotFound))
	_, err = s.GetFile(ctx, "../x")
	fmt.Println(err)
	s.Exec(ctx, []string{"ln", "-s", "/etc", "esc"}, sandbox.ExecOptions{Timeout: time.Second})
	_, err = s.GetFile(ctx, "esc/hostname")
	fmt.Println(err)
	s2, err := sb.CreateSession(ctx, sandbox.SessionSpec{Image: "host", Durability: "ephemeral", Network: "egress", TTLSeconds: 60, MemoryMB: 64, CPU: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	res, err = s2.Exec(ctx, []string{"sh", "-c", "cat /proc/self/cgroup | grep -E 'memory|cpu,'; x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo ${#x}"}, sandbox.ExecOptions{Timeout: 20 * time.Second})
	fmt.Printf("%+v %v\n", res, err)
}
