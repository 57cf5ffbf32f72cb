package store

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// TestCopiesRemovedWhole: the copies of converted streams are removed
// under another name, so that a start killed while it removed them
// leaves no completion mark beside a half removed copy. The next start
// removes what is left and puts nothing back in the place of the
// converted stream. Before, the copies were removed in place: a kill
// could leave the mark and part of a copy, which replaced the stream.
func TestCopiesRemovedWhole(t *testing.T) {
	storeDir := t.TempDir()
	stream := filepath.Join(storeDir, "jetstream", "$G", "streams", "S")
	if err := os.MkdirAll(filepath.Join(stream, "msgs"), 0o750); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{"meta.inf": "meta", "msgs/1.blk": "block"} {
		if err := os.WriteFile(filepath.Join(stream, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := CopyClearStreams(storeDir, []string{stream}, nil, 1<<40); err != nil {
		t.Fatal(err)
	}
	// The server converts the stream; holdfast starts removing the copies
	// and is killed after the first file (what os.RemoveAll removes first
	// is up to the directory's order).
	if err := os.WriteFile(filepath.Join(stream, "msgs", "1.blk"), []byte("converted"), 0o600); err != nil {
		t.Fatal(err)
	}
	trash := filepath.Join(storeDir, EncryptingDirName+".done")
	if err := os.Rename(filepath.Join(storeDir, EncryptingDirName), trash); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(trash, "$G", "S", "meta.inf")); err != nil {
		t.Fatal(err)
	}

	restored, err := RestoreClearCopies(storeDir)
	if err != nil || len(restored) != 0 {
		t.Fatalf("RestoreClearCopies after a kill while removing the copies: %v, %v; want nothing put back", restored, err)
	}
	if b, err := os.ReadFile(filepath.Join(stream, "msgs", "1.blk")); err != nil || string(b) != "converted" {
		t.Errorf("the converted stream: %q, %v", b, err)
	}
	if _, err := os.Stat(trash); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s is left: %v", trash, err)
	}

	// And the whole removal.
	if err := CopyClearStreams(storeDir, []string{stream}, nil, 1<<40); err != nil {
		t.Fatal(err)
	}
	if err := RemoveCopies(storeDir); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{EncryptingDirName, EncryptingDirName + ".done"} {
		if _, err := os.Stat(filepath.Join(storeDir, d)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s is left: %v", d, err)
		}
	}
}
