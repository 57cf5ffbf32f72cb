package store

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"golang.org/x/crypto/chacha20poly1305"
)

// ErrEncryptionKey is returned by the server's Open (embedded) and by
// Rekey when the store holds streams that the configured key (or the lack
// of one) cannot open.
var ErrEncryptionKey = errors.New("encryption key does not open the store")

// The server keeps, for every stream, message block and consumer of an
// encrypted store, a key file: a random seed sealed with a key-encryption
// key derived from the configured key (HMAC-SHA256 over the account and a
// context naming the asset), preceded by the nonce it was sealed with. The
// data files are encrypted with keys derived from the seed, so a key file
// re-sealed under another key leaves them readable. These are the
// server's file names and contexts.
const (
	keyFileName      = "meta.key" // of a stream (context: its name) and of a consumer ("stream.consumer")
	blockKeySuffix   = ".key"     // msgs/N.key, of message block N ("stream:N")
	blockSuffix      = ".blk"
	MinKeyFileLength = 64
	rekeyTempSuffix  = ".holdfast-rekey"
)

// KeyFile is one key file of the store.
type KeyFile struct {
	Path string
	// Account goes into the key derivation with Context: the account's
	// name for its streams, the group's name for a cluster log.
	Account string
	Context string
	Stream  string
	What    string // for messages: "stream ORDERS", "consumer ORDERS > WORKER1", "message block 3 of stream ORDERS"
}

// ListKeyFiles returns the key files of every stream, message block
// and consumer under the JetStream directory jsDir, sorted by path.
// Directories being deleted (a leading dot) and the cluster's own
// directory are left out; so is the key of a block whose data file is
// gone.
func ListKeyFiles(jsDir string) ([]KeyFile, error) {
	accounts, err := Accounts(jsDir)
	if err != nil {
		return nil, err
	}
	var out []KeyFile
	for _, account := range accounts {
		logs, err := clusterLogKeyFiles(filepath.Join(jsDir, account, "_js_"))
		if err != nil {
			return nil, err
		}
		out = append(out, logs...)
		streams, err := AccountStreams(filepath.Join(jsDir, account))
		if err != nil {
			return nil, err
		}
		for _, name := range streams {
			dir := filepath.Join(jsDir, account, "streams", name)
			if p := filepath.Join(dir, keyFileName); fileExists(p) {
				out = append(out, KeyFile{Path: p, Account: account, Context: name, Stream: name, What: "stream " + name})
			}
			mdir := filepath.Join(dir, "msgs")
			blocks, err := blockKeys(mdir)
			if err != nil {
				return nil, err
			}
			for _, idx := range blocks {
				out = append(out, KeyFile{Path: filepath.Join(mdir, idx+blockKeySuffix), Account: account,
					Context: name + ":" + idx, Stream: name, What: "message block " + idx + " of stream " + name})
			}
			odir := filepath.Join(dir, "obs")
			if cons, err := os.ReadDir(odir); err == nil {
				for _, c := range cons {
					p := filepath.Join(odir, c.Name(), keyFileName)
					if !c.IsDir() || strings.HasPrefix(c.Name(), ".") || !fileExists(p) {
						continue
					}
					out = append(out, KeyFile{Path: p, Account: account, Context: name + "." + c.Name(), Stream: name,
						What: "consumer " + name + " > " + c.Name()})
				}
			} else if !errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("cannot list %s: %w", odir, err)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// clusterLogKeyFiles returns the key files of the cluster's logs (the
// meta group's and each stream's and consumer's raft log, in the system
// account's _js_ directory): a file store each, named for its group, whose
// key the server derives with the group's name where a stream's has the
// account's. The server opens them with the configured key only: one
// left under the old key after a rotation stops JetStream from starting
// ("chacha20poly1305: message authentication failed").
func clusterLogKeyFiles(dir string) ([]KeyFile, error) {
	groups, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cannot list %s: %w", dir, err)
	}
	var out []KeyFile
	for _, g := range groups {
		name := g.Name()
		if !g.IsDir() || strings.HasPrefix(name, ".") {
			continue
		}
		gdir := filepath.Join(dir, name)
		if p := filepath.Join(gdir, keyFileName); fileExists(p) {
			out = append(out, KeyFile{Path: p, Account: name, Context: name, Stream: "cluster log " + name, What: "cluster log " + name})
		}
		mdir := filepath.Join(gdir, "msgs")
		blocks, err := blockKeys(mdir)
		if err != nil {
			return nil, err
		}
		for _, idx := range blocks {
			out = append(out, KeyFile{Path: filepath.Join(mdir, idx+blockKeySuffix), Account: name, Context: name + ":" + idx,
				Stream: "cluster log " + name, What: "block " + idx + " of cluster log " + name})
		}
	}
	return out, nil
}

// blockKeys returns the indexes of the message blocks in the file store's
// msgs directory mdir that have a key file, in directory order; a key
// whose block is gone is left out, and so is a missing directory.
func blockKeys(mdir string) ([]string, error) {
	files, err := os.ReadDir(mdir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cannot list %s: %w", mdir, err)
	}
	var out []string
	for _, f := range files {
		idx, ok := strings.CutSuffix(f.Name(), blockKeySuffix)
		if !ok || f.IsDir() {
			continue
		}
		if _, err := strconv.ParseUint(idx, 10, 32); err != nil || !fileExists(filepath.Join(mdir, idx+blockSuffix)) {
			continue
		}
		out = append(out, idx)
	}
	return out, nil
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// keyEncryptionKey derives the key a key file is sealed with, as the
// server does (jsKeyGen, genEncryptionKey).
func keyEncryptionKey(key string, sc server.StoreCipher, account, context string) (cipher.AEAD, error) {
	h := hmac.New(sha256.New, []byte(key))
	h.Write([]byte(account))
	h.Write([]byte(context))
	rb := h.Sum(nil)
	switch sc {
	case server.ChaCha:
		return chacha20poly1305.NewX(rb)
	case server.AES:
		block, err := aes.NewCipher(rb)
		if err != nil {
			return nil, err
		}
		return cipher.NewGCMWithNonceSize(block, block.BlockSize())
	}
	return nil, fmt.Errorf("unknown cipher %v", sc)
}

// openKeyFile returns the seed sealed in a key file's content and the
// cipher it opened with, trying both ciphers; ok is false when key does
// not open it.
func openKeyFile(key string, kf KeyFile, sealed []byte) (seed []byte, sc server.StoreCipher, ok bool) {
	for _, sc := range []server.StoreCipher{server.ChaCha, server.AES} {
		kek, err := keyEncryptionKey(key, sc, kf.Account, kf.Context)
		if err != nil {
			continue
		}
		ns := kek.NonceSize()
		if len(sealed) <= ns {
			continue
		}
		if seed, err := kek.Open(nil, sealed[:ns], sealed[ns:], nil); err == nil {
			return seed, sc, true
		}
	}
	return nil, 0, false
}

// RekeyResult is what a pass over the store's key files found and did.
type RekeyResult struct {
	Total     int
	Rewrapped int
	Damaged   []string        // key files too short to hold a key
	Streams   map[string]bool // streams with at least one file re-sealed
}

// Rekey makes every key file in the store open with newKey: a file
// that opens only with oldKey (when set) has its seed re-sealed under
// newKey, with the same cipher and nonce (the nonce of a block's key file
// is also its data's), and replaced atomically (temporary file, fsync,
// rename, fsync of the directory). The data files are not touched, so a
// crash at any moment leaves every key file opening with one of the two
// keys, and the next start with both finishes the rotation.
//
// Before anything is written, every key file is opened: if one opens with
// neither key, nothing is changed and the error (ErrEncryptionKey) lists
// what the key does not open. Without this the server would load a
// stream whose consumers it cannot decrypt (it converts consumers only
// between ciphers, never between keys) and skip those consumers with a
// warning, and holdfast would create them anew and deliver the stream
// again from the start; and it would delete a message block whose key
// file it cannot open, before any check of holdfast's.
func Rekey(jsDir, newKey, oldKey, keyFile, oldKeyFile string) (RekeyResult, error) {
	return rekey(jsDir, newKey, oldKey, keyFile, oldKeyFile, true)
}

// CheckKeys tells, without writing anything, whether a start with newKey
// (and oldKey) would be refused for the store's key files
// (ErrEncryptionKey): one that opens with neither key, or any when
// newKey is "" (the store is encrypted, and no key is set).
func CheckKeys(jsDir, newKey, oldKey, keyFile, oldKeyFile string) error {
	if newKey != "" {
		_, err := rekey(jsDir, newKey, oldKey, keyFile, oldKeyFile, false)
		return err
	}
	files, err := ListKeyFiles(jsDir)
	if err != nil || len(files) == 0 {
		return err
	}
	return fmt.Errorf("%w: %d of the store's files are encrypted (%s, ...), but jetstream.encryption_key_file is not set: "+
		"set it to the file holding the key the store was written with", ErrEncryptionKey, len(files), files[0].What)
}

// rekey is Rekey; it writes nothing unless write.
func rekey(jsDir, newKey, oldKey, keyFile, oldKeyFile string, write bool) (RekeyResult, error) {
	res := RekeyResult{Streams: map[string]bool{}}
	files, err := ListKeyFiles(jsDir)
	if err != nil {
		return res, err
	}
	res.Total = len(files)
	type rewrap struct {
		kf     KeyFile
		sealed []byte
		seed   []byte
		sc     server.StoreCipher
	}
	var todo []rewrap
	var refused []string
	for _, kf := range files {
		sealed, err := os.ReadFile(kf.Path)
		if err != nil {
			return res, fmt.Errorf("cannot read the key file of %s: %w", kf.What, err)
		}
		if len(sealed) < MinKeyFileLength {
			// No key opens a damaged file: what it protects is lost
			// whatever the key. Left to the server (it drops that
			// block or consumer, or skips that stream) and to the
			// data-loss check, under jetstream.on_data_loss.
			res.Damaged = append(res.Damaged, fmt.Sprintf("%s (%s, %d bytes)", kf.What, kf.Path, len(sealed)))
			continue
		}
		if _, _, ok := openKeyFile(newKey, kf, sealed); ok {
			continue
		}
		if oldKey != "" {
			if seed, sc, ok := openKeyFile(oldKey, kf, sealed); ok {
				todo = append(todo, rewrap{kf, sealed, seed, sc})
				continue
			}
		}
		refused = append(refused, kf.What)
	}
	if len(refused) > 0 {
		list := refused
		if len(list) > 10 {
			list = append(list[:10:10], fmt.Sprintf("and %d more", len(refused)-10))
		}
		if oldKey == "" {
			return res, fmt.Errorf("%w: %d of the store's %d key files do not open with the key in %s (jetstream.encryption_key_file): %s; "+
				"if the store was written with another key, or a rotation to this key did not finish, put that key in "+
				"jetstream.encryption_old_key_file and start again; nothing was changed on disk",
				ErrEncryptionKey, len(refused), len(files), keyFile, strings.Join(list, ", "))
		}
		return res, fmt.Errorf("%w: %d of the store's %d key files open neither with the key in %s (jetstream.encryption_key_file) "+
			"nor with the one in %s (jetstream.encryption_old_key_file): %s; nothing was changed on disk",
			ErrEncryptionKey, len(refused), len(files), keyFile, oldKeyFile, strings.Join(list, ", "))
	}
	if !write {
		return res, nil
	}
	for _, r := range todo {
		kek, err := keyEncryptionKey(newKey, r.sc, r.kf.Account, r.kf.Context)
		if err != nil {
			return res, err
		}
		ns := kek.NonceSize()
		nonce := r.sealed[:ns]
		out := kek.Seal(append([]byte{}, nonce...), nonce, r.seed, nil)
		if err := replaceFile(r.kf.Path, out); err != nil {
			return res, fmt.Errorf("%w: cannot write the key file of %s under the new key: %w (%d of %d key files rewritten; "+
				"start again with both keys to finish)", ErrEncryptionKey, r.kf.What, err, res.Rewrapped, len(todo))
		}
		res.Rewrapped++
		res.Streams[r.kf.Stream] = true
	}
	return res, nil
}

// replaceFile replaces path with data atomically and durably, keeping its
// mode.
func replaceFile(path string, data []byte) error {
	mode := fs.FileMode(0o600)
	if fi, err := os.Stat(path); err == nil {
		mode = fi.Mode().Perm()
	}
	tmp := path + rekeyTempSuffix
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
