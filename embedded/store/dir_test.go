package store

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// The store dir tests run against real conditions: real mounts (tmpfs,
// ramfs, read-only binds), a real unprivileged user, real processes that
// hold the lock or have files open. Tests usually run as root, for whom
// permission bits prove nothing.

// storeHelperEnv selects what TestStoreDirHelperProcess does when the test
// binary is re-executed as a subprocess; storeHelperDirEnv names the dir.
const (
	storeHelperEnv    = "HOLDFAST_TEST_STOREDIR_HELPER"
	storeHelperDirEnv = "HOLDFAST_TEST_STOREDIR"
)

// TestStoreDirHelperProcess is not a test: it is the body of the
// subprocesses the store dir tests start by re-executing the test binary.
// It does nothing in a normal run.
//
//	check: run CheckDir and print its result
//	lock:  take the store lock, print "ready", hold it until stdin closes
//	open:  open a file under the dir, print "ready", keep it open until stdin closes
func TestStoreDirHelperProcess(t *testing.T) {
	mode := os.Getenv(storeHelperEnv)
	if mode == "" {
		return
	}
	dir := os.Getenv(storeHelperDirEnv)
	switch mode {
	case "check":
		if _, err := CheckDir(dir, false, 0); err != nil {
			fmt.Println("error:", err)
		} else {
			fmt.Println("ok")
		}
	case "lock":
		l, err := LockDir(dir)
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("ready")
		_, _ = io.Copy(io.Discard, os.Stdin)
		_ = l.Unlock()
	case "open":
		f, err := os.Create(filepath.Join(dir, "00000001.blk"))
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("ready")
		_, _ = io.Copy(io.Discard, os.Stdin)
		_ = f.Close()
	default:
		fmt.Println("unknown helper mode", mode)
		os.Exit(2)
	}
	os.Exit(0)
}

// storeHelperCmd returns a command that re-executes binary (the test binary
// or a copy of it) as TestStoreDirHelperProcess in the given mode.
func storeHelperCmd(t *testing.T, binary, mode, dir string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(binary, "-test.run=^TestStoreDirHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), storeHelperEnv+"="+mode, storeHelperDirEnv+"="+dir)
	cmd.Stderr = os.Stderr
	return cmd
}

// startStoreHelper starts a helper that holds something in dir until the
// test ends, and returns once it printed "ready".
func startStoreHelper(t *testing.T, mode, dir string) *exec.Cmd {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := storeHelperCmd(t, self, mode, dir)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- strings.TrimSpace(s)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case s := <-line:
		if s != "ready" {
			t.Fatalf("helper %s: %q", mode, s)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("helper %s not ready after 30s", mode)
	}
	return cmd
}

// wantStoreDirError checks that err is a one-line *DirError for path
// that unwraps to ErrDir and contains every fragment.
func wantStoreDirError(t *testing.T, err error, path string, fragments ...string) *DirError {
	t.Helper()
	if err == nil {
		t.Fatalf("store dir %s accepted, want a refusal containing %q", path, fragments)
	}
	var se *DirError
	if !errors.As(err, &se) {
		t.Fatalf("error %v (%T) is not a *DirError", err, err)
	}
	if !errors.Is(err, ErrDir) {
		t.Errorf("errors.Is(%v, ErrDir) = false", err)
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "store dir "+path+": ") {
		t.Errorf("refusal %q does not start with the path %s", msg, path)
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("refusal is not one line: %q", msg)
	}
	for _, f := range fragments {
		if !strings.Contains(msg, f) {
			t.Errorf("refusal %q does not contain %q", msg, f)
		}
	}
	return se
}

// mountFS mounts a file system of type fstype on dir and unmounts it when
// the test ends. It skips the test when mounting is not permitted.
func mountFS(t *testing.T, fstype, dir string, flags uintptr, data string) {
	t.Helper()
	if err := unix.Mount(fstype, dir, fstype, flags, data); err != nil {
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
			t.Skipf("cannot mount %s on %s: %v (needs root or CAP_SYS_ADMIN)", fstype, dir, err)
		}
		t.Fatalf("mount %s on %s: %v", fstype, dir, err)
	}
	t.Cleanup(func() { unmount(t, dir) })
}

// bindReadOnly makes dir a read-only bind mount of itself until the test
// ends.
func bindReadOnly(t *testing.T, dir string) {
	t.Helper()
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
			t.Skipf("cannot bind-mount %s: %v (needs root or CAP_SYS_ADMIN)", dir, err)
		}
		t.Fatalf("bind mount %s: %v", dir, err)
	}
	t.Cleanup(func() { unmount(t, dir) })
	if err := unix.Mount("", dir, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("remount %s read-only: %v", dir, err)
	}
}

func unmount(t *testing.T, dir string) {
	t.Helper()
	if err := unix.Unmount(dir, 0); err != nil {
		t.Errorf("unmount %s: %v (detaching it)", dir, err)
		_ = unix.Unmount(dir, unix.MNT_DETACH)
	}
}

// umask reads the process umask without changing it.
func umask(t *testing.T) os.FileMode {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Umask:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32)
			if err != nil {
				t.Fatal(err)
			}
			return os.FileMode(n)
		}
	}
	t.Fatal("no Umask in /proc/self/status")
	return 0
}

func TestCheckStoreDirCreatesMissingDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "var", "lib", "holdfast")
	res, err := CheckDir(dir, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Created || res.Path != dir {
		t.Errorf("result %+v, want Created and Path %s", res, dir)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := 0o750 &^ umask(t); !fi.IsDir() || fi.Mode().Perm() != want {
		t.Errorf("created %s with mode %v, want a directory with %v", dir, fi.Mode(), want)
	}
	// The write probe leaves nothing behind.
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("dir not empty after the check: %v", entries)
	}

	// The second time it exists.
	res, err = CheckDir(dir, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	if res.Created {
		t.Error("Created on an existing dir")
	}
}

func TestCheckStoreDirExisting(t *testing.T) {
	dir := t.TempDir()
	res, err := CheckDir(dir, false, 1)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if res.Created || res.Free <= 0 || res.FSType == "" || res.FSType == "tmpfs" {
		t.Errorf("result %+v", res)
	}
	if len(res.Warnings) != 0 {
		t.Errorf("warnings for a 1-byte max_file_store: %v", res.Warnings)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("dir not empty after the check: %v", entries)
	}
}

func TestCheckStoreDirRelativePath(t *testing.T) {
	parent := t.TempDir()
	t.Chdir(parent)
	res, err := CheckDir("holdfast-data", false, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(parent, "holdfast-data")
	if res.Path != want || !res.Created {
		t.Errorf("Path %q Created %v, want %s created", res.Path, res.Created, want)
	}
}

func TestCheckStoreDirNotADirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store")
	if err := os.WriteFile(path, []byte("not a dir"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := CheckDir(path, false, 0)
	wantStoreDirError(t, err, path, "not a directory", "jetstream.store_dir")
	// The file is left alone.
	if b, _ := os.ReadFile(path); string(b) != "not a dir" {
		t.Errorf("file changed to %q", b)
	}

	// A file in the way of a parent directory.
	_, err = CheckDir(filepath.Join(path, "sub"), false, 0)
	wantStoreDirError(t, err, filepath.Join(path, "sub"), "not a directory")
}

func TestCheckStoreDirReadOnlyMount(t *testing.T) {
	t.Run("read-only bind mount", func(t *testing.T) {
		dir := t.TempDir()
		bindReadOnly(t, dir)
		if err := os.WriteFile(filepath.Join(dir, "x"), nil, 0o600); err == nil {
			t.Fatal("the read-only mount takes writes")
		}
		_, err := CheckDir(dir, false, 0)
		wantStoreDirError(t, err, dir, "read-only file system", "remount it read-write")
	})
	t.Run("missing under a read-only mount", func(t *testing.T) {
		parent := t.TempDir()
		bindReadOnly(t, parent)
		dir := filepath.Join(parent, "store")
		_, err := CheckDir(dir, false, 0)
		wantStoreDirError(t, err, dir, "missing and cannot be created", "read-only file system")
	})
	t.Run("read-only tmpfs even when tmpfs is allowed", func(t *testing.T) {
		dir := t.TempDir()
		mountFS(t, "tmpfs", dir, unix.MS_RDONLY, "size=1m")
		_, err := CheckDir(dir, false, 0)
		wantStoreDirError(t, err, dir, "tmpfs")
		_, err = CheckDir(dir, true, 0)
		wantStoreDirError(t, err, dir, "read-only file system")
	})
}

// TestCheckStoreDirNotWritable runs the check as an unprivileged user,
// for whom a root-owned 0755 directory is really not writable.
func TestCheckStoreDirNotWritable(t *testing.T) {
	dir := t.TempDir()
	if os.Geteuid() != 0 {
		// Without root the permission bits are the real thing.
		if err := os.Chmod(dir, 0o555); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Chmod(dir, 0o755) })
		_, err := CheckDir(dir, false, 0)
		wantStoreDirError(t, err, dir, "not writable", "permission denied")
		return
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skipf("no unprivileged user to run the check as: %v", err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)

	// nobody must be able to reach the dir and run a copy of the test
	// binary (the original may sit in a private build directory).
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	binary := filepath.Join(dir, "embedded.test")
	copyFile(t, binary)

	run := func(t *testing.T, store string) string {
		t.Helper()
		cmd := storeHelperCmd(t, binary, "check", store)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("helper as %s: %v\n%s", nobody.Username, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	t.Run("existing dir", func(t *testing.T) {
		store := filepath.Join(dir, "store")
		if err := os.Mkdir(store, 0o755); err != nil {
			t.Fatal(err)
		}
		out := run(t, store)
		want := "error: store dir " + store + ": not writable: permission denied"
		if !strings.HasPrefix(out, want) || !strings.Contains(out, "chown holdfast:holdfast") {
			t.Errorf("check as nobody printed %q, want %q and the fix", out, want)
		}
	})
	t.Run("missing dir in an unwritable parent", func(t *testing.T) {
		store := filepath.Join(dir, "missing", "store")
		out := run(t, store)
		want := "error: store dir " + store + ": missing and cannot be created: permission denied"
		if !strings.HasPrefix(out, want) {
			t.Errorf("check as nobody printed %q, want %q", out, want)
		}
		if _, err := os.Stat(store); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("store created anyway: %v", err)
		}
	})
	t.Run("owned by the user", func(t *testing.T) {
		store := filepath.Join(dir, "owned")
		if err := os.Mkdir(store, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(store, uid, gid); err != nil {
			t.Fatal(err)
		}
		if out := run(t, store); out != "ok" {
			t.Errorf("check as nobody on its own dir printed %q, want ok", out)
		}
	})
}

// copyFile copies the running test binary to dst, mode 0755.
func copyFile(t *testing.T, dst string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestCheckStoreDirTmpfs(t *testing.T) {
	for _, fstype := range []string{"tmpfs", "ramfs"} {
		t.Run(fstype, func(t *testing.T) {
			dir := t.TempDir()
			data := "size=16m"
			if fstype == "ramfs" {
				data = ""
			}
			mountFS(t, fstype, dir, 0, data)
			_, err := CheckDir(dir, false, 0)
			wantStoreDirError(t, err, dir, "is on "+fstype, "loses every message at reboot", "jetstream.allow_tmpfs = true")

			res, err := CheckDir(dir, true, 0)
			if err != nil {
				t.Fatalf("allow_tmpfs = true: %v", err)
			}
			if res.FSType != fstype {
				t.Errorf("FSType = %q, want %q", res.FSType, fstype)
			}
			if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], fstype) || !strings.Contains(res.Warnings[0], "allow_tmpfs") {
				t.Errorf("warnings %q, want one that names %s and allow_tmpfs", res.Warnings, fstype)
			}
		})
	}
	t.Run("missing dir created on tmpfs is still refused", func(t *testing.T) {
		mnt := t.TempDir()
		mountFS(t, "tmpfs", mnt, 0, "size=1m")
		dir := filepath.Join(mnt, "store")
		_, err := CheckDir(dir, false, 0)
		wantStoreDirError(t, err, dir, "tmpfs")
	})
}

// TestCheckStoreDirTmpfsInside: the store dir is on a disk, but what the
// server writes lands on a tmpfs mounted or linked below it. Such a store
// served every message from memory, with "fs=ext4" in the log.
func TestCheckStoreDirTmpfsInside(t *testing.T) {
	mountAt := func(t *testing.T, fstype string, rel ...string) (dir, at string) {
		t.Helper()
		dir = t.TempDir()
		at = filepath.Join(append([]string{dir}, rel...)...)
		if err := os.MkdirAll(at, 0o750); err != nil {
			t.Fatal(err)
		}
		data := "size=1m"
		if fstype == "ramfs" {
			data = ""
		}
		mountFS(t, fstype, at, 0, data)
		return dir, at
	}
	t.Run("tmpfs on jetstream", func(t *testing.T) {
		dir, _ := mountAt(t, "tmpfs", "jetstream")
		_, err := CheckDir(dir, false, 0)
		wantStoreDirError(t, err, dir, "jetstream is on tmpfs", "loses every message at reboot", "jetstream.allow_tmpfs = true")
		_, err = InspectDir(dir, false, 0)
		wantStoreDirError(t, err, dir, "jetstream is on tmpfs")

		res, err := CheckDir(dir, true, 0)
		if err != nil {
			t.Fatalf("allow_tmpfs = true: %v", err)
		}
		if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "jetstream is on tmpfs") {
			t.Errorf("warnings %q, want one naming jetstream on tmpfs", res.Warnings)
		}
	})
	t.Run("ramfs on a stream directory", func(t *testing.T) {
		dir, _ := mountAt(t, "ramfs", "jetstream", "$G", "streams", "ORDERS")
		_, err := CheckDir(dir, false, 0)
		wantStoreDirError(t, err, dir, "jetstream/$G/streams/ORDERS is on ramfs")
	})
	t.Run("jetstream linked to a tmpfs", func(t *testing.T) {
		dir := t.TempDir()
		mnt := t.TempDir()
		mountFS(t, "tmpfs", mnt, 0, "size=1m")
		if err := os.Symlink(mnt, filepath.Join(dir, "jetstream")); err != nil {
			t.Fatal(err)
		}
		_, err := CheckDir(dir, false, 0)
		wantStoreDirError(t, err, dir, "jetstream is on tmpfs")
	})
	t.Run("state file linked to a tmpfs", func(t *testing.T) {
		dir := t.TempDir()
		mnt := t.TempDir()
		mountFS(t, "tmpfs", mnt, 0, "size=1m")
		if err := os.WriteFile(filepath.Join(mnt, StateFileName), []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(mnt, StateFileName), filepath.Join(dir, StateFileName)); err != nil {
			t.Fatal(err)
		}
		_, err := CheckDir(dir, false, 0)
		wantStoreDirError(t, err, dir, StateFileName+" is on tmpfs")
	})
	t.Run("read-only bind on jetstream", func(t *testing.T) {
		dir := t.TempDir()
		js := filepath.Join(dir, "jetstream")
		if err := os.Mkdir(js, 0o750); err != nil {
			t.Fatal(err)
		}
		bindReadOnly(t, js)
		_, err := CheckDir(dir, true, 0)
		wantStoreDirError(t, err, dir, "jetstream is on a read-only file system", "remount it read-write")
	})
	t.Run("a disk below a disk is fine", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dir, "jetstream", "$G", "streams", "ORDERS", "msgs"), 0o750); err != nil {
			t.Fatal(err)
		}
		if _, err := CheckDir(dir, false, 0); err != nil {
			t.Fatal(err)
		}
	})
}

// TestCheckStoreDirDanglingLink: the store dir is a link into a disk that
// is not mounted. `holdfast check` said "does not exist yet; run creates
// it" and run then failed with "missing and cannot be created: file
// exists"; neither named the link.
func TestCheckStoreDirDanglingLink(t *testing.T) {
	base := t.TempDir()
	target := filepath.Join(base, "mnt", "disk", "holdfast")
	if err := os.MkdirAll(filepath.Join(base, "mnt"), 0o750); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "store")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	relLink := filepath.Join(base, "data")
	if err := os.Symlink("mnt/nodisk", relLink); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, dir string
		want      []string
	}{
		{"the store dir", link, []string{"is a symbolic link to " + target + ", which does not exist", "a disk not mounted?", "mount the file system"}},
		{"a dir in its path", filepath.Join(relLink, "holdfast"), []string{"has " + relLink + " in its path, which is a symbolic link to " + filepath.Join(base, "mnt", "nodisk")}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := InspectDir(c.dir, false, 0)
			wantStoreDirError(t, err, c.dir, c.want...)
			_, err = CheckDir(c.dir, false, 0)
			wantStoreDirError(t, err, c.dir, c.want...)
			if _, err := os.Lstat(filepath.Join(base, "mnt", "disk")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the link's target was created under the mount point: %v", err)
			}
		})
	}
	t.Run("link loop", func(t *testing.T) {
		loop := filepath.Join(base, "loop")
		if err := os.Symlink("loop", loop); err != nil {
			t.Fatal(err)
		}
		_, err := CheckDir(filepath.Join(loop, "store"), false, 0)
		wantStoreDirError(t, err, filepath.Join(loop, "store"), "symbolic links form a loop")
	})
	t.Run("file in the path", func(t *testing.T) {
		file := filepath.Join(base, "file")
		if err := os.WriteFile(file, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := CheckDir(filepath.Join(file, "store"), false, 0)
		wantStoreDirError(t, err, filepath.Join(file, "store"), "a part of the path is a file")
	})
}

// TestCheckStoreDirRootOnAnotherUsersStore: root running holdfast on the
// service user's store is warned that it makes the store unusable for
// that user until a chown.
func TestCheckStoreDirRootOnAnotherUsersStore(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skipf("no other user: %v", err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	dir := t.TempDir()
	res, err := CheckDir(dir, false, 0)
	if err != nil || len(res.Warnings) != 0 {
		t.Fatalf("root's own store: %v, warnings %q", err, res.Warnings)
	}
	if err := os.Chown(dir, uid, -1); err != nil {
		t.Fatal(err)
	}
	res, err = CheckDir(dir, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "holdfast runs as root") || !strings.Contains(res.Warnings[0], "chown -R "+nobody.Username+" "+dir) {
		t.Errorf("warnings %q, want one about root on %s's store with the chown", res.Warnings, nobody.Username)
	}
	if res, err := InspectDir(dir, false, 0); err != nil || len(res.Warnings) != 0 {
		t.Errorf("holdfast check, which creates nothing: %v, warnings %q", err, res.Warnings)
	}
}

func TestCheckStoreDirLowFreeSpace(t *testing.T) {
	t.Run("disk", func(t *testing.T) {
		dir := t.TempDir()
		res, err := CheckDir(dir, false, math.MaxInt64)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "less than jetstream.max_file_store") || !strings.Contains(res.Warnings[0], dir) {
			t.Errorf("warnings %q, want one about free space", res.Warnings)
		}
	})
	t.Run("small tmpfs", func(t *testing.T) {
		dir := t.TempDir()
		mountFS(t, "tmpfs", dir, 0, "size=16m")
		res, err := CheckDir(dir, true, 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		if res.Free <= 0 || res.Free > 16<<20 {
			t.Errorf("Free = %d on a 16MiB tmpfs", res.Free)
		}
		var found bool
		for _, w := range res.Warnings {
			if strings.Contains(w, "less than jetstream.max_file_store (1.0GiB)") {
				found = true
			}
		}
		if !found {
			t.Errorf("warnings %q, want one about free space below 1.0GiB", res.Warnings)
		}
		// Enough room: no free space warning.
		res, err = CheckDir(dir, true, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Warnings) != 1 {
			t.Errorf("warnings %q, want only the tmpfs one", res.Warnings)
		}
	})
}

func TestLockStoreDirTwiceInOneProcess(t *testing.T) {
	dir := t.TempDir()
	l, err := LockDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	pid := strconv.Itoa(os.Getpid())
	if b, _ := os.ReadFile(filepath.Join(dir, LockFileName)); strings.TrimSpace(string(b)) != pid {
		t.Errorf("lock file holds %q, want %s", b, pid)
	}

	// flock is per open file description: a second open in this process
	// is refused like another process would be.
	_, err = LockDir(dir)
	se := wantStoreDirError(t, err, dir, "locked by process "+pid, "another holdfast is using it", "stop the other instance")
	if se.Holder != "process "+pid {
		t.Errorf("Holder = %q", se.Holder)
	}
	if got := LockHolder(dir); got != "process "+pid {
		t.Errorf("LockHolder = %q, want process %s", got, pid)
	}

	if err := l.Unlock(); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(); err != nil {
		t.Errorf("second Unlock: %v", err)
	}
	var nilLock *Lock
	if err := nilLock.Unlock(); err != nil {
		t.Errorf("Unlock on nil: %v", err)
	}
	if got := LockHolder(dir); got != "" {
		t.Errorf("LockHolder after Unlock = %q, want \"\"", got)
	}
	l, err = LockDir(dir)
	if err != nil {
		t.Fatalf("lock after Unlock: %v", err)
	}
	l.Unlock()
}

func TestLockStoreDirHeldByAnotherProcess(t *testing.T) {
	dir := t.TempDir()
	child := startStoreHelper(t, "lock", dir)
	pid := strconv.Itoa(child.Process.Pid)

	_, err := LockDir(dir)
	se := wantStoreDirError(t, err, dir, "locked by process "+pid)
	if se.Holder != "process "+pid {
		t.Errorf("Holder = %q, want process %s", se.Holder, pid)
	}
	if got := LockHolder(dir); got != "process "+pid {
		t.Errorf("LockHolder = %q, want process %s", got, pid)
	}

	// The kernel drops the lock when its holder dies, even by SIGKILL;
	// the PID left in the file does not block the next holdfast.
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		l, err := LockDir(dir)
		if err != nil {
			return err
		}
		return l.Unlock()
	})
	if got := LockHolder(dir); got != "" {
		t.Errorf("LockHolder after the holder died = %q", got)
	}
}

// A stock nats-server takes no lock: LockDir also refuses a directory
// in which another process has files open.
func TestLockStoreDirInUseByAnotherProcess(t *testing.T) {
	t.Run("sleep with a store file as stdin", func(t *testing.T) {
		dir := t.TempDir()
		sub := filepath.Join(dir, "jetstream", "$G", "streams", "ORDERS", "msgs")
		if err := os.MkdirAll(sub, 0o750); err != nil {
			t.Fatal(err)
		}
		f, err := os.Create(filepath.Join(sub, "1.blk"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		sleep := exec.Command("sleep", "60")
		sleep.Stdin = f
		if err := sleep.Start(); err != nil {
			t.Skipf("cannot start sleep: %v", err)
		}
		t.Cleanup(func() {
			_ = sleep.Process.Kill()
			_ = sleep.Wait()
		})
		pid := strconv.Itoa(sleep.Process.Pid)

		_, err = LockDir(dir)
		se := wantStoreDirError(t, err, dir, "in use by process "+pid+" (sleep)", "which has files open in it", "stop that process")
		if se.Holder != "process "+pid+" (sleep)" {
			t.Errorf("Holder = %q", se.Holder)
		}
		if got := LockHolder(dir); got != se.Holder {
			t.Errorf("LockHolder = %q, want %q", got, se.Holder)
		}
		// The refusal did not keep the lock.
		if err := sleep.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		_ = sleep.Wait()
		l, err := LockDir(dir)
		if err != nil {
			t.Fatalf("lock after the other process exited: %v", err)
		}
		l.Unlock()
	})
	t.Run("re-executed test binary", func(t *testing.T) {
		dir := t.TempDir()
		child := startStoreHelper(t, "open", dir)
		_, err := LockDir(dir)
		wantStoreDirError(t, err, dir, fmt.Sprintf("in use by process %d", child.Process.Pid))
	})
	t.Run("a sibling directory is not the store", func(t *testing.T) {
		parent := t.TempDir()
		dir := filepath.Join(parent, "store")
		other := filepath.Join(parent, "store-other")
		for _, d := range []string{dir, other} {
			if err := os.Mkdir(d, 0o750); err != nil {
				t.Fatal(err)
			}
		}
		startStoreHelper(t, "open", other)
		l, err := LockDir(dir)
		if err != nil {
			t.Fatalf("a process with files in %s blocks %s: %v", other, dir, err)
		}
		l.Unlock()
	})
	t.Run("through a symlink", func(t *testing.T) {
		parent := t.TempDir()
		dir := filepath.Join(parent, "disk")
		if err := os.Mkdir(dir, 0o750); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(parent, "store")
		if err := os.Symlink(dir, link); err != nil {
			t.Fatal(err)
		}
		child := startStoreHelper(t, "open", dir)
		_, err := LockDir(link)
		wantStoreDirError(t, err, link, fmt.Sprintf("in use by process %d", child.Process.Pid))
	})
	t.Run("relative path", func(t *testing.T) {
		parent := t.TempDir()
		dir := filepath.Join(parent, "store")
		if err := os.Mkdir(dir, 0o750); err != nil {
			t.Fatal(err)
		}
		child := startStoreHelper(t, "open", dir)
		t.Chdir(parent)
		_, err := LockDir("store")
		wantStoreDirError(t, err, "store", fmt.Sprintf("in use by process %d", child.Process.Pid))
	})
}

func TestLockStoreDirMissingDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "missing")
	_, err := LockDir(dir)
	wantStoreDirError(t, err, dir, "cannot open lock file "+LockFileName, "no such file or directory")
	if got := LockHolder(dir); got != "" {
		t.Errorf("LockHolder of a missing dir = %q", got)
	}
}

func TestStoreDirErrorFormat(t *testing.T) {
	tests := []struct {
		err  *DirError
		want string
	}{
		{&DirError{Path: "/d", Reason: "not a directory"}, "store dir /d: not a directory"},
		{&DirError{Path: "/d", Reason: "not writable", Err: unix.EACCES, Fix: "chown it"}, "store dir /d: not writable: permission denied (chown it)"},
		{&DirError{Path: "/d", Reason: "locked", Fix: "stop it"}, "store dir /d: locked (stop it)"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
		if !errors.Is(tt.err, ErrDir) {
			t.Errorf("%q does not unwrap to ErrDir", tt.err)
		}
	}
	if !errors.Is(tests[1].err, unix.EACCES) {
		t.Error("DirError does not unwrap to its cause")
	}
}

func TestHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0B", 1023: "1023B", 1024: "1.0KiB", 1536: "1.5KiB", 10 << 30: "10.0GiB", math.MaxInt64: "8.0EiB"} {
		if got := HumanBytes(n); got != want {
			t.Errorf("HumanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestCheckStoreDirRefusesWrongEntries: a name holdfast or the server use
// in the store dir, existing as the wrong kind of file, is refused by the
// check itself, so that `holdfast check` refuses what `holdfast run` would
// fail on later (a file named jetstream stopped the server at start; a
// directory named holdfast.lock stopped the lock).
func TestCheckStoreDirRefusesWrongEntries(t *testing.T) {
	file := func(t *testing.T, path string) {
		if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	dir := func(t *testing.T, path string) {
		if err := os.Mkdir(path, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name  string
		make  func(t *testing.T, path string)
		entry string
		want  string
	}{
		{"jetstream is a file", file, "jetstream", "jetstream is a regular file, not a directory (where nats-server keeps the streams)"},
		{"lock is a directory", dir, LockFileName, "holdfast.lock is a directory, not a regular file (holdfast's lock file)"},
		{"lock is a fifo", func(t *testing.T, path string) {
			if err := unix.Mkfifo(path, 0o600); err != nil {
				t.Fatal(err)
			}
		}, LockFileName, "holdfast.lock is a named pipe, not a regular file"},
		{"state file is a directory", dir, StateFileName, StateFileName + " is a directory, not a regular file"},
		{"peer names file is a directory", dir, PeerNamesFileName, PeerNamesFileName + " is a directory, not a regular file"},
		{"orphans is a file", file, OrphanDirName, OrphanDirName + " is a regular file, not a directory"},
		{"jetstream links to a file", func(t *testing.T, path string) {
			target := filepath.Join(t.TempDir(), "f")
			file(t, target)
			if err := os.Symlink(target, path); err != nil {
				t.Fatal(err)
			}
		}, "jetstream", "jetstream is a regular file, not a directory"},
		{"lock links nowhere", func(t *testing.T, path string) {
			if err := os.Symlink(filepath.Join(t.TempDir(), "missing", "lock"), path); err != nil {
				t.Fatal(err)
			}
		}, LockFileName, "holdfast.lock is a symbolic link that cannot be followed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := t.TempDir()
			tt.make(t, filepath.Join(store, tt.entry))
			_, err := CheckDir(store, false, 0)
			wantStoreDirError(t, err, store, tt.want, filepath.Join(store, tt.entry))
		})
	}
	t.Run("the right kinds", func(t *testing.T) {
		store := t.TempDir()
		dir(t, filepath.Join(store, "jetstream"))
		file(t, filepath.Join(store, LockFileName))
		file(t, filepath.Join(store, StateFileName))
		dir(t, filepath.Join(store, OrphanDirName))
		if _, err := CheckDir(store, false, 0); err != nil {
			t.Fatal(err)
		}
	})
}

// TestProbeLock: `holdfast check` takes the lock as run does; a lock that
// cannot be taken for a reason other than another holder is an error, not
// silence (LockHolder's "").
func TestProbeLock(t *testing.T) {
	store := t.TempDir()
	if holder, err := ProbeLock(store); holder != "" || err != nil {
		t.Fatalf("ProbeLock of a free dir = %q, %v", holder, err)
	}
	l, err := LockDir(store)
	if err != nil {
		t.Fatal(err)
	}
	// flock locks belong to the open file description: a second open in
	// this process conflicts like another process would.
	if holder, err := ProbeLock(store); holder != "process "+strconv.Itoa(os.Getpid()) || err != nil {
		t.Errorf("ProbeLock of a held dir = %q, %v, want this process and no error", holder, err)
	}
	l.Unlock()

	broken := t.TempDir()
	if err := os.Symlink(filepath.Join(t.TempDir(), "missing", "lock"), filepath.Join(broken, LockFileName)); err != nil {
		t.Fatal(err)
	}
	holder, err := ProbeLock(broken)
	if holder != "" {
		t.Errorf("holder = %q", holder)
	}
	wantStoreDirError(t, err, broken, "cannot open lock file holdfast.lock")
}
