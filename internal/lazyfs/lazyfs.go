// Package lazyfs is a FUSE passthrough file system that can simulate a
// power cut: it remembers, for every file, what was written since that
// file was last synced, and Crash restores every file to its last synced
// content and size before it unmounts. It is the model of Jepsen's LazyFS,
// built for holdfast's durability tests.
//
// The model, chosen to match ext4 with default options:
//
//   - Data is durable only after fsync or fdatasync of the file, or when
//     written through a descriptor opened with O_SYNC or O_DSYNC (that
//     write syncs the whole file).
//   - A file created and never synced is empty after a crash (it still
//     exists: directory operations — create, rename, unlink, mkdir — are
//     durable at once).
//   - Writes, truncates and O_TRUNC opens since the last sync are undone.
//
// Files that were on the backing directory before Mount are taken as
// durable. lazyfs needs /dev/fuse and, for unprivileged users, fusermount3.
package lazyfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// ErrCrashed is returned by FS methods after Crash.
var ErrCrashed = errors.New("lazyfs: file system crashed")

// FS is a mounted lazy file system.
type FS struct {
	// Backing is the directory that holds the files.
	Backing string
	// Mountpoint is where the file system is mounted.
	Mountpoint string

	server *fuse.Server
	child  *child // set when a child process serves the mount (MountIn)

	mu      sync.Mutex
	files   map[fileID]*fileState
	crashed bool
	stats   Stats
}

// Stats counts what the file system saw since Mount.
type Stats struct {
	Writes    int64 // write calls
	Syncs     int64 // fsync/fdatasync calls and O_SYNC writes
	Truncates int64 // size changes through setattr or O_TRUNC
}

// CrashReport says what Crash undid.
type CrashReport struct {
	Files        int   // files restored to their last synced state
	BytesDropped int64 // bytes beyond the synced size that were cut off
	Undone       int   // overwrites and truncates rolled back
}

type fileID struct{ dev, ino uint64 }

// fileState is what a file looked like at its last sync, kept from its
// first change after that sync: the size then, and the old bytes of every
// range of that synced content changed since, in order.
type fileState struct {
	syncedSize int64
	undo       []undoRecord
}

type undoRecord struct {
	off  int64
	data []byte
}

// Mount mounts a lazy view of backing at mountpoint. Both must be
// existing directories.
func Mount(backing, mountpoint string) (*FS, error) {
	backing, err := filepath.Abs(backing)
	if err != nil {
		return nil, err
	}
	mountpoint, err = filepath.Abs(mountpoint)
	if err != nil {
		return nil, err
	}
	var st syscall.Stat_t
	if err := syscall.Stat(backing, &st); err != nil {
		return nil, fmt.Errorf("lazyfs: backing dir %s: %w", backing, err)
	}
	lfs := &FS{Backing: backing, Mountpoint: mountpoint, files: map[fileID]*fileState{}}
	root := &node{LoopbackNode: &gofs.LoopbackNode{RootData: &gofs.LoopbackRoot{Path: backing, Dev: uint64(st.Dev)}}, fs: lfs}
	root.RootData.RootNode = root
	// No attribute or entry caching: the kernel asks for every change, and
	// a remount after Crash sees the restored sizes at once.
	zero := time.Duration(0)
	opts := &gofs.Options{
		EntryTimeout:    &zero,
		AttrTimeout:     &zero,
		NegativeTimeout: &zero,
		MountOptions: fuse.MountOptions{
			FsName: "lazyfs:" + backing,
			Name:   "lazyfs",
			// Every write must reach this process: no kernel passthrough.
			DisabledCapabilities: fuse.CAP_PASSTHROUGH,
			DirectMount:          os.Geteuid() == 0,
			MaxBackground:        64,
		},
	}
	server, err := gofs.Mount(mountpoint, root, opts)
	if err != nil {
		return nil, fmt.Errorf("lazyfs: mount %s on %s: %w", backing, mountpoint, err)
	}
	lfs.server = server
	return lfs, nil
}

// Stats returns the counters since Mount.
func (f *FS) Stats() Stats {
	if f.child != nil {
		r, _ := f.child.call("stats")
		if r.Stats == nil {
			return Stats{}
		}
		return *r.Stats
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stats
}

// Unsynced returns how many files have changes that a crash would undo.
func (f *FS) Unsynced() int {
	if f.child != nil {
		r, _ := f.child.call("unsynced")
		return r.Unsynced
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.files)
}

// Unmount unmounts without crashing: every write stays, as after a clean
// shutdown of the machine. It retries while the mount is busy, then
// detaches it lazily.
func (f *FS) Unmount() error {
	if f.child != nil {
		_, err := f.child.call("unmount")
		return err
	}
	if f.server == nil {
		return nil
	}
	// The serve loop ends once the kernel drops the connection, which
	// a mount namespace made while this was mounted (a container started
	// meanwhile: systemd-nspawn, unshare -m) keeps until it goes; the
	// install test's container held the power-loss tests' cuts for
	// minutes. go-fuse's Unmount waits for that loop: as root (a direct
	// mount) the mount is taken off here with umount(2) instead, and
	// the loop left to end with that namespace (a child process serving
	// the mount exits, which ends the connection for it at once).
	unmount := f.server.Unmount
	if os.Geteuid() == 0 {
		unmount = func() error { return syscall.Unmount(f.Mountpoint, 0) }
	}
	var err error
	for i := 0; i < 50; i++ {
		if err = unmount(); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		if lerr := syscall.Unmount(f.Mountpoint, syscall.MNT_DETACH); lerr != nil {
			return fmt.Errorf("lazyfs: unmount %s: %w (lazy unmount: %v)", f.Mountpoint, err, lerr)
		}
	}
	done := make(chan struct{})
	go func(s *fuse.Server) {
		s.Wait()
		close(done)
	}(f.server)
	select {
	case <-done:
	case <-time.After(2 * time.Second):
	}
	f.server = nil
	return nil
}

// Crash simulates a power cut: from now on every write fails, every file
// is restored to its content and size at its last sync, and the file
// system is unmounted. Stop the processes that use it first (kill -9):
// an open file keeps the mount busy until it is detached.
func (f *FS) Crash() (CrashReport, error) {
	if f.child != nil {
		r, err := f.child.call("crash")
		if r.Report == nil {
			return CrashReport{}, err
		}
		return *r.Report, err
	}
	f.mu.Lock()
	f.crashed = true
	rep, err := f.restoreLocked()
	f.files = map[fileID]*fileState{}
	f.mu.Unlock()
	if uerr := f.Unmount(); uerr != nil {
		err = errors.Join(err, uerr)
	}
	return rep, err
}

// restoreLocked walks the backing directory and rolls every file with
// unsynced changes back to its synced state.
func (f *FS) restoreLocked() (CrashReport, error) {
	var rep CrashReport
	var errs []error
	_ = filepath.WalkDir(f.Backing, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			errs = append(errs, err)
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(path, &st); err != nil {
			errs = append(errs, err)
			return nil
		}
		state := f.files[fileID{uint64(st.Dev), st.Ino}]
		if state == nil {
			return nil
		}
		if err := state.restore(path, st.Size, &rep); err != nil {
			errs = append(errs, fmt.Errorf("restore %s: %w", path, err))
		}
		return nil
	})
	return rep, errors.Join(errs...)
}

func (s *fileState) restore(path string, size int64, rep *CrashReport) error {
	fd, err := syscall.Open(path, syscall.O_WRONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	for i := len(s.undo) - 1; i >= 0; i-- {
		u := s.undo[i]
		if _, err := syscall.Pwrite(fd, u.data, u.off); err != nil {
			return err
		}
		rep.Undone++
	}
	if size > s.syncedSize {
		rep.BytesDropped += size - s.syncedSize
	}
	if err := syscall.Ftruncate(fd, s.syncedSize); err != nil {
		return err
	}
	rep.Files++
	// The restored state is what the backing disk must keep.
	return syscall.Fsync(fd)
}

// stateLocked returns the state of a file about to change, starting one
// at its current size when the file is in sync.
func (f *FS) stateLocked(id fileID, size int64) *fileState {
	s := f.files[id]
	if s == nil {
		s = &fileState{syncedSize: size}
		f.files[id] = s
	}
	return s
}

// saveLocked keeps the synced bytes in [off, off+n) that are about to be
// overwritten or cut off. reader reads the current content.
func (s *fileState) save(off, n int64, reader func([]byte, int64) (int, error)) error {
	end := min(off+n, s.syncedSize)
	if off >= end {
		return nil
	}
	buf := make([]byte, end-off)
	got, err := reader(buf, off)
	if err != nil {
		return err
	}
	// Bytes the file no longer has (it was shrunk since the sync) were
	// saved by that truncate; what is missing now reads as zeros.
	s.undo = append(s.undo, undoRecord{off: off, data: buf[:max(got, 0)]})
	return nil
}

// synced marks a file as durable in its current state.
func (f *FS) syncedLocked(id fileID) {
	delete(f.files, id)
	f.stats.Syncs++
}

// node is a loopback node whose files and truncates are tracked.
type node struct {
	*gofs.LoopbackNode
	fs *FS
}

var (
	_ gofs.NodeWrapChilder = (*node)(nil)
	_ gofs.NodeOpener      = (*node)(nil)
	_ gofs.NodeCreater     = (*node)(nil)
	_ gofs.NodeSetattrer   = (*node)(nil)
)

// WrapChild makes every node of the tree a tracked node.
func (n *node) WrapChild(ctx context.Context, ops gofs.InodeEmbedder) gofs.InodeEmbedder {
	if ln, ok := ops.(*gofs.LoopbackNode); ok {
		return &node{LoopbackNode: ln, fs: n.fs}
	}
	return ops
}

func (n *node) backingPath() string {
	return filepath.Join(n.RootData.Path, n.Path(n.Root()))
}

// Open opens the backing file; an O_TRUNC open is a tracked truncate.
func (n *node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	trunc := flags&syscall.O_TRUNC != 0
	fh, fflags, errno := n.LoopbackNode.Open(ctx, flags&^syscall.O_TRUNC)
	if errno != 0 {
		return nil, 0, errno
	}
	lf, err := newFile(n.fs, fh, flags)
	if err != nil {
		fh.(gofs.FileReleaser).Release(ctx)
		return nil, 0, gofs.ToErrno(err)
	}
	if trunc {
		if errno := lf.truncate(0); errno != 0 {
			lf.Release(ctx)
			return nil, 0, errno
		}
	}
	return lf, fflags, 0
}

// Create creates the backing file: it exists at once, empty as far as a
// crash is concerned until it is synced.
func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	n.fs.mu.Lock()
	crashed := n.fs.crashed
	n.fs.mu.Unlock()
	if crashed {
		return nil, nil, 0, syscall.EIO
	}
	ino, fh, fflags, errno := n.LoopbackNode.Create(ctx, name, flags&^syscall.O_TRUNC, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	lf, err := newFile(n.fs, fh, flags)
	if err != nil {
		fh.(gofs.FileReleaser).Release(ctx)
		return nil, nil, 0, gofs.ToErrno(err)
	}
	n.fs.mu.Lock()
	var st syscall.Stat_t
	if lf.fstat(&st) == nil && st.Size == 0 {
		// A new file (or an empty one): its synced content is nothing.
		// This also forgets the state of a deleted file whose inode
		// number the backing file system reused.
		n.fs.files[lf.id] = &fileState{}
	}
	n.fs.mu.Unlock()
	if flags&syscall.O_TRUNC != 0 {
		if errno := lf.truncate(0); errno != 0 {
			lf.Release(ctx)
			return nil, nil, 0, errno
		}
	}
	return ino, lf, fflags, 0
}

// Setattr tracks size changes made by path (truncate(2)) or through a
// handle (ftruncate(2)) before applying them.
func (n *node) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if size, ok := in.GetSize(); ok {
		if lf, ok := f.(*file); ok {
			if errno := lf.truncate(int64(size)); errno != 0 {
				return errno
			}
		} else if errno := n.truncatePath(int64(size)); errno != 0 {
			return errno
		}
		in.Valid &^= fuse.FATTR_SIZE
	}
	return n.LoopbackNode.Setattr(ctx, f, in, out)
}

func (n *node) truncatePath(size int64) syscall.Errno {
	fd, err := syscall.Open(n.backingPath(), syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return gofs.ToErrno(err)
	}
	defer syscall.Close(fd)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return gofs.ToErrno(err)
	}
	read := func(b []byte, off int64) (int, error) { return preadAll(fd, b, off) }
	return n.fs.truncate(fileID{uint64(st.Dev), st.Ino}, fd, size, read)
}

// truncate records the synced bytes a shrink cuts off, read with read,
// then truncates fd.
func (f *FS) truncate(id fileID, fd int, size int64, read func([]byte, int64) (int, error)) syscall.Errno {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.crashed {
		return syscall.EIO
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return gofs.ToErrno(err)
	}
	if size != st.Size {
		s := f.stateLocked(id, st.Size)
		if size < st.Size {
			if err := s.save(size, st.Size-size, read); err != nil {
				return gofs.ToErrno(err)
			}
		}
	}
	f.stats.Truncates++
	return gofs.ToErrno(syscall.Ftruncate(fd, size))
}

// file is a tracked handle on a backing file.
type file struct {
	*gofs.LoopbackFile
	fs   *FS
	id   fileID
	sync bool // opened with O_SYNC or O_DSYNC
	fd   int
}

var (
	_ gofs.FileWriter          = (*file)(nil)
	_ gofs.FileFsyncer         = (*file)(nil)
	_ gofs.FilePassthroughFder = (*file)(nil)
	_ gofs.FileAllocater       = (*file)(nil)
)

func newFile(lfs *FS, fh gofs.FileHandle, flags uint32) (*file, error) {
	lb, ok := fh.(*gofs.LoopbackFile)
	if !ok {
		return nil, fmt.Errorf("lazyfs: unexpected file handle %T", fh)
	}
	fd, ok := lb.PassthroughFd() // only reads the descriptor number
	if !ok {
		return nil, syscall.EBADF
	}
	f := &file{LoopbackFile: lb, fs: lfs, fd: fd,
		sync: flags&(syscall.O_SYNC|syscall.O_DSYNC) != 0}
	var st syscall.Stat_t
	if err := f.fstat(&st); err != nil {
		return nil, err
	}
	f.id = fileID{uint64(st.Dev), st.Ino}
	return f, nil
}

func (f *file) fstat(st *syscall.Stat_t) error { return syscall.Fstat(f.fd, st) }

// PassthroughFd refuses kernel passthrough: every write must be seen here.
func (f *file) PassthroughFd() (int, bool) { return 0, false }

// reader returns a function reading the backing file, also for a handle
// opened write-only.
func (f *file) reader() (func([]byte, int64) (int, error), func()) {
	rfd, err := syscall.Open(fmt.Sprintf("/proc/self/fd/%d", f.fd), syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return func([]byte, int64) (int, error) { return 0, err }, func() {}
	}
	return func(b []byte, off int64) (int, error) { return preadAll(rfd, b, off) }, func() { syscall.Close(rfd) }
}

// Write records the synced bytes it overwrites, then writes.
func (f *file) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.fs.crashed {
		return 0, syscall.EIO
	}
	f.fs.stats.Writes++
	if !f.sync {
		var st syscall.Stat_t
		if err := f.fstat(&st); err != nil {
			return 0, gofs.ToErrno(err)
		}
		s := f.fs.stateLocked(f.id, st.Size)
		if off < s.syncedSize {
			read, done := f.reader()
			err := s.save(off, int64(len(data)), read)
			done()
			if err != nil {
				return 0, gofs.ToErrno(err)
			}
		}
	}
	n, err := syscall.Pwrite(f.fd, data, off)
	if err != nil {
		return uint32(max(n, 0)), gofs.ToErrno(err)
	}
	if f.sync {
		f.fs.syncedLocked(f.id)
	}
	return uint32(n), 0
}

// Fsync makes the file's current content durable.
func (f *file) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.fs.crashed {
		return syscall.EIO
	}
	if err := syscall.Fdatasync(f.fd); err != nil {
		return gofs.ToErrno(err)
	}
	f.fs.syncedLocked(f.id)
	return 0
}

// Allocate is refused: its effect on a crash is not modelled, and callers
// fall back to writes.
func (f *file) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	return syscall.EOPNOTSUPP
}

func (f *file) truncate(size int64) syscall.Errno {
	read, done := f.reader()
	defer done()
	return f.fs.truncate(f.id, f.fd, size, read)
}

// preadAll reads len(b) bytes at off, or up to the end of the file.
func preadAll(fd int, b []byte, off int64) (int, error) {
	total := 0
	for total < len(b) {
		n, err := syscall.Pread(fd, b[total:], off+int64(total))
		if err != nil {
			return total, err
		}
		if n == 0 {
			break
		}
		total += n
	}
	return total, nil
}
