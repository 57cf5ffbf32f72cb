package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/nats-io/nats-server/v2/server"
	"golang.org/x/sys/unix"
)

// ErrStoreLost means the store directory the server opened is no longer
// the one at its path: deleted, moved away or replaced while running, or
// no longer writable. The server keeps writing into the files it holds
// open, which nothing will ever read again, so nothing more may be
// acknowledged.
var ErrStoreLost = errors.New("store directory lost while running")

// ErrStoreMoved means the store directory was moved (or renamed) while
// running: its files are whole at the place the error names.
var ErrStoreMoved = errors.New("store directory moved")

// Identity is what the store looked like when the server opened it:
// the device and inode of the store directory, of JetStream's directory
// in it and of the lock file holdfast holds.
type Identity struct {
	dir   string
	paths []string
	ids   []fileID
	lock  *Lock

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

// RecordIdentity notes the identity of the store at storeDir once the
// server runs on it; nil on a file system that is not a Unix one (nothing
// to compare). The lock file's identity comes from the descriptor holdfast
// holds (lock), so a lock file replaced before this call is caught as
// well.
func RecordIdentity(storeDir string, lock *Lock) (*Identity, error) {
	id := &Identity{dir: storeDir, lock: lock}
	for _, p := range []string{storeDir, filepath.Join(storeDir, server.JetStreamStoreDir)} {
		fi, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("cannot stat %s: %w", p, err)
		}
		fid, ok := idOf(fi)
		if !ok {
			return nil, nil // not a Unix file system: nothing to compare
		}
		id.paths, id.ids = append(id.paths, p), append(id.ids, fid)
	}
	if lock != nil {
		fi, err := lock.Stat()
		if errors.Is(err, os.ErrClosed) {
			return id, nil
		}
		if err != nil {
			return nil, fmt.Errorf("cannot stat lock file: %w", err)
		}
		if fid, ok := idOf(fi); ok {
			id.paths, id.ids = append(id.paths, filepath.Join(storeDir, LockFileName)), append(id.ids, fid)
		}
	}
	return id, nil
}

// AccountDirs lists the directories of the accounts in JetStream's
// directory of the store at storeDir, each with its streams directory:
// swapped while running (a copy put back by hand), the server writes on
// into the files it holds open, moved away, and acknowledges what nothing
// will read again.
func AccountDirs(storeDir string) []string {
	js := filepath.Join(storeDir, server.JetStreamStoreDir)
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

// checkAccountDirs compares the accounts' directories with what was
// recorded, and records those seen for the first time. holds reports
// whether the server holds a stream on file in an account.
func (id *Identity) checkAccountDirs(holds func(account string) bool) error {
	id.mu.Lock()
	defer id.mu.Unlock()
	if id.accounts == nil {
		id.accounts = map[string]fileID{}
	}
	for p, was := range id.accounts {
		fi, err := os.Stat(p)
		if errors.Is(err, os.ErrNotExist) && !holds(accountOfDir(p)) {
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
	for _, p := range AccountDirs(id.dir) {
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

// Check reports, wrapping ErrStoreLost, when the store directory,
// JetStream's directory in it, an account's directory or its streams
// directory, or the lock file is no longer at its path
// with the identity it had when the server opened it, or when the store
// can no longer be written (file system read-only, permission gone). It
// only reads metadata: nothing is written. holds reports whether the
// server holds a stream on file in an account: it removes an account's
// directories when the account's last stream is deleted.
func (id *Identity) Check(holds func(account string) bool) error {
	for i, p := range id.paths {
		fi, err := os.Stat(p)
		if err == nil {
			if now, ok := idOf(fi); ok && now != id.ids[i] {
				err = fmt.Errorf("%w: %s was replaced by another file or directory (device/inode %d/%d, was %d/%d)",
					ErrStoreLost, p, now.dev, now.ino, id.ids[i].dev, id.ids[i].ino)
			}
		} else {
			err = fmt.Errorf("%w: %s is gone (%v)", ErrStoreLost, p, errors.Unwrap(err))
		}
		if err != nil {
			if to := id.movedTo(); to != "" {
				return fmt.Errorf("%w (%w to %s: its files are there)", err, ErrStoreMoved, to)
			}
			return err
		}
	}
	if err := id.checkAccountDirs(holds); err != nil {
		return err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(id.dir, &st); err == nil && st.Flags&unix.ST_RDONLY != 0 {
		return fmt.Errorf("%w: the file system of %s is read-only now", ErrStoreLost, id.dir)
	}
	js := filepath.Join(id.dir, server.JetStreamStoreDir)
	if err := unix.Access(js, unix.W_OK|unix.X_OK); err != nil {
		return fmt.Errorf("%w: %s is not writable any more (%v)", ErrStoreLost, js, err)
	}
	return nil
}

// movedTo is where the store directory is now, when it was moved: the
// directory that holds the lock file holdfast keeps open.
func (id *Identity) movedTo() string {
	if id.lock == nil {
		return ""
	}
	p := id.lock.Path()
	if p == "" || filepath.Dir(p) == filepath.Clean(id.dir) {
		return ""
	}
	return filepath.Dir(p)
}

// storeEvents are the inotify events on a watched directory that make the
// store watch check the store: the directory itself or an entry of it
// deleted or moved away, its attributes changed, or an entry created (a
// new account's or streams directory, to be watched too).
const storeEvents = unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ATTRIB | unix.IN_DELETE | unix.IN_MOVED_FROM

// Watcher is the inotify instance of the store watch.
type Watcher struct {
	fd   int
	file *os.File
	// watched are the accounts' directories with a watch; only the store
	// watch's goroutine uses it.
	watched map[string]bool
}

// NotifyChanges sends on changed (without blocking) whenever inotify
// reports one of storeEvents on the store directory storeDir or
// JetStream's directory in it, and on the accounts' directories
// WatchAccounts adds (those there now at once). Close ends it.
func NotifyChanges(storeDir string, changed chan<- struct{}) (*Watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, err
	}
	watches := []struct {
		path string
		mask uint32
	}{
		{storeDir, storeEvents},
		// A new account's directory is watched from the check its
		// creation causes on.
		{filepath.Join(storeDir, server.JetStreamStoreDir), storeEvents | unix.IN_CREATE},
	}
	for _, w := range watches {
		if _, err := unix.InotifyAddWatch(fd, w.path, w.mask); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("inotify watch on %s: %w", w.path, err)
		}
	}
	// A non-blocking descriptor in an *os.File uses the runtime's poller:
	// Close wakes the Read below.
	w := &Watcher{fd: fd, file: os.NewFile(uintptr(fd), "inotify"), watched: map[string]bool{}}
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
	w.WatchAccounts(AccountDirs(storeDir))
	return w, nil
}

// WatchAccounts adds a watch on each of dirs (the accounts' directories
// and their streams directories) not watched yet; an account's directory
// also reports its streams directory's creation.
func (w *Watcher) WatchAccounts(dirs []string) {
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

// Close ends the watch.
func (w *Watcher) Close() { _ = w.file.Close() }

// NotifyMountChanges sends on changed (without blocking) whenever the
// mount table of holdfast's mount namespace changes (/proc/self/mountinfo
// polls with POLLPRI then): a file system remounted read-only, or one
// mounted over the store, changes no directory inotify watches. stop ends
// it. The wait blocks one thread in poll(2): the runtime's poller does not
// wait for POLLPRI.
func NotifyMountChanges(changed chan<- struct{}) (stop func(), err error) {
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
