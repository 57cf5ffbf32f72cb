package store

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestStoreStateFile(t *testing.T) {
	dir := t.TempDir()
	if st, err := ReadStoreState(dir); st != nil || err != nil {
		t.Fatalf("empty dir: %v, %v", st, err)
	}
	want := &StoreState{Version: 1, Streams: map[string]StreamRecord{"A": {LastSeq: 9}}}
	if err := WriteStoreState(dir, want); err != nil {
		t.Fatal(err)
	}
	got, err := ReadStoreState(dir)
	if err != nil || got.Streams["A"].LastSeq != 9 {
		t.Fatalf("read back %+v, %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(dir, StateFileName+".tmp")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temp file left behind")
	}
	if err := os.WriteFile(filepath.Join(dir, StateFileName), []byte("{garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadStoreState(dir); err == nil || !strings.Contains(err.Error(), "remove it") {
		t.Errorf("corrupt state file: %v, want an error saying to remove it", err)
	}
}
