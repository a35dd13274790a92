// Package ledger is the durable session ledger: a [kit.Ledger] kept in one
// bbolt file in the daemon's state directory, so that a daemon killed at
// any moment (SIGKILL, a power cut) restarts knowing every session it had
// reported created and not yet reported destroyed.
//
// Every change is one bbolt transaction, written and fsynced before the
// call returns. The file holds the sessions' env values (a recovered
// session's execs need them): it is made with mode 0600, and the daemon's
// state directory is 0700. The file is locked (flock) while open, so a
// second process opening it is refused at once with [ErrInUse] rather
// than waiting.
package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
	"golang.org/x/sys/unix"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
)

// FileName is the ledger's file name in a state directory.
const FileName = "ledger.db"

// formatVersion is the version of the records' encoding; a file of another
// version is refused rather than misread.
const formatVersion = 1

var (
	bucketSessions = []byte("sessions")
	bucketMeta     = []byte("meta")
	keyVersion     = []byte("format")
)

// ErrInUse is returned by [Open] when another process holds the file.
var ErrInUse = errors.New("ledger: the file is in use by another process")

// DB is a durable [kit.Ledger]. Its methods are safe for concurrent use;
// writes are serialised by bbolt (one writer at a time).
type DB struct {
	db   *bolt.DB
	path string
}

var _ kit.Ledger = (*DB)(nil)

// Open opens (creating when missing) the ledger at path. It fails with an
// error matching [ErrInUse] when another process has it open, and when the
// file is not a ledger of this version, saying so.
func Open(path string) (*DB, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout:      50 * time.Millisecond,
		FreelistType: bolt.FreelistMapType,
		// The freelist is rebuilt at open (a scan of a small file)
		// rather than written at every commit: one page less to write.
		NoFreelistSync: true,
	})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, fmt.Errorf("%w: %s (another tai42 daemon on the same state directory?)", ErrInUse, path)
		}
		return nil, fmt.Errorf("ledger: opening %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		if v := meta.Get(keyVersion); v != nil {
			var got int
			if err := json.Unmarshal(v, &got); err != nil || got != formatVersion {
				return fmt.Errorf("ledger: %s has format %q; this tai42 reads format %d", path, v, formatVersion)
			}
		} else if err := meta.Put(keyVersion, []byte(fmt.Sprint(formatVersion))); err != nil {
			return err
		}
		_, err = tx.CreateBucketIfNotExists(bucketSessions)
		return err
	})
	if err == nil {
		err = preallocate(path, PreallocateBytes)
	}
	if err != nil {
		db.Close()
		return nil, err
	}
	return &DB{db: db, path: path}, nil
}

// PreallocateBytes is the size the ledger's file is given at its first
// open, in blocks written with zeros: a ledger write then never needs a
// new block of the filesystem, so one that sessions (or anything else)
// filled up still takes every write. bbolt uses no page past its
// high-water mark, grows the file only when that passes the file's size,
// and never shrinks it. 8 MiB holds tens of thousands of sessions.
const PreallocateBytes = 8 << 20

// preallocate gives the file at path real blocks up to size bytes: it
// writes zeros into its holes (bbolt grows the file with truncate, which
// leaves holes where it has written no page yet) and past its end, then
// flushes it. It runs before any transaction of this process, so a hole
// is a place where bbolt has nothing.
func preallocate(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("ledger: preallocating %s: %w", path, err)
	}
	defer f.Close()
	fail := func(err error) error {
		return fmt.Errorf("ledger: preallocating %s (%d bytes of real blocks, so that no write of the ledger needs new disk space): %w", path, size, err)
	}
	fi, err := f.Stat()
	if err != nil {
		return fail(err)
	}
	end := fi.Size()
	fd := int(f.Fd())
	zeros := make([]byte, 1<<20)
	fill := func(from, to int64) error {
		for off := from; off < to; {
			n := min(int64(len(zeros)), to-off)
			if _, err := f.WriteAt(zeros[:n], off); err != nil {
				return err
			}
			off += n
		}
		return nil
	}
	wrote := false
	for off := int64(0); off < min(end, size); {
		hole, err := unix.Seek(fd, off, unix.SEEK_HOLE)
		if err != nil || hole >= end {
			break
		}
		data, err := unix.Seek(fd, hole, unix.SEEK_DATA)
		if err != nil { // ENXIO: no data past the hole
			data = end
		}
		if err := fill(hole, min(data, size)); err != nil {
			return fail(err)
		}
		wrote, off = true, data
	}
	if end < size {
		if err := fill(end, size); err != nil {
			return fail(err)
		}
		wrote = true
	}
	if !wrote {
		return nil
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	return nil
}

// Path is the ledger's file.
func (d *DB) Path() string { return d.path }

// record is a kit.Record as stored: the spec with env values in clear.
type record struct {
	ID            string          `json:"id"`
	Provider      string          `json:"provider"`
	State         kit.State       `json:"state"`
	Spec          storedSpec      `json:"spec"`
	WorkspacePath string          `json:"workspace_path"`
	CreatedAt     time.Time       `json:"created_at"`
	ExpiresAt     time.Time       `json:"expires_at"`
	Handle        json.RawMessage `json:"handle,omitempty"`
}

// storedSpec is sandbox.SessionSpec with its env values revealed (the
// spec's own JSON masks them).
type storedSpec struct {
	sandbox.SessionSpec
	Env map[string]string `json:"env"`
}

func encode(r kit.Record) ([]byte, error) {
	s := storedSpec{SessionSpec: r.Spec}
	s.SessionSpec.Env = nil
	if len(r.Spec.Env) > 0 {
		s.Env = make(map[string]string, len(r.Spec.Env))
		for k, v := range r.Spec.Env {
			s.Env[k] = v.Reveal()
		}
	}
	return json.Marshal(record{
		ID: r.ID, Provider: r.Provider, State: r.State, Spec: s,
		WorkspacePath: r.WorkspacePath, CreatedAt: r.CreatedAt, ExpiresAt: r.ExpiresAt,
		Handle: r.Handle,
	})
}

func decode(b []byte) (kit.Record, error) {
	var rec record
	if err := json.Unmarshal(b, &rec); err != nil {
		return kit.Record{}, err
	}
	spec := rec.Spec.SessionSpec
	spec.Env = sandbox.SecretEnv(rec.Spec.Env)
	if spec.Labels != nil {
		spec.Labels = maps.Clone(spec.Labels)
	}
	return kit.Record{
		ID: rec.ID, Provider: rec.Provider, State: rec.State, Spec: spec,
		WorkspacePath: rec.WorkspacePath, CreatedAt: rec.CreatedAt, ExpiresAt: rec.ExpiresAt,
		Handle: rec.Handle,
	}, nil
}

// Load implements [kit.Ledger]. A record that cannot be decoded is an
// error naming it: the ledger is not silently shortened.
func (d *DB) Load(context.Context) ([]kit.Record, error) {
	var out []kit.Record
	err := d.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSessions).ForEach(func(k, v []byte) error {
			r, err := decode(v)
			if err != nil {
				return fmt.Errorf("ledger: the record of session %q is unreadable: %w", k, err)
			}
			out = append(out, r)
			return nil
		})
	})
	return out, err
}

// Put implements [kit.Ledger]: the record is on disk when it returns.
func (d *DB) Put(_ context.Context, r kit.Record) error {
	if r.ID == "" {
		return errors.New("ledger: a record needs an id")
	}
	b, err := encode(r)
	if err != nil {
		return fmt.Errorf("ledger: encoding session %s: %w", r.ID, err)
	}
	if err := d.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSessions).Put([]byte(r.ID), b)
	}); err != nil {
		return fmt.Errorf("ledger: recording session %s: %w", r.ID, err)
	}
	return nil
}

// Delete implements [kit.Ledger].
func (d *DB) Delete(_ context.Context, id string) error {
	if err := d.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSessions).Delete([]byte(id))
	}); err != nil {
		return fmt.Errorf("ledger: removing session %s: %w", id, err)
	}
	return nil
}

// Close implements [kit.Ledger]; it releases the file's lock.
func (d *DB) Close() error { return d.db.Close() }
