package lazyfs

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// mountT mounts a fresh lazy file system and unmounts it when the test
// ends. It skips the test where FUSE is not available.
func mountT(t *testing.T) *FS {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	backing, mnt := t.TempDir(), t.TempDir()
	lfs, err := Mount(backing, mnt)
	if err != nil {
		if os.Geteuid() != 0 {
			t.Skipf("cannot mount FUSE as non-root: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lfs.Unmount(); err != nil {
			t.Error(err)
		}
	})
	return lfs
}

// remount crashes lfs and mounts its backing dir again.
func crashAndRemount(t *testing.T, lfs *FS) (*FS, CrashReport) {
	t.Helper()
	rep, err := lfs.Crash()
	if err != nil {
		t.Fatalf("crash: %v", err)
	}
	again, err := lfs.Remount()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = again.Unmount() })
	return again, rep
}

func writeFile(t *testing.T, path string, flag int, data []byte, off int64, sync bool) {
	t.Helper()
	f, err := os.OpenFile(path, flag, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if data != nil {
		if _, err := f.WriteAt(data, off); err != nil {
			t.Fatal(err)
		}
	}
	if sync {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
}

func wantContent(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s after crash: %q (%d bytes), want %q (%d bytes)", filepath.Base(path), got, len(got), want, len(want))
	}
}

func TestSyncedBytesSurviveUnsyncedAppendIsDropped(t *testing.T) {
	lfs := mountT(t)
	p := filepath.Join(lfs.Mountpoint, "log")
	writeFile(t, p, os.O_CREATE|os.O_WRONLY, []byte("synced"), 0, true)
	writeFile(t, p, os.O_WRONLY, []byte("-lost"), 6, false)
	wantContent(t, p, []byte("synced-lost")) // visible before the crash

	lfs, rep := crashAndRemount(t, lfs)
	wantContent(t, filepath.Join(lfs.Mountpoint, "log"), []byte("synced"))
	if rep.Files != 1 || rep.BytesDropped != 5 {
		t.Errorf("report %+v, want 1 file, 5 bytes dropped", rep)
	}
}

func TestUnsyncedOverwriteIsUndone(t *testing.T) {
	lfs := mountT(t)
	p := filepath.Join(lfs.Mountpoint, "f")
	writeFile(t, p, os.O_CREATE|os.O_WRONLY, []byte("aaaaaaaaaa"), 0, true)
	writeFile(t, p, os.O_WRONLY, []byte("BBBB"), 3, false)
	writeFile(t, p, os.O_WRONLY, []byte("CCCCCCCC"), 6, false) // overlaps and extends
	lfs, _ = crashAndRemount(t, lfs)
	wantContent(t, filepath.Join(lfs.Mountpoint, "f"), []byte("aaaaaaaaaa"))
}

func TestUnsyncedTruncateIsUndone(t *testing.T) {
	lfs := mountT(t)
	p := filepath.Join(lfs.Mountpoint, "f")
	writeFile(t, p, os.O_CREATE|os.O_WRONLY, []byte("0123456789"), 0, true)
	if err := os.Truncate(p, 4); err != nil { // by path
		t.Fatal(err)
	}
	writeFile(t, p, os.O_WRONLY, []byte("xy"), 2, false) // rewrite inside, then
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1); err != nil { // through a handle
		t.Fatal(err)
	}
	f.Close()
	writeFile(t, p, os.O_WRONLY|os.O_TRUNC, []byte("new"), 0, false) // O_TRUNC open
	wantContent(t, p, []byte("new"))
	lfs, _ = crashAndRemount(t, lfs)
	wantContent(t, filepath.Join(lfs.Mountpoint, "f"), []byte("0123456789"))
}

func TestSyncAfterChangesKeepsThem(t *testing.T) {
	lfs := mountT(t)
	p := filepath.Join(lfs.Mountpoint, "f")
	writeFile(t, p, os.O_CREATE|os.O_WRONLY, []byte("0123456789"), 0, true)
	if err := os.Truncate(p, 3); err != nil {
		t.Fatal(err)
	}
	writeFile(t, p, os.O_WRONLY, []byte("abc"), 3, true)
	writeFile(t, p, os.O_WRONLY, []byte("zzz"), 6, false)
	lfs, _ = crashAndRemount(t, lfs)
	wantContent(t, filepath.Join(lfs.Mountpoint, "f"), []byte("012abc"))
}

func TestNeverSyncedFileIsEmptyButExists(t *testing.T) {
	lfs := mountT(t)
	dir := filepath.Join(lfs.Mountpoint, "d")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// The write-to-temp-and-rename pattern without fsync, as ext4 may
	// leave it: the new name, no content.
	tmp := filepath.Join(dir, "meta.inf.tmp")
	writeFile(t, tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, []byte(`{"name":"ORDERS"}`), 0, false)
	if err := os.Rename(tmp, filepath.Join(dir, "meta.inf")); err != nil {
		t.Fatal(err)
	}
	lfs, _ = crashAndRemount(t, lfs)
	wantContent(t, filepath.Join(lfs.Mountpoint, "d", "meta.inf"), []byte{})
}

func TestSyncedRenamedFileKeepsContent(t *testing.T) {
	lfs := mountT(t)
	tmp := filepath.Join(lfs.Mountpoint, "state.tmp")
	writeFile(t, tmp, os.O_CREATE|os.O_WRONLY|os.O_EXCL, []byte("v1"), 0, true)
	if err := os.Rename(tmp, filepath.Join(lfs.Mountpoint, "state")); err != nil {
		t.Fatal(err)
	}
	lfs, _ = crashAndRemount(t, lfs)
	wantContent(t, filepath.Join(lfs.Mountpoint, "state"), []byte("v1"))
}

func TestOSyncWritesSurvive(t *testing.T) {
	lfs := mountT(t)
	p := filepath.Join(lfs.Mountpoint, "blk")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND|syscall.O_SYNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"one ", "two ", "three"} {
		if _, err := f.WriteString(s); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	lfs, _ = crashAndRemount(t, lfs)
	wantContent(t, filepath.Join(lfs.Mountpoint, "blk"), []byte("one two three"))
}

func TestFilesBeforeMountAreDurable(t *testing.T) {
	backing, mnt := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(backing, "old"), []byte("old data"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	lfs, err := Mount(backing, mnt)
	if err != nil {
		t.Skipf("cannot mount: %v", err)
	}
	t.Cleanup(func() { _ = lfs.Unmount() })
	writeFile(t, filepath.Join(mnt, "old"), os.O_WRONLY, []byte(" and new"), 8, false)
	if _, err := lfs.Crash(); err != nil {
		t.Fatal(err)
	}
	wantContent(t, filepath.Join(backing, "old"), []byte("old data"))
}

func TestWritesFailAfterCrash(t *testing.T) {
	lfs := mountT(t)
	p := filepath.Join(lfs.Mountpoint, "f")
	writeFile(t, p, os.O_CREATE|os.O_WRONLY, []byte("x"), 0, true)
	lfs.mu.Lock()
	lfs.crashed = true // the moment of the power cut, before the unmount
	lfs.mu.Unlock()
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte("y"), 1); err == nil {
		t.Fatal("write after crash succeeded")
	}
}

func TestStatsAndUnsynced(t *testing.T) {
	lfs := mountT(t)
	p := filepath.Join(lfs.Mountpoint, "f")
	writeFile(t, p, os.O_CREATE|os.O_WRONLY, []byte("a"), 0, false)
	if n := lfs.Unsynced(); n != 1 {
		t.Errorf("unsynced = %d, want 1", n)
	}
	writeFile(t, p, os.O_WRONLY, nil, 0, true)
	if n := lfs.Unsynced(); n != 0 {
		t.Errorf("unsynced after fsync = %d, want 0", n)
	}
	if st := lfs.Stats(); st.Writes < 1 || st.Syncs < 1 {
		t.Errorf("stats %+v", st)
	}
}

// The same file system served by cmd/lazyfs as a child process: its
// answers, its crash, a remount served the same way, and no mount left
// behind when the caller goes away without a word.
func TestChildProcess(t *testing.T) {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	if os.Geteuid() != 0 {
		t.Skip("mounts FUSE: run as root")
	}
	helper := filepath.Join(t.TempDir(), "lazyfs")
	if out, err := exec.Command("go", "build", "-o", helper, "./cmd/lazyfs").CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/lazyfs: %v\n%s", err, out)
	}
	lfs, err := MountIn(helper, t.TempDir(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(lfs.Mountpoint, "log")
	writeFile(t, p, os.O_CREATE|os.O_WRONLY, []byte("synced"), 0, true)
	writeFile(t, p, os.O_WRONLY, []byte("-lost"), 6, false)
	if n := lfs.Unsynced(); n != 1 {
		t.Errorf("unsynced = %d, want 1", n)
	}
	if st := lfs.Stats(); st.Writes != 2 || st.Syncs != 1 {
		t.Errorf("stats %+v, want 2 writes, 1 sync", st)
	}
	rep, err := lfs.Crash()
	if err != nil {
		t.Fatal(err)
	}
	if rep.Files != 1 || rep.BytesDropped != 5 {
		t.Errorf("report %+v, want 1 file, 5 bytes dropped", rep)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Errorf("after the crash: %v, want the mount gone", err)
	}
	again, err := lfs.Remount()
	if err != nil {
		t.Fatal(err)
	}
	wantContent(t, filepath.Join(again.Mountpoint, "log"), []byte("synced"))
	if again.child == nil {
		t.Fatal("remounted in this process, not in a child")
	}
	// The caller dies: the child unmounts and exits.
	_ = again.child.in.Close()
	if err := again.child.cmd.Wait(); err != nil {
		t.Fatalf("the child, its stdin closed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(again.Mountpoint, "log")); !os.IsNotExist(err) {
		t.Fatalf("the mount outlived its child: %v", err)
	}
}

// A mount namespace made while the file system is mounted (the install
// test's container, booted beside the power-loss tests) keeps a copy of
// the mount, and with it the FUSE connection, until it goes: a crash
// must not wait for that. It waited for the namespace's end (minutes
// in CI, 60 s here).
func TestCrashWhileAnotherNamespaceHoldsTheMount(t *testing.T) {
	lfs := mountT(t)
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("no unshare (util-linux)")
	}
	writeFile(t, filepath.Join(lfs.Mountpoint, "f"), os.O_CREATE|os.O_WRONLY, []byte("synced"), 0, true)
	ns := exec.Command(unshare, "--mount", "--propagation", "unchanged", "sleep", "60")
	if err := ns.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = ns.Process.Kill()
		_ = ns.Wait()
	}()
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Skip("no /proc/self/ns/mnt:", err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		other, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", ns.Process.Pid))
		info, _ := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", ns.Process.Pid))
		if other != "" && other != self && bytes.Contains(info, []byte(lfs.Mountpoint)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("unshare made no mount namespace holding the mount")
		}
	}
	done := make(chan error, 1)
	go func() {
		_, err := lfs.Crash()
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the crash waits for the other mount namespace to go")
	}
	wantContent(t, filepath.Join(lfs.Backing, "f"), []byte("synced"))
}
