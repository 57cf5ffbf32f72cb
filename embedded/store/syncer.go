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
type Syncer struct {
	jsDir  string
	window time.Duration

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
}

// NewSyncer returns a Syncer of the store at storeDir whose rounds begin
// at most once per window.
func NewSyncer(storeDir string, window time.Duration) *Syncer {
	s := &Syncer{jsDir: filepath.Join(storeDir, server.JetStreamStoreDir), window: window,
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
	var errs []error
	var dirty []string // directories whose entries changed
	seen := map[string]bool{}
	err := filepath.WalkDir(s.jsDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed while walking: its parent's listing changed
			}
			return err
		}
		if d.IsDir() {
			names, err := dirNames(path)
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return fs.SkipDir
				}
				return err
			}
			if old, seen := s.dirs[path]; !seen || !slices.Equal(old, names) {
				dirty = append(dirty, path)
				s.dirs[path] = names
			}
			return nil
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
		mark := fileMark{size: info.Size(), mtime: info.ModTime().UnixNano()}
		if old, ok := s.marks[path]; ok && old == mark {
			return nil
		}
		if err := flushFile(path); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			errs = append(errs, err)
			return nil
		}
		s.marks[path] = mark
		if !strings.HasSuffix(path, ".blk") {
			// A definition is replaced by a rename: its directory entry too.
			dirty = append(dirty, filepath.Dir(path))
		}
		return nil
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("cannot walk %s: %w", s.jsDir, err))
	}
	// Deepest first: a new directory's entry in its parent is flushed after
	// what it holds. A directory named twice is flushed once.
	slices.SortFunc(dirty, func(a, b string) int {
		if d := strings.Count(b, string(os.PathSeparator)) - strings.Count(a, string(os.PathSeparator)); d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	dirty = slices.Compact(dirty)
	for _, dir := range dirty {
		if err := SyncDir(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			delete(s.dirs, dir) // flushed again next round
		}
	}
	// Files gone since (compacted, removed with their stream) are
	// forgotten.
	for path := range s.marks {
		if !seen[path] {
			delete(s.marks, path)
		}
	}
	return errors.Join(errs...)
}

// syncedFile reports whether a file of the server's store is flushed by a
// round: the message blocks and the definitions with their checksums. The
// stream's index (index.db, rebuilt from the blocks when it is behind) and
// the consumers' state (o.dat) are not.
func syncedFile(name string) bool {
	return strings.HasSuffix(name, ".blk") || name == "meta.inf" || name == "meta.sum" || name == "meta.key"
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
		if n := e.Name(); syncedFile(n) || e.IsDir() {
			names = append(names, n)
		}
	}
	return names, nil
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
