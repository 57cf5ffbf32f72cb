package store

import (
	"os"
	"path/filepath"
	"testing"
)

func TestFileStoreLimit(t *testing.T) {
	dir := t.TempDir()
	js := filepath.Join(dir, "jetstream")
	if err := os.MkdirAll(js, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(js, "1.blk"), make([]byte, 4<<20), 0o640); err != nil {
		t.Fatal(err)
	}
	used := DiskUsage(js)
	if used < 4<<20 {
		t.Fatalf("DiskUsage = %d, want at least 4 MiB", used)
	}
	for _, tc := range []struct {
		name        string
		free, want  int64
		wantLowered bool
		wantLimit   int64
	}{
		{"room for the limit", 100 << 30, 1 << 30, false, 1 << 30},
		// 1 GiB of disk (free + what the store holds): 2% kept free.
		{"small disk", 1<<30 - used, 10 << 30, true, 1<<30 - (1<<30)*2/100},
		// The reserve is at least 8 MiB.
		{"tiny disk", 32<<20 - used, 10 << 30, true, 32<<20 - minStoreReserve},
		// A full disk: never zero (no file storage at all).
		{"full disk", 0, 10 << 30, true, 1 << 20},
		{"no limit asked", 0, 0, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			limit, lowered := FileStoreLimit(&DirCheck{Path: dir, Free: tc.free}, tc.want)
			if lowered != tc.wantLowered || limit != tc.wantLimit {
				t.Fatalf("FileStoreLimit(free %d, want %d) = %d, %v; want %d, %v", tc.free, tc.want, limit, lowered, tc.wantLimit, tc.wantLowered)
			}
		})
	}
}
