package store

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
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
