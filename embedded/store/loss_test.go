package store

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Two losses of the same stream within a second keep both directories.
func TestOrphanNamesNeverCollide(t *testing.T) {
	dir := t.TempDir()
	at := time.Now()
	var moved []string
	for range 3 {
		streamDir := filepath.Join(dir, "jetstream", "$G", "streams", "ORDERS")
		if err := os.MkdirAll(streamDir, 0o750); err != nil {
			t.Fatal(err)
		}
		to, err := MoveOrphan(dir, "ORDERS", at)
		if err != nil {
			t.Fatalf("MoveOrphan: %v", err)
		}
		moved = append(moved, to)
	}
	if moved[0] == moved[1] || moved[1] == moved[2] || moved[0] == moved[2] {
		t.Fatalf("orphan dirs reused a name: %v", moved)
	}
	for _, m := range moved {
		if _, err := os.Stat(m); err != nil {
			t.Error(err)
		}
	}
}

// A vanished stream's name is matched exactly, not as a glob pattern: the
// stream "A?" takes only its own directory, never the healthy "AB"'s, and
// a name that is a bad pattern ("A[") still finds its directory.
func TestOrphanMoveMatchesTheNameExactly(t *testing.T) {
	dir := t.TempDir()
	streams := filepath.Join(dir, "jetstream", "$G", "streams")
	for _, name := range []string{"AB", "A[", "A?"} {
		if err := os.MkdirAll(filepath.Join(streams, name), 0o750); err != nil {
			t.Fatal(err)
		}
	}
	to, err := MoveOrphan(dir, "A?", time.Now())
	if err != nil {
		t.Fatalf("MoveOrphan(A?): %v", err)
	}
	if to == "" || strings.Contains(to, ",") {
		t.Fatalf("MoveOrphan(A?) moved %q, want exactly one directory", to)
	}
	if _, err := os.Stat(filepath.Join(streams, "AB")); err != nil {
		t.Fatalf("the healthy stream AB lost its directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(streams, "A?")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("A?'s directory is still in place: %v", err)
	}
	to, err = MoveOrphan(dir, "A[", time.Now())
	if err != nil || to == "" {
		t.Fatalf("MoveOrphan(A[) = %q, %v: want its directory moved", to, err)
	}
	if _, err := os.Stat(filepath.Join(streams, "A[")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("A['s directory is still in place: %v", err)
	}
	if to, err := MoveOrphan(dir, "NONE", time.Now()); err != nil || to != "" {
		t.Fatalf("MoveOrphan(NONE) = %q, %v: want nothing moved", to, err)
	}
}

// A vanished stream's directory on another file system than the store
// dir (STORE/jetstream a symbolic link to another disk, which the store
// accepts) is moved aside all the same: a rename across file systems
// fails (EXDEV), and start-up was refused for it.
func TestOrphanMovedAcrossFileSystems(t *testing.T) {
	other, err := os.MkdirTemp("/dev/shm", "holdfast-orphan-test-")
	if err != nil {
		t.Skipf("no /dev/shm for a second file system: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(other) })
	dir := t.TempDir()
	if sameDevice(t, dir, other) {
		t.Skip("/dev/shm is on the same file system as the test's temporary directory")
	}
	if err := os.Symlink(other, filepath.Join(dir, "jetstream")); err != nil {
		t.Fatal(err)
	}
	msgs := filepath.Join(other, "$G", "streams", "ORDERS", "msgs")
	if err := os.MkdirAll(msgs, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(msgs, "1.blk"), []byte("messages"), 0o640); err != nil {
		t.Fatal(err)
	}
	to, err := MoveOrphan(dir, "ORDERS", time.Now())
	if err != nil {
		t.Fatalf("MoveOrphan across file systems: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(to, "msgs", "1.blk")); err != nil || string(got) != "messages" {
		t.Fatalf("moved to %s: 1.blk %q, %v", to, got, err)
	}
	if _, err := os.Lstat(filepath.Join(other, "$G", "streams", "ORDERS")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the vanished stream's directory is still in the server's way: %v", err)
	}
}

func sameDevice(t *testing.T, a, b string) bool {
	t.Helper()
	var sa, sb syscall.Stat_t
	if err := syscall.Stat(a, &sa); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(b, &sb); err != nil {
		t.Fatal(err)
	}
	return sa.Dev == sb.Dev
}
