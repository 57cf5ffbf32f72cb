package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Syncer makes durable what the server wrote to the streams of a store
// when the server does not flush each write itself (jetstream.commit_window:
// the server writes each message to its block file before it answers, and
// holdfast flushes). Each Sync flushes every message block and every stream
// and consumer definition that changed since the round before, and the
// directories whose entries changed; calls that arrive while a round runs
// share the next one, and rounds begin at most once per window.
//
// A consumer's state file (o.dat, rewritten about ten times a second while
// messages are acknowledged) is left to the kernel's writeback: after a
// power cut a consumer may deliver again what it had acknowledged in the
// last seconds, never lose a message.
//
// The server also replaces files without flushing them, by a new file
// renamed over the old one: it compacts a message block once over half of
// it was deleted out of order (`nats stream rmm`, a subject purge, a
// rollup, a work queue's acks), and rewrites a stream's or consumer's
// definition when a client edits it (`nats stream edit`). Until the next
// round flushed the new file, a power cut could leave it empty: the
// block's messages, flushed and acknowledged long before, were gone, and a
// stream with an empty meta.inf is dropped by the server with all its
// messages. So each round keeps, in SyncGuardDirName, a hard link to every
// file it flushes as it flushed it; a file replaced since is the old one
// there, and RestoreSyncGuard puts it back at the next start (messages
// deleted since may come back, an edit since may be undone: never a
// message lost). So too for a block the server removed, all it held
// deleted (a stream at its limits drops its oldest messages for new
// ones): the removal is on disk at once, the new messages only at the
// next round. A round forgets the links of the files removed before it,
// and flushes that.
type Syncer struct {
	jsDir    string
	guardDir string
	window   time.Duration

	mu        sync.Mutex
	cond      *sync.Cond
	running   bool
	started   uint64 // rounds that began scanning
	completed uint64 // rounds done
	err       error  // of the last round
	// Owned by the round running.
	lastStart time.Time
	marks     map[string]fileMark
	dirs      map[string][]string
}

// fileMark is a file as its last flush left it.
type fileMark struct {
	size  int64
	mtime int64
	ino   uint64 // a new inode: the file was replaced (renamed over)
}

// NewSyncer returns a Syncer of the store at storeDir whose rounds begin
// at most once per window.
func NewSyncer(storeDir string, window time.Duration) *Syncer {
	s := &Syncer{jsDir: filepath.Join(storeDir, server.JetStreamStoreDir), guardDir: filepath.Join(storeDir, SyncGuardDirName), window: window,
		marks: map[string]fileMark{}, dirs: map[string][]string{}}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// Sync returns once everything the server wrote before the call is on
// disk, or the error of the round that should have put it there.
func (s *Syncer) Sync() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	// A round that begins scanning after this call covers it.
	ticket := s.started + 1
	for s.completed < ticket {
		if s.running {
			s.cond.Wait()
			continue
		}
		s.running = true
		s.mu.Unlock()
		if wait := time.Until(s.lastStart.Add(s.window)); wait > 0 {
			time.Sleep(wait)
		}
		s.mu.Lock()
		s.started++
		round := s.started
		s.mu.Unlock()
		s.lastStart = time.Now()
		err := s.round()
		s.mu.Lock()
		s.running, s.completed, s.err = false, round, err
		s.cond.Broadcast()
	}
	return s.err
}

// round flushes what changed since the last round.
func (s *Syncer) round() error {
	dirty, relink, seen, errs := s.flushFiles()
	errs = append(errs, s.flushDirs(dirty)...)
	// Only now, with the new blocks and their directory entries on disk,
	// may the guard links point to them.
	errs = append(errs, s.relinkAll(relink)...)
	// Files gone since (compacted, removed with their stream) are
	// forgotten, and so are their guard links.
	// Their removal is flushed too: a link left behind would put back
	// at the next start a block the server removed long before.
	var unlinked []string
	for path := range s.marks {
		if !seen[path] {
			delete(s.marks, path)
			unlinked = append(unlinked, s.unlink(path))
		}
	}
	errs = append(errs, flushGuardDirs(unlinked)...)
	return errors.Join(errs...)
}

// flushFiles walks the store and flushes each file a round flushes that
// changed since the last round. It returns the directories whose entries
// changed, the files whose guard link is to be made again (new or
// replaced: another inode), the files it saw, and what failed.
func (s *Syncer) flushFiles() (dirty, relink []string, seen map[string]bool, errs []error) {
	seen = map[string]bool{}
	// The store accepts symbolic links to directories (STORE/jetstream, a
	// stream's directory on another disk): the server follows them, and
	// so must the round, or it flushes nothing of what they hold.
	err := walkFollow(s.jsDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed while walking: its parent's listing changed
			}
			return err
		}
		if d.IsDir() {
			return s.noteDir(path, &dirty)
		}
		if !syncedFile(d.Name()) {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		seen[path] = true
		mark := markOf(info)
		old, ok := s.marks[path]
		if ok && old == mark {
			return nil
		}
		if err := flushFile(path); err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
			return nil
		}
		s.marks[path] = mark
		if !strings.HasSuffix(path, ".blk") {
			// A definition is replaced by a rename: its directory entry too.
			dirty = append(dirty, filepath.Dir(path))
		}
		if !ok || old.ino != mark.ino {
			// A new file, or one the server replaced: its guard link
			// follows once it and its directory entry are flushed.
			dirty = append(dirty, filepath.Dir(path))
			relink = append(relink, path)
		}
		return nil
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("cannot walk %s: %w", s.jsDir, err))
	}
	return dirty, relink, seen, errs
}

// noteDir adds the directory at path to dirty when its entries changed
// since the last round (the atomic batches' staging is left out).
func (s *Syncer) noteDir(path string, dirty *[]string) error {
	if batchStaging(path) {
		return fs.SkipDir
	}
	names, err := dirNames(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fs.SkipDir
		}
		return err
	}
	if old, seen := s.dirs[path]; !seen || !slices.Equal(old, names) {
		*dirty = append(*dirty, path)
		s.dirs[path] = names
	}
	return nil
}

// flushDirs flushes the directories of dirty, deepest first: a new
// directory's entry in its parent is flushed after what it holds. A
// directory named twice is flushed once.
func (s *Syncer) flushDirs(dirty []string) []error {
	var errs []error
	slices.SortFunc(dirty, func(a, b string) int {
		if d := strings.Count(b, string(os.PathSeparator)) - strings.Count(a, string(os.PathSeparator)); d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	for _, dir := range slices.Compact(dirty) {
		if err := SyncDir(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			delete(s.dirs, dir) // flushed again next round
		}
	}
	return errs
}

// relinkAll makes the guard links of the files of relink, flushed, and
// flushes the guard directories that changed.
func (s *Syncer) relinkAll(relink []string) []error {
	var errs []error
	var guardDirs []string
	for _, path := range relink {
		dir, err := s.link(path, s.marks[path].ino)
		// Replaced again since its flush (a second compaction): what the
		// flushed file held is now only in the new one, so the new one is
		// flushed and linked before this round answers anybody.
		for try := 0; errors.Is(err, errReplaced) && try < 3; try++ {
			if err = s.reflush(path); err == nil {
				dir, err = s.link(path, s.marks[path].ino)
			}
		}
		switch {
		case errors.Is(err, syscall.EXDEV):
			// On another file system than the store dir (a linked
			// stream or jetstream directory): no hard link can guard
			// it there, it is flushed as before.
		case errors.Is(err, fs.ErrNotExist):
			// Removed by the server meanwhile.
		case err != nil:
			errs = append(errs, err)
			delete(s.marks, path) // flushed and linked again next round
		default:
			guardDirs = append(guardDirs, dir)
		}
	}
	return append(errs, flushGuardDirs(guardDirs)...)
}

// flushGuardDirs flushes each directory of dirs once ("" for none).
func flushGuardDirs(dirs []string) []error {
	var errs []error
	slices.Sort(dirs)
	for _, dir := range slices.Compact(dirs) {
		if dir == "" {
			continue
		}
		if err := SyncDir(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errs
}

// guardPath is where the guard link of the file at path is.
func (s *Syncer) guardPath(path string) (string, error) {
	rel, err := filepath.Rel(s.jsDir, path)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(os.PathSeparator)) {
		return "", fmt.Errorf("%s is not in %s", path, s.jsDir)
	}
	return filepath.Join(s.guardDir, rel), nil
}

// errReplaced is link's error for a file replaced since it was flushed.
var errReplaced = errors.New("replaced since its flush")

// reflush flushes the file now at path, and its directory entry, and
// marks it.
func (s *Syncer) reflush(path string) error {
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	mark := markOf(info)
	if err := flushFile(path); err != nil {
		return err
	}
	if err := SyncDir(filepath.Dir(path)); err != nil {
		return err
	}
	s.marks[path] = mark
	return nil
}

// link makes the guard link of the file at path point to it, when it is
// still the file ino that was flushed, and returns the directory to flush
// for it; errReplaced when the server replaced the file again meanwhile,
// an error matching fs.ErrNotExist when it removed it.
func (s *Syncer) link(path string, ino uint64) (string, error) {
	guard, err := s.guardPath(path)
	if err != nil {
		return "", err
	}
	dir := filepath.Dir(guard)
	if inode(guard) == ino {
		return dir, nil
	}
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return "", fmt.Errorf("cannot keep a link to %s: %w", path, err)
		}
		// The new directories' entries are flushed now, up to the store
		// directory's entry of the guard directory.
		for d := dir; strings.HasPrefix(d, s.guardDir); d = filepath.Dir(d) {
			if err := SyncDir(filepath.Dir(d)); err != nil {
				return "", err
			}
		}
	}
	tmp := guard + ".tmp"
	_ = os.Remove(tmp)
	if err := os.Link(path, tmp); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", err // removed meanwhile
		}
		if errors.Is(err, syscall.EXDEV) {
			_ = os.Remove(dir) // made for it, if empty
			return "", err
		}
		return "", fmt.Errorf("cannot keep a link to %s: %w", path, err)
	}
	if inode(tmp) != ino {
		_ = os.Remove(tmp) // not the file flushed
		return "", errReplaced
	}
	if err := os.Rename(tmp, guard); err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("cannot keep a link to %s: %w", path, err)
	}
	return dir, nil
}

// unlink removes the guard link of the file at path, which the server
// removed, and the guard directories it leaves empty; it returns the
// directory whose entries changed, "" for none.
func (s *Syncer) unlink(path string) string {
	guard, err := s.guardPath(path)
	if err != nil || os.Remove(guard) != nil {
		return "" // never linked (a file on another file system)
	}
	d := filepath.Dir(guard)
	for ; d != s.guardDir && strings.HasPrefix(d, s.guardDir); d = filepath.Dir(d) {
		if os.Remove(d) != nil {
			break // not empty
		}
	}
	return d
}

// markOf is the mark of a file as info describes it.
func markOf(info fs.FileInfo) fileMark {
	return fileMark{size: info.Size(), mtime: info.ModTime().UnixNano(), ino: inodeOf(info)}
}

// inode is path's inode number, or 0.
func inode(path string) uint64 {
	fi, err := os.Lstat(path)
	if err != nil {
		return 0
	}
	return inodeOf(fi)
}

// inodeOf is the inode number info describes, or 0.
func inodeOf(info fs.FileInfo) uint64 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}

// walkFollow is filepath.WalkDir that follows symbolic links (the root
// one too): a link to a directory is walked as a directory under the
// link's path, a link to a file is visited with its target's DirEntry.
// A directory reached twice (a link loop) is walked once; a dangling link
// is left out.
func walkFollow(root string, fn fs.WalkDirFunc) error {
	info, err := os.Stat(root)
	if err != nil {
		return fn(root, nil, err)
	}
	visited := map[[2]uint64]bool{}
	err = walkFollowDir(root, fs.FileInfoToDirEntry(info), info, visited, fn)
	if errors.Is(err, fs.SkipDir) || errors.Is(err, fs.SkipAll) {
		return nil
	}
	return err
}

func walkFollowDir(path string, d fs.DirEntry, info fs.FileInfo, visited map[[2]uint64]bool, fn fs.WalkDirFunc) error {
	if !d.IsDir() {
		return fn(path, d, nil)
	}
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		key := [2]uint64{uint64(st.Dev), st.Ino}
		if visited[key] {
			return nil
		}
		visited[key] = true
	}
	if err := fn(path, d, nil); err != nil {
		if errors.Is(err, fs.SkipDir) {
			return nil
		}
		return err
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		if err := fn(path, d, err); err != nil && !errors.Is(err, fs.SkipDir) {
			return err
		}
		return nil
	}
	for _, e := range entries {
		p := filepath.Join(path, e.Name())
		var ei fs.FileInfo
		if e.Type()&fs.ModeSymlink != 0 {
			if ei, err = os.Stat(p); err != nil {
				continue // dangling: the server cannot use it either
			}
			e = fs.FileInfoToDirEntry(ei)
		} else if e.IsDir() {
			if ei, err = e.Info(); err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					continue
				}
				return err
			}
		}
		if err := walkFollowDir(p, e, ei, visited, fn); err != nil {
			return err
		}
	}
	return nil
}

// RestoreSyncGuard puts back, before the server opens the store, each
// message block and definition that the server replaced after holdfast's
// last flush of it (see Syncer): the new file may have been lost in part
// or whole at a power cut, the linked one was flushed. It puts back too
// a message block the server removed since (its messages all deleted: a
// stream at its limits drops its oldest messages for new ones, which a
// power cut may then have taken), when its stream still exists, and has
// the server rebuild the index of each stream with a block put back:
// messages deleted since come back where the deletes were lost, and the
// server removes the block again where they were not. Then it removes
// the guard directory: the Syncer of this start links every file again
// at its first round (a start may convert or restore streams, which
// leaves the links stale). It returns the files put back, relative to the
// JetStream directory.
func RestoreSyncGuard(storeDir string) ([]string, error) {
	guardDir := filepath.Join(storeDir, SyncGuardDirName)
	jsDir := filepath.Join(storeDir, server.JetStreamStoreDir)
	if _, err := os.Lstat(guardDir); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	var restored []string
	dirs := map[string]bool{}
	err := filepath.WalkDir(guardDir, func(guard string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(guardDir, guard)
		if err != nil {
			return err
		}
		if !syncedFile(filepath.Base(rel)) {
			return os.Remove(guard) // a link not finished
		}
		path := filepath.Join(jsDir, rel)
		switch bi, gi := inode(path), inode(guard); {
		case bi == gi:
			return nil
		case bi == 0 && !(messageData(rel) && streamExists(path)):
			// A definition removed with its stream or consumer, or a
			// stream deleted or moved aside.
			return os.Remove(guard)
		}
		if err := os.Rename(guard, path); err != nil {
			return fmt.Errorf("cannot put back %s as last flushed: %w", rel, err)
		}
		dirs[filepath.Dir(path)] = true
		restored = append(restored, rel)
		return nil
	})
	if err != nil {
		return restored, err
	}
	for dir := range dirs {
		// The stream's index may describe its blocks as they were
		// after the block put back was replaced or removed: without
		// it the server reads the stream from its blocks.
		if filepath.Base(dir) == "msgs" {
			if err := os.Remove(filepath.Join(dir, streamIndexName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return restored, fmt.Errorf("cannot remove the index of %s: %w", dir, err)
			}
		}
		if err := SyncDir(dir); err != nil {
			return restored, err
		}
	}
	if err := os.RemoveAll(guardDir); err != nil {
		return restored, fmt.Errorf("cannot remove %s: %w", guardDir, err)
	}
	return restored, SyncDir(storeDir)
}

// streamIndexName is the file in a stream's msgs directory where the
// server keeps the state of its blocks, which it rebuilds from the blocks
// when the file is missing or disagrees with them.
const streamIndexName = "index.db"

// messageData reports whether rel, a path in the JetStream directory, is
// a message block or its key file.
func messageData(rel string) bool {
	return filepath.Base(filepath.Dir(rel)) == "msgs" && (strings.HasSuffix(rel, ".blk") || strings.HasSuffix(rel, ".key"))
}

// streamExists reports whether the stream of the message block at path
// still has its definition.
func streamExists(path string) bool {
	_, err := os.Lstat(filepath.Join(filepath.Dir(filepath.Dir(path)), "meta.inf"))
	return err == nil
}

// syncedFile reports whether a file of the server's store is flushed by a
// round: the message blocks, the definitions with their checksums, and in
// an encrypted store the key files (meta.key of a stream or consumer, and
// N.key beside each message block N.blk, without which the block cannot
// be read). The stream's index (index.db, rebuilt from the blocks when it
// is behind) and the consumers' state (o.dat) are not.
func syncedFile(name string) bool {
	return strings.HasSuffix(name, ".blk") || strings.HasSuffix(name, ".key") || name == "meta.inf" || name == "meta.sum"
}

// dirNames returns the sorted names in dir, leaving out the consumers'
// state file (renamed into place at each write) and temporary files.
func dirNames(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		if n := e.Name(); (syncedFile(n) || e.IsDir() || e.Type()&fs.ModeSymlink != 0) && !batchStaging(filepath.Join(dir, n)) {
			names = append(names, n)
		}
	}
	return names, nil
}

// batchStaging reports whether path is a stream's batches directory,
// where nats-server stages each atomic batch (group commit's) in a store
// of its own until it commits it into the stream's blocks, then removes
// it: nothing there is acknowledged, a batch not committed at a power cut
// is abandoned. Flushing and guarding it cost fsyncs for every batch.
func batchStaging(path string) bool {
	return filepath.Base(path) == "batches" && filepath.Base(filepath.Dir(filepath.Dir(path))) == "streams"
}

// flushFile flushes path's data (and its size) to disk.
func flushFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := syscall.Fdatasync(int(f.Fd())); err != nil {
		return fmt.Errorf("cannot flush %s to disk: %w", path, err)
	}
	return nil
}
