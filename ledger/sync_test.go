package ledger_test

import (
	"path/filepath"
	"testing"

	"github.com/tai42/sandbox/ledger"
)

// TestOpenSyncs: the ledger's bbolt is opened syncing every commit (and
// every growth of its file): a session recorded is on the disk before the
// call that made it returns, so a daemon killed (or a host that loses
// power) right after still finds it. No other test would see the lost
// durability: the data reads back the same from the page cache.
func TestOpenSyncs(t *testing.T) {
	db, err := ledger.Open(filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Put(t.Context(), sample("s1")); err != nil {
		t.Fatal(err)
	}
	b := ledger.Bolt(db)
	if b.NoSync || b.NoGrowSync {
		t.Errorf("bbolt opened with NoSync %v, NoGrowSync %v: commits are not fsynced", b.NoSync, b.NoGrowSync)
	}
}
