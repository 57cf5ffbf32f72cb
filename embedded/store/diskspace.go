package store

import (
	"io/fs"
	"path/filepath"
	"syscall"

	"github.com/nats-io/nats-server/v2/server"
)

// Disk-space reserve kept free below JetStream's file-store limit when that
// limit is lowered to what the disk can hold: room for what JetStream does
// not count against the limit (index and consumer state files, file-system
// metadata, holdfast's own state file).
const (
	minStoreReserve     = 8 << 20
	storeReservePercent = 2
)

// FileStoreLimit returns the JetStream file-store limit to run with: want
// (jetstream.max_file_store), or less when the disk cannot hold that much,
// so that a full store refuses publishes with an error instead of hitting
// ENOSPC. The server answers no publish once a stream got a write error
// (publishers time out), and that stream stays broken until a restart even
// after space is freed; JetStream's own limit answers every publish with
// "insufficient resources" and lifts as soon as messages are removed.
// lowered reports whether the limit is below want.
func FileStoreLimit(check *DirCheck, want int64) (limit int64, lowered bool) {
	if check == nil || want <= 0 {
		return want, false
	}
	used := DiskUsage(filepath.Join(check.Path, server.JetStreamStoreDir))
	capacity := check.Free + used
	reserve := max(int64(minStoreReserve), capacity*storeReservePercent/100)
	limit = capacity - reserve
	if limit >= want {
		return want, false
	}
	// Never zero or negative: that would mean no file storage at all. A
	// disk this full is refused by CheckDir's write probe anyway.
	return max(limit, 1<<20), true
}

// DiskUsage returns the bytes the files under dir occupy on disk; what it
// cannot read counts as nothing.
func DiskUsage(dir string) int64 {
	var total int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			total += st.Blocks * 512
		} else {
			total += fi.Size()
		}
		return nil
	})
	return total
}
