package ledger_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/ledger"
)

func sample(id string) kit.Record {
	return kit.Record{
		ID: id, Provider: "host", State: kit.StateLive,
		Spec: sandbox.SessionSpec{
			Image: "host", WorkspaceKey: "proj", Durability: sandbox.Persistent,
			Env:     sandbox.SecretEnv(map[string]string{"TOKEN": "s3cret", "EMPTY": ""}),
			Network: sandbox.NetworkNone, Isolation: sandbox.IsolationNone,
			CPU: 0.5, MemoryMB: 64, TTLSeconds: 30, Labels: map[string]string{"team": "a"},
		},
		WorkspacePath: "/state/host/workspaces/proj",
		CreatedAt:     time.Date(2026, 11, 30, 12, 0, 0, 123456789, time.UTC),
		ExpiresAt:     time.Date(2026, 11, 30, 12, 0, 30, 123456789, time.UTC),
		Handle:        json.RawMessage(`{"workspace":"/state/host/workspaces/proj"}`),
	}
}

// TestRoundTrip: every field survives a close and a reopen, env values
// included (a recovered session's execs need them).
func TestRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), ledger.FileName)
	db, err := ledger.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	want := sample("sb-1")
	if err := db.Put(ctx, want); err != nil {
		t.Fatal(err)
	}
	other := sample("sb-2")
	other.State = kit.StateCreating
	other.Spec.Env = nil
	other.Handle = nil
	if err := db.Put(ctx, other); err != nil {
		t.Fatal(err)
	}
	if err := db.Delete(ctx, "sb-2"); err != nil {
		t.Fatal(err)
	}
	if err := db.Delete(ctx, "sb-missing"); err != nil {
		t.Fatalf("deleting a missing record: %v", err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("ledger file mode: %v %v; want 0600", fi.Mode(), err)
	}

	db, err = ledger.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	got, err := db.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("loaded %d records; want 1", len(got))
	}
	g := got[0]
	if g.ID != want.ID || g.Provider != want.Provider || g.State != want.State || g.WorkspacePath != want.WorkspacePath ||
		!g.CreatedAt.Equal(want.CreatedAt) || !g.ExpiresAt.Equal(want.ExpiresAt) || string(g.Handle) != string(want.Handle) {
		t.Fatalf("loaded %+v; want %+v", g, want)
	}
	ws, gs := want.Spec, g.Spec
	if gs.Image != ws.Image || gs.WorkspaceKey != ws.WorkspaceKey || gs.Durability != ws.Durability || gs.Network != ws.Network ||
		gs.Isolation != ws.Isolation || gs.CPU != ws.CPU || gs.MemoryMB != ws.MemoryMB || gs.TTLSeconds != ws.TTLSeconds ||
		gs.Labels["team"] != "a" || len(gs.Labels) != 1 {
		t.Fatalf("spec %+v; want %+v", gs, ws)
	}
	if len(gs.Env) != 2 || gs.Env["TOKEN"].Reveal() != "s3cret" || gs.Env["EMPTY"].Reveal() != "" {
		t.Fatalf("env did not survive: %d keys", len(gs.Env))
	}
}

// TestSecondOpenRefused: one process at a time; the second gets ErrInUse
// at once, not a wait.
func TestSecondOpenRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), ledger.FileName)
	db, err := ledger.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = ledger.Open(path)
	if !errors.Is(err, ledger.ErrInUse) {
		t.Fatalf("second open: %v; want ErrInUse", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("second open took %v", d)
	}
	db.Close()
	db, err = ledger.Open(path)
	if err != nil {
		t.Fatalf("open after close: %v", err)
	}
	db.Close()
}

// TestOtherFormatRefused: a file of another format version is refused
// with a message naming both.
func TestOtherFormatRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), ledger.FileName)
	b, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Update(func(tx *bolt.Tx) error {
		m, err := tx.CreateBucket([]byte("meta"))
		if err != nil {
			return err
		}
		return m.Put([]byte("format"), []byte("99"))
	}); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if _, err := ledger.Open(path); err == nil {
		t.Fatal("a ledger of format 99 was opened")
	}
}

// TestNotALedger: garbage is refused, not truncated.
func TestNotALedger(t *testing.T) {
	path := filepath.Join(t.TempDir(), ledger.FileName)
	junk := make([]byte, 8192)
	for i := range junk {
		junk[i] = byte(i * 7)
	}
	if err := os.WriteFile(path, junk, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ledger.Open(path); err == nil {
		t.Fatal("a file of garbage was opened as a ledger")
	}
	if b, _ := os.ReadFile(path); len(b) != len(junk) {
		t.Fatalf("the file was changed: %d bytes", len(b))
	}
}

func BenchmarkPut(b *testing.B) {
	db, err := ledger.Open(filepath.Join(b.TempDir(), ledger.FileName))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	r := sample("sb-1")
	for b.Loop() {
		if err := db.Put(context.Background(), r); err != nil {
			b.Fatal(err)
		}
	}
}
