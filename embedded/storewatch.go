package embedded

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"golang.org/x/sys/unix"

	"github.com/holdfast-io/holdfast/embedded/store"
)

// ErrStoreLost means the store directory the server opened is no longer
// the one at its path: deleted, moved away or replaced while running, or
// no longer writable. The server keeps writing into the files it holds
// open, which nothing will ever read again, so nothing more may be
// acknowledged.
var ErrStoreLost = errors.New("store directory lost while running")

// DefaultStoreCheckInterval is how often WatchStore compares the store
// directory with the one the server opened when no event made it do so:
// inotify and the mount table report what happens to the store at once.
// FallbackStoreCheckInterval is the interval where they cannot be
// watched.
const (
	DefaultStoreCheckInterval  = time.Minute
	FallbackStoreCheckInterval = time.Second
)

// storeIdentity is what the store looked like when the server opened it:
// the device and inode of the store directory, of JetStream's directory
// in it and of the lock file holdfast holds.
type storeIdentity struct {
	paths []string
	ids   []fileID

	// The accounts' directories (and their streams directories) appear
	// when the first stream of the account is created: each is recorded
	// when first seen, then compared like the others.
	mu       sync.Mutex
	accounts map[string]fileID
}

type fileID struct{ dev, ino uint64 }

func idOf(fi os.FileInfo) (fileID, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, false
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino}, true
}

// recordStoreIdentity notes the identity of the store once the server
// runs on it. The lock file's identity comes from the descriptor holdfast
// holds, so a lock file replaced before this call is caught as well.
func (s *Server) recordStoreIdentity() error {
	id := &storeIdentity{}
	for _, p := range []string{s.store.Path, filepath.Join(s.store.Path, server.JetStreamStoreDir)} {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("cannot stat %s: %w", p, err)
		}
		fid, ok := idOf(fi)
		if !ok {
			return nil // not a Unix file system: nothing to compare
		}
		id.paths, id.ids = append(id.paths, p), append(id.ids, fid)
	}
	if s.lock != nil {
		fi, err := s.lock.Stat()
		if errors.Is(err, os.ErrClosed) {
			s.identity = id
			return nil
		}
		if err != nil {
			return fmt.Errorf("cannot stat lock file: %w", err)
		}
		if fid, ok := idOf(fi); ok {
			id.paths, id.ids = append(id.paths, filepath.Join(s.store.Path, store.LockFileName)), append(id.ids, fid)
		}
	}
	s.identity = id
	return nil
}

// accountDirs lists the directories of the accounts in JetStream's
// directory, each with its streams directory: swapped while running (a
// copy put back by hand), the server writes on into the files it holds
// open, moved away, and acknowledges what nothing will read again.
func (s *Server) accountDirs() []string {
	js := filepath.Join(s.store.Path, server.JetStreamStoreDir)
	entries, err := os.ReadDir(js)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		out = append(out, filepath.Join(js, e.Name()))
		if fi, err := os.Stat(filepath.Join(js, e.Name(), "streams")); err == nil && fi.IsDir() {
			out = append(out, filepath.Join(js, e.Name(), "streams"))
		}
	}
	return out
}

// accountOfDir names the account of an account's directory
// (jetstream/<account>) or of its streams directory.
func accountOfDir(p string) string {
	if filepath.Base(p) == "streams" {
		p = filepath.Dir(p)
	}
	return filepath.Base(p)
}

// holdsFileStreams reports whether the server holds a stream on file in
// the account (a replica, in a cluster). When it cannot tell, it says yes.
func (s *Server) holdsFileStreams(account string) bool {
	if s.ns == nil {
		return true
	}
	jsz, err := s.ns.Jsz(&server.JSzOptions{Account: account, Streams: true, Config: true})
	if err != nil {
		return true
	}
	for _, a := range jsz.AccountDetails {
		if a.Name != account && a.Id != account {
			continue
		}
		for _, st := range a.Streams {
			if st.Config == nil || st.Config.Storage == server.FileStorage {
				return true
			}
		}
	}
	return false
}

// checkAccountDirs compares the accounts' directories with what was
// recorded, and records those seen for the first time.
func (s *Server) checkAccountDirs(id *storeIdentity) error {
	id.mu.Lock()
	defer id.mu.Unlock()
	if id.accounts == nil {
		id.accounts = map[string]fileID{}
	}
	for p, was := range id.accounts {
		fi, err := os.Stat(p)
		if errors.Is(err, os.ErrNotExist) && !s.holdsFileStreams(accountOfDir(p)) {
			// The server removes an account's directories when its last
			// stream is deleted.
			delete(id.accounts, p)
			continue
		}
		if err != nil {
			return fmt.Errorf("%w: %s is gone (%v)", ErrStoreLost, p, errors.Unwrap(err))
		}
		if now, ok := idOf(fi); ok && now != was {
			return fmt.Errorf("%w: %s was replaced by another directory (device/inode %d/%d, was %d/%d)",
				ErrStoreLost, p, now.dev, now.ino, was.dev, was.ino)
		}
	}
	for _, p := range s.accountDirs() {
		if _, known := id.accounts[p]; known {
			continue
		}
		if fi, err := os.Stat(p); err == nil {
			if fid, ok := idOf(fi); ok {
				id.accounts[p] = fid
			}
		}
	}
	return nil
}

// CheckStore reports, wrapping ErrStoreLost, when the store directory,
// JetStream's directory in it, an account's directory or its streams
// directory, or the lock file is no longer at its path
// with the identity it had when the server opened it, or when the store
// can no longer be written (file system read-only, permission gone). It
// only reads metadata: nothing is written.
func (s *Server) CheckStore() error {
	id := s.identity
	if id == nil {
		return nil
	}
	for i, p := range id.paths {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("%w: %s is gone (%v)", ErrStoreLost, p, errors.Unwrap(err))
		}
		if now, ok := idOf(fi); ok && now != id.ids[i] {
			return fmt.Errorf("%w: %s was replaced by another file or directory (device/inode %d/%d, was %d/%d)",
				ErrStoreLost, p, now.dev, now.ino, id.ids[i].dev, id.ids[i].ino)
		}
	}
	if err := s.checkAccountDirs(id); err != nil {
		return err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(s.store.Path, &st); err == nil && st.Flags&unix.ST_RDONLY != 0 {
		return fmt.Errorf("%w: the file system of %s is read-only now", ErrStoreLost, s.store.Path)
	}
	js := filepath.Join(s.store.Path, server.JetStreamStoreDir)
	if err := unix.Access(js, unix.W_OK|unix.X_OK); err != nil {
		return fmt.Errorf("%w: %s is not writable any more (%v)", ErrStoreLost, js, err)
	}
	return nil
}

// WatchStore checks the store until ctx ends: at once when inotify
// reports that the store directory, JetStream's directory, an account's
// directory or its streams directory, or an entry of one of them was
// deleted, moved or changed its attributes (owner, mode), or when the
// mount table changes (a remount read-only, a file system mounted over
// the store); and every interval (DefaultStoreCheckInterval when zero)
// in any case, for what neither event shows (a parent directory of the
// store moved). Where inotify is not available it checks every
// FallbackStoreCheckInterval instead. At the first failed check it stops
// JetStream at once — publishes get no PubAck from then on, so nothing
// more is acknowledged into files that are gone — stops recording stream
// positions (the path may now be another directory) and calls onLost with
// the reason, once.
func (s *Server) WatchStore(ctx context.Context, interval time.Duration, onLost func(error)) {
	if interval <= 0 {
		interval = DefaultStoreCheckInterval
	}
	changed := make(chan struct{}, 1)
	w, err := s.notifyStoreChanges(changed)
	if err != nil {
		interval = min(interval, FallbackStoreCheckInterval)
		s.log.Warn("cannot watch the store directory with inotify: checking it every interval only", "interval", interval, "err", err)
	} else {
		defer w.close()
	}
	if stop, err := notifyMountChanges(changed); err != nil {
		interval = min(interval, FallbackStoreCheckInterval)
		s.log.Warn("cannot watch the mount table: checking the store every interval", "interval", interval, "err", err)
	} else {
		defer stop()
	}
	// A first check once the watches are set: what changed before they
	// were raises no event.
	select {
	case changed <- struct{}{}:
	default:
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-changed:
		}
		err := s.CheckStore()
		if err == nil {
			if w != nil {
				w.watchAccounts(s.accountDirs())
			}
			continue
		}
		s.storeLost(err)
		onLost(err)
		return
	}
}

// storeEvents are the inotify events on a watched directory that make the
// store watch check the store: the directory itself or an entry of it
// deleted or moved away, its attributes changed, or an entry created (a
// new account's or streams directory, to be watched too).
const storeEvents = unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ATTRIB | unix.IN_DELETE | unix.IN_MOVED_FROM

// storeWatcher is the inotify instance of the store watch.
type storeWatcher struct {
	fd   int
	file *os.File
	// watched are the accounts' directories with a watch; only the store
	// watch's goroutine uses it.
	watched map[string]bool
}

// notifyStoreChanges sends on changed (without blocking) whenever inotify
// reports one of storeEvents on the store directory or JetStream's
// directory in it, and on the accounts' directories watchAccounts adds.
// close ends it.
func (s *Server) notifyStoreChanges(changed chan<- struct{}) (*storeWatcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, err
	}
	watches := []struct {
		path string
		mask uint32
	}{
		{s.store.Path, storeEvents},
		// A new account's directory is watched from the check its
		// creation causes on.
		{filepath.Join(s.store.Path, server.JetStreamStoreDir), storeEvents | unix.IN_CREATE},
	}
	for _, w := range watches {
		if _, err := unix.InotifyAddWatch(fd, w.path, w.mask); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("inotify watch on %s: %w", w.path, err)
		}
	}
	// A non-blocking descriptor in an *os.File uses the runtime's poller:
	// Close wakes the Read below.
	w := &storeWatcher{fd: fd, file: os.NewFile(uintptr(fd), "inotify"), watched: map[string]bool{}}
	go func() {
		buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
		for {
			if _, err := w.file.Read(buf); err != nil {
				return
			}
			select {
			case changed <- struct{}{}:
			default:
			}
		}
	}()
	w.watchAccounts(s.accountDirs())
	return w, nil
}

// watchAccounts adds a watch on each of dirs (the accounts' directories
// and their streams directories) not watched yet; an account's directory
// also reports its streams directory's creation.
func (w *storeWatcher) watchAccounts(dirs []string) {
	for _, d := range dirs {
		if w.watched[d] {
			continue
		}
		mask := uint32(storeEvents)
		if filepath.Base(d) != "streams" {
			mask |= unix.IN_CREATE
		}
		// A directory that vanished meanwhile is the check's to report.
		if _, err := unix.InotifyAddWatch(w.fd, d, mask); err == nil {
			w.watched[d] = true
		}
	}
}

func (w *storeWatcher) close() { _ = w.file.Close() }

// notifyMountChanges sends on changed (without blocking) whenever the
// mount table of holdfast's mount namespace changes (/proc/self/mountinfo
// polls with POLLPRI then): a file system remounted read-only, or one
// mounted over the store, changes no directory inotify watches. stop ends
// it. The wait blocks one thread in poll(2): the runtime's poller does not
// wait for POLLPRI.
func notifyMountChanges(changed chan<- struct{}) (stop func(), err error) {
	mounts, err := unix.Open("/proc/self/mountinfo", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	var wake [2]int
	if err := unix.Pipe2(wake[:], unix.O_CLOEXEC); err != nil {
		unix.Close(mounts)
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer unix.Close(mounts)
		defer unix.Close(wake[0])
		fds := []unix.PollFd{{Fd: int32(mounts), Events: unix.POLLPRI}, {Fd: int32(wake[0]), Events: unix.POLLIN}}
		for {
			_, err := unix.Poll(fds, -1)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil || fds[1].Revents != 0 {
				return
			}
			if fds[0].Revents&(unix.POLLPRI|unix.POLLERR) != 0 {
				select {
				case changed <- struct{}{}:
				default:
				}
			}
		}
	}()
	return func() {
		unix.Close(wake[1]) // POLLHUP on the read end ends the poll
		<-done
	}, nil
}

// storeLost stops JetStream and the position recorder after the store was
// lost. Safe to call more than once.
func (s *Server) storeLost(err error) {
	if !s.lost.CompareAndSwap(false, true) {
		return
	}
	s.log.Error("the store directory changed under the running server: JetStream stopped, no publish is acknowledged any more",
		"err", err)
	if s.stopRecord != nil {
		s.stopRecord()
	}
	if s.ns != nil {
		if err := s.ns.ShutdownJetStream(); err != nil {
			s.log.Warn("stopping JetStream after the store was lost", "err", err)
		}
	}
}

// StoreLost reports whether WatchStore found the store lost.
func (s *Server) StoreLost() bool { return s.lost.Load() }

// ProbeStoreWritable writes, syncs, renames and removes a small file in
// JetStream's directory of the store (the start-up probe), to name the
// cause when the store misbehaves (a file system shut down or remounted
// read-only). It writes to the disk: call it only when something is
// already wrong.
func (s *Server) ProbeStoreWritable() error {
	dir := filepath.Join(s.StoreDir(), server.JetStreamStoreDir)
	if err := store.ProbeWrite(dir); err != nil {
		return fmt.Errorf("%w: cannot write a file in %s: %w", ErrStoreWrite, dir, err)
	}
	return nil
}
