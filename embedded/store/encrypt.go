package store

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
)

// The server encrypts a stream kept in clear text in place, at the first
// start with a key: it writes the stream's key file, then its metadata and
// checksum, and for each message block a key file and then the block
// again, each step on its own. A start killed between two steps leaves a
// stream it cannot load with any key or without one ("checksums do not
// match", "unable to recover keys", "corrupt state file"): the stream is
// skipped and its messages lost. holdfast therefore copies every
// clear-text stream aside before such a start, puts the copies back if
// the start did not finish, and removes them once the server has
// encrypted every one.

// EncryptingComplete marks a finished copy: without it the copy is
// incomplete, and the server never started on the streams it copied.
const EncryptingComplete = "COPY-COMPLETE"

// ClearStreams lists the stream directories (jetstream/<account>/streams/
// <name>) that hold a stream in clear text: metadata and no key file.
func ClearStreams(jsDir string) ([]string, error) {
	var out []string
	accounts, err := Accounts(jsDir)
	if err != nil {
		return nil, err
	}
	for _, a := range accounts {
		streams, err := AccountStreams(filepath.Join(jsDir, a))
		if err != nil {
			return nil, err
		}
		for _, st := range streams {
			dir := filepath.Join(jsDir, a, "streams", st)
			if _, err := os.Stat(filepath.Join(dir, server.JetStreamMetaFile)); err != nil {
				continue
			}
			if _, err := os.Stat(filepath.Join(dir, keyFileName)); err == nil {
				continue
			}
			out = append(out, dir)
		}
	}
	sort.Strings(out)
	return out, nil
}

// Cipher is the cipher jetstream.encryption_cipher names.
func Cipher(name string) server.StoreCipher {
	if name == "aes" {
		return server.AES
	}
	return server.ChaCha
}

// otherCipherStreams lists the stream directories whose key file opens
// with key only under the other cipher than sc: the server converts them
// at its start, the same way as it encrypts a clear-text stream (it
// removes the key file first, and writes the new one at the end).
func otherCipherStreams(jsDir, key string, sc server.StoreCipher) ([]string, error) {
	files, err := ListKeyFiles(jsDir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, kf := range files {
		if !strings.HasPrefix(kf.What, "stream ") {
			continue
		}
		sealed, err := os.ReadFile(kf.Path)
		if err != nil {
			return nil, err
		}
		if _, got, ok := openKeyFile(key, kf, sealed); ok && got != sc {
			out = append(out, filepath.Dir(kf.Path))
		}
	}
	return out, nil
}

// ConvertingStreams lists the streams the server is to convert at its
// start with key and cipher sc: those in clear text and those under the
// other cipher.
func ConvertingStreams(jsDir, key string, sc server.StoreCipher) (clear, other []string, err error) {
	if clear, err = ClearStreams(jsDir); err != nil {
		return nil, nil, err
	}
	other, err = otherCipherStreams(jsDir, key, sc)
	return clear, other, err
}

// RestoreClearCopies puts back the clear-text copies of an encrypting
// start that did not finish, and removes the directory. It returns the
// streams put back.
func RestoreClearCopies(storeDir string) ([]string, error) {
	if err := os.RemoveAll(copiesTrash(storeDir)); err != nil {
		return nil, fmt.Errorf("cannot remove %s: %w", copiesTrash(storeDir), err)
	}
	dir := filepath.Join(storeDir, EncryptingDirName)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	var restored []string
	if _, err := os.Stat(filepath.Join(dir, EncryptingComplete)); err == nil {
		accounts, err := os.ReadDir(dir)
		if err != nil {
			return nil, fmt.Errorf("cannot list %s: %w", dir, err)
		}
		for _, a := range accounts {
			if !a.IsDir() {
				continue
			}
			streams, err := os.ReadDir(filepath.Join(dir, a.Name()))
			if err != nil {
				return nil, fmt.Errorf("cannot list %s: %w", filepath.Join(dir, a.Name()), err)
			}
			for _, st := range streams {
				src := filepath.Join(dir, a.Name(), st.Name())
				dest := filepath.Join(storeDir, server.JetStreamStoreDir, a.Name(), "streams", st.Name())
				if err := replaceStreamDir(src, dest, "cannot remove the half-encrypted stream "+dest, "cannot put the clear-text copy "+src+" back"); err != nil {
					return nil, err
				}
				restored = append(restored, st.Name())
			}
		}
	}
	// Without the mark the copy was cut short before the server started:
	// the streams themselves were never touched.
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("cannot remove %s: %w", dir, err)
	}
	return restored, SyncDir(storeDir)
}

// RemoveCopies removes the copies once the server converted every stream.
// The directory is renamed first: removed in place, a kill could leave
// the completion mark beside a copy already half removed, which the next
// start would put in the place of the converted stream.
func RemoveCopies(storeDir string) error {
	dir, trash := filepath.Join(storeDir, EncryptingDirName), copiesTrash(storeDir)
	if err := os.Rename(dir, trash); err != nil {
		return fmt.Errorf("cannot remove the copies: %w", err)
	}
	if err := SyncDir(storeDir); err != nil {
		return err
	}
	if err := os.RemoveAll(trash); err != nil {
		return fmt.Errorf("cannot remove the copies: %w", err)
	}
	return SyncDir(storeDir)
}

// copiesTrash is where the copies go to be removed.
func copiesTrash(storeDir string) string {
	return filepath.Join(storeDir, EncryptingDirName+".done")
}

// CopyClearStreams copies each clear-text stream directory into the
// encrypting directory (files fsynced), then marks the copy complete. It
// refuses when the disk cannot hold the copies.
func CopyClearStreams(storeDir string, clear, other []string, free int64) error {
	dirs := append(append([]string{}, clear...), other...)
	var need int64
	for _, d := range dirs {
		n, err := treeSize(d)
		if err != nil {
			return err
		}
		need += n
	}
	if need+need/10 > free {
		return fmt.Errorf("cannot convert the store's %d stream(s) to encrypted or to the configured cipher safely: the copy kept while the server converts them needs %s and %s is free in %s; "+
			"free space, or back up (holdfast backup), start an empty store with the key and restore the backup into it",
			len(dirs), HumanBytes(need), HumanBytes(free), storeDir)
	}
	dir := filepath.Join(storeDir, EncryptingDirName)
	for _, d := range dirs {
		account := filepath.Base(filepath.Dir(filepath.Dir(d)))
		if err := copyTree(d, filepath.Join(dir, account, filepath.Base(d))); err != nil {
			os.RemoveAll(dir) // incomplete: the streams were not touched
			return fmt.Errorf("cannot copy the stream %s before the server converts it (nothing was changed): %w", d, err)
		}
	}
	if err := replaceFile(filepath.Join(dir, EncryptingComplete), []byte("clear-text copies of the streams being encrypted; holdfast removes them\n")); err != nil {
		return err
	}
	if err := SyncDir(storeDir); err != nil {
		return err
	}
	for _, d := range clear {
		if err := dropClearState(d); err != nil {
			return err
		}
	}
	for _, d := range other {
		if err := dropEmptyBlocks(d, true); err != nil {
			return err
		}
	}
	return nil
}

// dropClearState removes, from a clear-text stream about to be encrypted,
// what the server would not encrypt and could then not read: its state
// file (msgs/index.db, which it reads in clear at the encrypting start and
// keeps as it is, then fails to decrypt at every later start) and its
// empty message blocks (a stream never written to has one: the server
// fails to encrypt it with "corrupt state file" and drops the stream).
// The server rebuilds the state from
// the blocks and writes it encrypted. Called once the copy is complete, so
// a crash puts the stream back as it was.
func dropClearState(streamDir string) error {
	if err := os.Remove(filepath.Join(streamDir, "msgs", "index.db")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("cannot remove the clear-text state of %s: %w", streamDir, err)
	}
	return dropEmptyBlocks(streamDir, false)
}

// dropEmptyBlocks removes the zero-length message blocks of a stream the
// server is about to convert, with their key files when withKeys (else a
// block with a key file is kept): converting an empty block fails
// ("corrupt state file"), and the server then drops the whole stream
// (a stream never written to has one).
func dropEmptyBlocks(streamDir string, withKeys bool) error {
	mdir := filepath.Join(streamDir, "msgs")
	files, err := os.ReadDir(mdir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, f := range files {
		idx, ok := strings.CutSuffix(f.Name(), blockSuffix)
		if !ok || f.IsDir() {
			continue
		}
		if fi, err := f.Info(); err != nil || fi.Size() != 0 {
			continue
		}
		key := filepath.Join(mdir, idx+blockKeySuffix)
		if _, err := os.Stat(key); err == nil {
			if !withKeys {
				continue
			}
			if err := os.Remove(key); err != nil {
				return fmt.Errorf("cannot remove the key of the empty message block %s: %w", key, err)
			}
		}
		if err := os.Remove(filepath.Join(mdir, f.Name())); err != nil {
			return fmt.Errorf("cannot remove the empty message block %s: %w", filepath.Join(mdir, f.Name()), err)
		}
	}
	return SyncDir(mdir)
}

func treeSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			n += fi.Size()
		}
		return nil
	})
	return n, err
}

// copyTree copies the directories and regular files under src to dest,
// each file fsynced, each directory fsynced once filled.
func copyTree(src, dest string) error {
	var dirs []string
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dest, rel)
		switch {
		case d.IsDir():
			dirs = append(dirs, to)
			return os.MkdirAll(to, 0o750)
		case d.Type().IsRegular():
			return copyFileSynced(p, to)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := SyncDir(dirs[i]); err != nil {
			return err
		}
	}
	return SyncDir(filepath.Dir(dest))
}

func copyFileSynced(src, dest string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	// The server's own mode (0600): a copy of a clear-text stream is no
	// more readable than the stream.
	out, err := os.OpenFile(dest, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// PutBackUnconverted runs once the server that was to convert the copied
// streams is ready (it recovers, and so converts, every stream before it
// listens). A stream whose key file does not open with key under sc was
// not converted: the server could not load it (its warnings say why) and
// it may be half converted, or removed by the server. Its copy is put
// back, so that it is as it was before this start. It returns the streams
// put back; the other copies stay in the encrypting directory.
func PutBackUnconverted(storeDir, key string, sc server.StoreCipher) ([]string, error) {
	dir := filepath.Join(storeDir, EncryptingDirName)
	accounts, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("cannot list %s: %w", dir, err)
	}
	var putBack []string
	for _, a := range accounts {
		if !a.IsDir() {
			continue
		}
		streams, err := os.ReadDir(filepath.Join(dir, a.Name()))
		if err != nil {
			return nil, err
		}
		for _, st := range streams {
			live := filepath.Join(storeDir, server.JetStreamStoreDir, a.Name(), "streams", st.Name())
			kf := KeyFile{Account: a.Name(), Context: st.Name()}
			if sealed, err := os.ReadFile(filepath.Join(live, keyFileName)); err == nil {
				if _, got, ok := openKeyFile(key, kf, sealed); ok && got == sc {
					continue // converted
				}
			}
			// Not loaded, and maybe half converted or removed by the
			// server: put back as it was.
			cp := filepath.Join(dir, a.Name(), st.Name())
			if err := replaceStreamDir(cp, live, "cannot remove the stream "+live+" the server did not convert", "cannot put the copy "+cp+" back"); err != nil {
				return nil, err
			}
			putBack = append(putBack, st.Name())
		}
	}
	return putBack, nil
}

// replaceStreamDir puts the stream directory copy src in the place of dest: dest
// removed, src renamed to it, and the rename synced. removing and putting
// say, in an error, which step failed.
func replaceStreamDir(src, dest, removing, putting string) error {
	if err := os.RemoveAll(dest); err != nil {
		return fmt.Errorf("%s: %w", removing, err)
	}
	if err := os.MkdirAll(filepath.Dir(dest), 0o750); err != nil {
		return err
	}
	if err := os.Rename(src, dest); err != nil {
		return fmt.Errorf("%s: %w", putting, err)
	}
	return SyncDir(filepath.Dir(dest))
}
