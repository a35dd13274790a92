package ledger_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/tai42/sandbox/ledger"
)

// TestPreallocated: the ledger's file has PreallocateBytes of real blocks
// after its first open, and keeps them across opens.
func TestPreallocated(t *testing.T) {
	path := filepath.Join(t.TempDir(), ledger.FileName)
	for range 2 {
		db, err := ledger.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Put(context.Background(), sample("sb-1")); err != nil {
			t.Fatal(err)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if blocks := fi.Sys().(*syscall.Stat_t).Blocks * 512; fi.Size() < ledger.PreallocateBytes || blocks < ledger.PreallocateBytes {
			t.Fatalf("the ledger is %d bytes with %d allocated; want %d of both", fi.Size(), blocks, ledger.PreallocateBytes)
		}
	}
}

// TestWritesOnAFullDisk: on a filesystem filled to its last block, the
// ledger still takes thousands of writes (each a bbolt transaction that
// writes and fsyncs pages): they land in its preallocated blocks.
func TestWritesOnAFullDisk(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a small ext4 filesystem needs root")
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("mkfs.ext4 is not installed (apt-get install -y e2fsprogs)")
	}
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "fs.img"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("truncate", "-s", "32M", img).CombinedOutput(); err != nil {
		t.Fatalf("truncate: %v: %s", err, out)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	// mount -o loop attaches an autoclear loop device: the unmount frees it.
	if out, err := exec.Command("mount", "-t", "ext4", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
	})
	path := filepath.Join(mnt, ledger.FileName)
	db, err := ledger.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// Fill the filesystem.
	f, err := os.Create(filepath.Join(mnt, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Write(buf); err != nil {
			if !strings.Contains(err.Error(), "no space left") {
				t.Fatalf("filling the filesystem: %v", err)
			}
			break
		}
	}
	for {
		if _, err := f.Write(buf[:4096]); err != nil {
			break
		}
	}
	f.Close()
	if _, err := os.Create(filepath.Join(mnt, "more")); err == nil {
		if err := os.WriteFile(filepath.Join(mnt, "more"), buf[:4096], 0o600); err == nil {
			t.Fatal("the filesystem is not full: a new 4 KiB file was written")
		}
	}
	ctx := context.Background()
	for i := range 3000 {
		rec := sample(fmt.Sprintf("sb-%d", i))
		if err := db.Put(ctx, rec); err != nil {
			t.Fatalf("write %d to the ledger on a full filesystem: %v", i, err)
		}
		if i%2 == 1 {
			if err := db.Delete(ctx, fmt.Sprintf("sb-%d", i-1)); err != nil {
				t.Fatalf("delete %d from the ledger on a full filesystem: %v", i, err)
			}
		}
	}
	got, err := db.Load(ctx)
	if err != nil || len(got) != 1500 {
		t.Fatalf("loaded %d records (%v); want 1500", len(got), err)
	}
}
