// Package store is the store directory's logic: its validation and lock,
// the entries holdfast keeps beside the server's, the key files and the
// copies kept while the server encrypts, the recovery guard, the recorded
// state and the data-loss comparison, and the store's identity and watch.
// Its functions work on a path and need no running server; embedded's
// Server calls them during its lifecycle.
package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ErrDir is the sentinel every store directory refusal unwraps to.
var ErrDir = errors.New("store dir refused")

// DirError is one refusal of the store directory: the path, what is
// wrong and how to fix it, as one line.
type DirError struct {
	Path   string
	Reason string
	Fix    string
	Err    error
	// Holder names the process that holds the directory, for lock refusals.
	Holder string
}

func (e *DirError) Error() string {
	msg := fmt.Sprintf("store dir %s: %s", e.Path, e.Reason)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	if e.Fix != "" {
		msg += " (" + e.Fix + ")"
	}
	return msg
}

// Unwrap returns ErrDir and the cause.
func (e *DirError) Unwrap() []error { return []error{ErrDir, e.Err} }

// DirCheck is what CheckDir learned about a usable directory.
type DirCheck struct {
	Path    string // absolute path
	Created bool   // the directory did not exist and was created
	// Missing: the directory does not exist (InspectDir, which does
	// not create it); the checks ran on Parent, its nearest existing
	// ancestor, where it would be created.
	Missing  bool
	Parent   string
	FSType   string // file system name, e.g. "ext4", "tmpfs"
	Free     int64  // bytes available to an unprivileged writer
	Warnings []string
}

// Magic numbers of memory-backed file systems (statfs f_type).
const (
	tmpfsMagic = 0x01021994
	ramfsMagic = 0x858458f6
)

var fsNames = map[int64]string{
	0xEF53:     "ext4",
	0x58465342: "xfs",
	0x9123683E: "btrfs",
	0x794c7630: "overlayfs",
	0x65735546: "fuse",
	0x2fc12fc1: "zfs",
	0xF2F52010: "f2fs",
	0x6969:     "nfs",
	tmpfsMagic: "tmpfs",
	ramfsMagic: "ramfs",
}

// CheckDir makes sure dir can hold a JetStream file store that
// survives a reboot: it creates a missing directory (0750) and refuses a
// path that is not a directory, is not writable (proved by creating,
// writing, fsyncing, renaming and removing a probe file), or is on
// tmpfs/ramfs unless allowTmpfs. It warns when free space is below
// maxFileStore. It does not lock: see LockDir.
func CheckDir(dir string, allowTmpfs bool, maxFileStore int64) (*DirCheck, error) {
	return checkStoreDir(dir, allowTmpfs, maxFileStore, true)
}

// InspectDir checks dir as CheckDir does, for `holdfast check`,
// but leaves nothing behind: a missing directory is not created (its
// nearest existing ancestor must take the directory: same file system,
// write and read-only checks; the write probe's file is removed).
func InspectDir(dir string, allowTmpfs bool, maxFileStore int64) (*DirCheck, error) {
	return checkStoreDir(dir, allowTmpfs, maxFileStore, false)
}

func checkStoreDir(dir string, allowTmpfs bool, maxFileStore int64, create bool) (*DirCheck, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, &DirError{Path: dir, Reason: "cannot resolve path", Err: err}
	}
	res := &DirCheck{Path: abs}
	// at is the directory the checks run on: the store dir, or for
	// InspectDir of a missing one the ancestor it would be made in.
	at := abs
	fi, err := os.Stat(abs)
	if errors.Is(err, os.ErrNotExist) {
		if link, target := danglingLink(abs); link != "" {
			what := "is"
			if link != abs {
				what = "has " + link + " in its path, which is"
			}
			return nil, &DirError{Path: abs, Reason: fmt.Sprintf("%s a symbolic link to %s, which does not exist: a disk not mounted?", what, target),
				Fix: "mount the file system the link points into, or create " + target + " and give the holdfast user write access, or set jetstream.store_dir; " +
					"holdfast does not create it, which would put the store under an empty mount point"}
		}
	}
	switch {
	case errors.Is(err, os.ErrNotExist) && !create:
		res.Missing = true
		for at = filepath.Dir(abs); ; at = filepath.Dir(at) {
			pfi, perr := os.Stat(at)
			if perr == nil && pfi.IsDir() {
				break
			}
			if perr == nil || !errors.Is(perr, os.ErrNotExist) || at == filepath.Dir(at) {
				return nil, &DirError{Path: abs, Reason: "missing and cannot be created under " + at, Err: unwrapPath(perr),
					Fix: "create it and give the holdfast user write access, or set jetstream.store_dir"}
			}
		}
		res.Parent = at
	case errors.Is(err, os.ErrNotExist):
		if err := os.MkdirAll(abs, 0o750); err != nil {
			return nil, &DirError{Path: abs, Reason: "missing and cannot be created", Err: unwrapPath(err),
				Fix: "create it and give the holdfast user write access, or set jetstream.store_dir"}
		}
		res.Created = true
	case err != nil:
		return nil, &DirError{Path: abs, Reason: "cannot stat", Err: unwrapPath(err), Fix: statFix(err)}
	case !fi.IsDir():
		return nil, &DirError{Path: abs, Reason: "not a directory",
			Fix: "move the file away or set jetstream.store_dir to a directory"}
	}

	var st unix.Statfs_t
	if err := unix.Statfs(at, &st); err != nil {
		return nil, &DirError{Path: abs, Reason: "cannot statfs", Err: err}
	}
	fsType := int64(st.Type)
	res.FSType = fsNames[fsType]
	if res.FSType == "" {
		res.FSType = "0x" + strconv.FormatInt(fsType, 16)
	}
	res.Free = int64(st.Bavail) * int64(st.Bsize)
	if fsType == tmpfsMagic || fsType == ramfsMagic {
		if !allowTmpfs {
			return nil, &DirError{Path: abs, Reason: "is on " + res.FSType + ", which loses every message at reboot",
				Fix: "put the store on a disk, or set jetstream.allow_tmpfs = true to accept the loss"}
		}
		res.Warnings = append(res.Warnings, fmt.Sprintf("store dir %s is on %s: every message is lost at reboot (jetstream.allow_tmpfs = true)", abs, res.FSType))
	}
	if st.Flags&unix.ST_RDONLY != 0 {
		return nil, &DirError{Path: abs, Reason: "is on a read-only file system",
			Fix: "remount it read-write or set jetstream.store_dir to a writable directory"}
	}
	if err := ProbeWrite(at); err != nil {
		reason := "not writable"
		if at != abs {
			reason = "missing, and " + at + " where it would be created is not writable"
		}
		return nil, &DirError{Path: abs, Reason: reason, Err: err,
			Fix: "give the user running holdfast write access (chown holdfast:holdfast), or set jetstream.store_dir"}
	}
	if !res.Missing {
		if err := checkStoreEntries(abs); err != nil {
			return nil, err
		}
		warnings, err := checkStoreTree(abs, fsType, allowTmpfs)
		if err != nil {
			return nil, err
		}
		res.Warnings = append(res.Warnings, warnings...)
	}
	if w := foreignOwnerWarning(abs); w != "" && create { // check creates nothing
		res.Warnings = append(res.Warnings, w)
	}
	if maxFileStore > 0 && res.Free < maxFileStore {
		res.Warnings = append(res.Warnings, fmt.Sprintf("store dir %s has %s free, less than jetstream.max_file_store (%s): publishes will fail when the disk fills before the limit",
			abs, HumanBytes(res.Free), HumanBytes(maxFileStore)))
	}
	return res, nil
}

// danglingLink finds, for a path that does not exist, the symbolic link in
// it that points nowhere (the path itself or the nearest of its existing
// ancestors): "" when the nearest existing part is not such a link, and a
// missing directory may be created.
func danglingLink(path string) (link, target string) {
	for p := path; ; p = filepath.Dir(p) {
		fi, err := os.Lstat(p)
		if err == nil {
			if fi.Mode()&os.ModeSymlink == 0 {
				return "", ""
			}
			if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
				return "", ""
			}
			target, _ := os.Readlink(p)
			if !filepath.IsAbs(target) {
				target = filepath.Join(filepath.Dir(p), target)
			}
			return p, target
		}
		if p == filepath.Dir(p) {
			return "", ""
		}
	}
}

// statFix says what to do about a path that cannot be looked at.
func statFix(err error) string {
	switch {
	case errors.Is(err, unix.ELOOP):
		return "the path's symbolic links form a loop: fix them, or set jetstream.store_dir"
	case errors.Is(err, unix.ENOTDIR):
		return "a part of the path is a file, not a directory: move it away, or set jetstream.store_dir"
	}
	return "check the permissions of its parent directories"
}

// storeEntries are the names holdfast and the server keep in a store
// directory, each with the kind of file it must be when it exists.
var storeEntries = []struct {
	name string
	dir  bool
	what string
}{
	{"jetstream", true, "where nats-server keeps the streams"},
	{LockFileName, false, "holdfast's lock file"},
	{StateFileName, false, "where holdfast records stream positions for the data-loss check"},
	{PeerNamesFileName, false, "where holdfast records the names of the cluster's nodes"},
	{OrphanDirName, true, "where holdfast moves the files of vanished streams"},
	{EncryptingDirName, true, "where holdfast keeps clear-text streams while they are encrypted"},
	{RecoveryLinksDirName, true, "where holdfast links the streams' files while the server recovers them"},
	{SyncGuardDirName, true, "where holdfast links the streams' files as it last flushed them (jetstream.commit_window)"},
}

// checkStoreEntries refuses a store directory in which one of the names
// holdfast or the server use exists as the wrong kind of file: a file
// named jetstream, a directory named holdfast.lock. The server or the lock
// would fail on it later, after `holdfast check` said it was fine.
func checkStoreEntries(dir string) error {
	for _, e := range storeEntries {
		path := filepath.Join(dir, e.name)
		fi, err := os.Lstat(path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return &DirError{Path: dir, Reason: "cannot stat " + e.name, Err: unwrapPath(err),
				Fix: "give the user running holdfast access to it"}
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			// The server and the lock follow a link; judge what it points to.
			if fi, err = os.Stat(path); err != nil {
				return &DirError{Path: dir, Reason: e.name + " is a symbolic link that cannot be followed", Err: unwrapPath(err),
					Fix: "remove the link " + path + " or make it point to an existing " + kind(e.dir)}
			}
		}
		if fi.IsDir() == e.dir && (e.dir || fi.Mode().IsRegular()) {
			continue
		}
		return &DirError{Path: dir, Reason: fmt.Sprintf("%s is a %s, not a %s (%s)", e.name, describeMode(fi.Mode()), kind(e.dir), e.what),
			Fix: "move " + path + " out of the store dir; holdfast creates it"}
	}
	return nil
}

// checkStoreTree judges, like the store dir itself, every file system the
// store's data would land on below it: a tmpfs mounted on STORE/jetstream
// (or on an account's or a stream's directory), a symbolic link from there
// to /dev/shm, a read-only bind mount. The store dir on a disk proves
// nothing about them, and the server writes into them as into the disk.
// Only directories and links are looked at, never the message files.
func checkStoreTree(dir string, dirFSType int64, allowTmpfs bool) ([]string, error) {
	var warnings []string
	seen := map[int64]bool{dirFSType: true} // warn once per kind
	check := func(path string) error {
		var st unix.Statfs_t
		if err := unix.Statfs(path, &st); err != nil {
			if errors.Is(err, unix.ENOENT) {
				return nil // removed meanwhile, or a dangling link the server never follows
			}
			return &DirError{Path: dir, Reason: "cannot statfs " + relTo(dir, path), Err: err,
				Fix: "give the user running holdfast access to it"}
		}
		fsType := int64(st.Type)
		if fsType == tmpfsMagic || fsType == ramfsMagic {
			name := fsNames[fsType]
			if !allowTmpfs {
				return &DirError{Path: dir, Reason: relTo(dir, path) + " is on " + name + " (mounted or linked inside the store dir), which loses every message at reboot",
					Fix: "unmount it or remove the link so that the whole store is on a disk, or set jetstream.allow_tmpfs = true to accept the loss"}
			}
			if !seen[fsType] {
				seen[fsType] = true
				warnings = append(warnings, fmt.Sprintf("store dir %s: %s is on %s: every message in it is lost at reboot (jetstream.allow_tmpfs = true)", dir, relTo(dir, path), name))
			}
		}
		if st.Flags&unix.ST_RDONLY != 0 {
			return &DirError{Path: dir, Reason: relTo(dir, path) + " is on a read-only file system (mounted or linked inside the store dir)",
				Fix: "remount it read-write, or unmount it or remove the link"}
		}
		return nil
	}
	for _, e := range storeEntries {
		path := filepath.Join(dir, e.name)
		fi, err := os.Stat(path)
		if err != nil {
			continue // missing: created in the store dir itself (checkStoreEntries refused the rest)
		}
		if err := check(path); err != nil {
			return nil, err
		}
		if err := checkAccess(dir, path, fi.IsDir()); err != nil {
			return nil, err
		}
		if !e.dir || e.name == OrphanDirName || e.name == RecoveryLinksDirName || e.name == SyncGuardDirName {
			continue // moved aside, never opened again; links to the streams' own files
		}
		// Every file, directory and link below: account, streams, a
		// stream's msgs and obs, the cluster's _js_. A link is judged by
		// where it points and not walked into.
		err = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return &DirError{Path: dir, Reason: "cannot read " + relTo(dir, p), Err: unwrapPath(err),
					Fix: "chown -R the store dir to the user running holdfast"}
			}
			if p == path {
				return nil
			}
			isDir := d.IsDir()
			if d.Type()&fs.ModeSymlink != 0 {
				fi, err := os.Stat(p)
				if err != nil {
					return nil // a dangling link the server never follows
				}
				isDir = fi.IsDir()
			}
			if err := checkAccess(dir, p, isDir); err != nil {
				return err
			}
			if !(d.IsDir() || d.Type()&fs.ModeSymlink != 0) {
				return nil
			}
			return check(p)
		})
		if err != nil {
			return nil, err
		}
	}
	return warnings, nil
}

// checkAccess refuses a file or directory of the store that the user
// running holdfast cannot read and write (a directory: also enter), as
// left by running holdfast once as root. nats-server deletes the whole
// directory of a stream whose files it cannot open while it recovers the
// store at start-up, so one such message block costs all of its stream's
// messages.
func checkAccess(dir, path string, isDir bool) error {
	mode := uint32(unix.R_OK | unix.W_OK)
	if isDir {
		mode |= unix.X_OK
	}
	err := unix.Faccessat(unix.AT_FDCWD, path, mode, unix.AT_EACCESS)
	if err == nil || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EROFS) {
		return nil // gone meanwhile; a read-only file system is named by its own check
	}
	owner := "another user"
	if fi, serr := os.Stat(path); serr == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			owner = userName(st.Uid)
		}
	}
	what := "file"
	if isDir {
		what = "directory"
	}
	return &DirError{Path: dir,
		Reason: fmt.Sprintf("%s %s (owned by %s) cannot be read and written by %s, which runs holdfast; the server would delete the data of a stream whose files it cannot open",
			what, relTo(dir, path), owner, userName(uint32(os.Geteuid()))),
		Err: err,
		Fix: "files left by running holdfast as another user, e.g. root: chown -R " + loginName(uint32(os.Geteuid())) + " " + dir}
}

// foreignOwnerWarning warns root running holdfast on a store dir another
// user owns (the service's): every file the server creates now belongs to
// root, and the service refuses the store until it is given back.
func foreignOwnerWarning(dir string) string {
	if os.Geteuid() != 0 {
		return ""
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return ""
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || st.Uid == 0 {
		return ""
	}
	return fmt.Sprintf("store dir %s belongs to %s and holdfast runs as root: the files it creates now belong to root, and holdfast run as %s refuses the store until they are given back (chown -R %s %s); stop this one and use the service, or run it as that user",
		dir, userName(st.Uid), loginName(st.Uid), loginName(st.Uid), dir)
}

// userName names a user id for a message: "holdfast (uid 998)", or the
// number alone.
func userName(uid uint32) string {
	if name := loginName(uid); name != strconv.FormatUint(uint64(uid), 10) {
		return name + " (uid " + strconv.FormatUint(uint64(uid), 10) + ")"
	}
	return "uid " + strconv.FormatUint(uint64(uid), 10)
}

// loginName is the user's name, or its number when it has none.
func loginName(uid uint32) string {
	id := strconv.FormatUint(uint64(uid), 10)
	if u, err := user.LookupId(id); err == nil && u.Username != "" {
		return u.Username
	}
	return id
}

// relTo names path relative to the store dir, as an operator would look
// for it there.
func relTo(dir, path string) string {
	if rel, err := filepath.Rel(dir, path); err == nil {
		return rel
	}
	return path
}

func kind(dir bool) string {
	if dir {
		return "directory"
	}
	return "regular file"
}

func describeMode(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m.IsRegular():
		return "regular file"
	case m&os.ModeNamedPipe != 0:
		return "named pipe"
	case m&os.ModeSocket != 0:
		return "socket"
	case m&os.ModeDevice != 0:
		return "device"
	}
	return "special file"
}

// ProbeWrite proves the directory takes the operations the file store
// needs: create, write, fsync, rename, remove.
func ProbeWrite(dir string) error {
	tmp := filepath.Join(dir, ".holdfast-probe."+strconv.Itoa(os.Getpid()))
	final := tmp + ".renamed"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return unwrapPath(err)
	}
	_, werr := f.Write([]byte("holdfast write probe\n"))
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, final); err != nil {
		os.Remove(tmp)
		return unwrapPath(err)
	}
	if err := os.Remove(final); err != nil {
		return unwrapPath(err)
	}
	return nil
}

// unwrapPath drops the *PathError wrapper, whose path the message already names.
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return le.Err
	}
	return err
}

func HumanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// LockFileName is the lock file holdfast keeps in the store directory.
const LockFileName = "holdfast.lock"

// Lock is an exclusive lock on a store directory, held for the life
// of the process (the kernel releases it if the process dies).
type Lock struct {
	f *os.File
}

// Stat describes the lock file (os.ErrClosed once unlocked).
func (l *Lock) Stat() (os.FileInfo, error) {
	if l.f == nil {
		return nil, os.ErrClosed
	}
	return l.f.Stat()
}

// Path is where the lock file is now, as the kernel knows the descriptor
// holdfast holds: elsewhere once the store directory was moved, "" once
// the file was deleted (or where /proc cannot tell).
func (l *Lock) Path() string {
	if l.f == nil {
		return ""
	}
	p, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", l.f.Fd()))
	if err != nil || !filepath.IsAbs(p) || strings.HasSuffix(p, " (deleted)") {
		return ""
	}
	return p
}

// LockDir takes an exclusive, non-blocking flock on dir/holdfast.lock
// and records the holder's PID in it. A second holdfast on the same
// directory is refused with a message that names the holder.
//
// A lock still held is tried again for up to LockWait: a holdfast killed
// with SIGKILL can leave it held for a moment after it was reaped, by a
// handler process it was starting (forked, not yet exec'd) — a restart
// right after a kill -9 must not fail on that.
func LockDir(dir string) (*Lock, error) {
	return lockStoreDir(dir, LockWait)
}

// LockWait is how long LockDir waits for a lock held by another
// process before refusing.
const LockWait = 3 * time.Second

func lockStoreDir(dir string, wait time.Duration) (*Lock, error) {
	path := filepath.Join(dir, LockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, &DirError{Path: dir, Reason: "cannot open lock file " + LockFileName, Err: unwrapPath(err),
			Fix: "give the user running holdfast write access"}
	}
	deadline := time.Now().Add(wait)
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	for errors.Is(err, unix.EWOULDBLOCK) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	}
	if err != nil {
		holder := "another process"
		if b, rerr := os.ReadFile(path); rerr == nil {
			if pid := strings.TrimSpace(string(b)); pid != "" {
				holder = "process " + pid
			}
		}
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, &DirError{Path: dir, Reason: "locked by " + holder + " (another holdfast is using it)", Holder: holder,
				Fix: "stop the other instance (systemctl stop holdfast) or give this one its own jetstream.store_dir"}
		}
		return nil, &DirError{Path: dir, Reason: "cannot lock", Err: err}
	}
	// A stock nats-server takes no lock on its store: look for any other
	// process with files open under the directory.
	if pid, comm := openedBy(dir); pid != 0 {
		f.Close()
		return nil, &DirError{Path: dir, Reason: fmt.Sprintf("in use by process %d (%s), which has files open in it", pid, comm),
			Holder: fmt.Sprintf("process %d (%s)", pid, comm),
			Fix:    "stop that process or give holdfast its own jetstream.store_dir"}
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Lock{f: f}, nil
}

// Unlock releases the lock. The lock file stays: removing it would race
// with another process that opened it already.
func (l *Lock) Unlock() error {
	if l == nil || l.f == nil {
		return nil
	}
	_ = l.f.Truncate(0)
	err := l.f.Close() // closing the descriptor releases the flock
	l.f = nil
	return err
}

// openedBy returns a process other than this one that has a file open
// under dir, as far as /proc lets this user see, or 0.
func openedBy(dir string) (int, string) {
	self := os.Getpid()
	procs, _ := filepath.Glob("/proc/[0-9]*")
	// /proc/PID/fd links are absolute and free of symlinks.
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	prefix := filepath.Clean(dir) + "/"
	for _, p := range procs {
		pid, err := strconv.Atoi(filepath.Base(p))
		if err != nil || pid == self {
			continue
		}
		fds, err := os.ReadDir(p + "/fd")
		if err != nil {
			continue
		}
		for _, fd := range fds {
			target, err := os.Readlink(p + "/fd/" + fd.Name())
			if err == nil && strings.HasPrefix(target, prefix) {
				comm, _ := os.ReadFile(p + "/comm")
				return pid, strings.TrimSpace(string(comm))
			}
		}
	}
	return 0, ""
}

// LockHolder reports who holds the store lock ("process 1234"), or "" when
// nobody does. It takes and releases the lock to find out.
func LockHolder(dir string) string {
	holder, _ := ProbeLock(dir)
	return holder
}

// ProbeLock takes and releases the store lock the way `holdfast run` takes
// it, for `holdfast check`. It returns the holder ("process 1234") when
// another process holds the directory, and an error when the lock could
// not be taken for any other reason (which would stop `holdfast run`).
//
// A missing lock file is not created: no process holds it, and the
// directory was proved writable by InspectDir.
func ProbeLock(dir string) (holder string, err error) {
	if _, err := os.Lstat(filepath.Join(dir, LockFileName)); errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	l, err := lockStoreDir(dir, 0)
	if err == nil {
		return "", l.Unlock()
	}
	var se *DirError
	if errors.As(err, &se) && se.Holder != "" {
		return se.Holder, nil
	}
	return "", err
}
