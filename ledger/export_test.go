package ledger

import bolt "go.etcd.io/bbolt"

// Bolt is d's bbolt handle, for tests that check how it was opened.
func Bolt(d *DB) *bolt.DB { return d.db }
