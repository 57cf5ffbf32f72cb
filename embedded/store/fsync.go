package store

import (
	"fmt"
	"os"
)

// SyncDir fsyncs the directory dir, so that the entries created, renamed
// or removed in it survive a power cut.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("cannot sync directory %s: %w", dir, err)
	}
	return nil
}
