package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Accounts lists the account directories of the JetStream store at
// jsDir (jetstream/<account>), neither the cluster's _js_ nor hidden ones;
// none when jsDir does not exist.
func Accounts(jsDir string) ([]string, error) {
	entries, err := os.ReadDir(jsDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cannot list %s: %w", jsDir, err)
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") && e.Name() != "_js_" {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// AccountStreams lists the names of the stream directories of an account
// directory (<account>/streams/<stream>), hidden ones left out; none when
// it has no streams directory.
func AccountStreams(accountDir string) ([]string, error) {
	sdir := filepath.Join(accountDir, "streams")
	entries, err := os.ReadDir(sdir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cannot list %s: %w", sdir, err)
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
	}
	return out, nil
}
