package lazyfs

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
)

// A file system served by a child process (MountIn) rather than by the
// calling one. Every write, sync and read of the mounted files goes
// through the process that serves them: a test binary built with -race
// serving them itself spends most of its CPU instrumenting go-fuse (the
// power-loss tests of cmd/holdfast used 79 s of CPU in the test binary
// against 24 s without -race). The child is cmd/lazyfs, built without
// -race; this package's own tests still serve in-process, under -race.
//
// The protocol is a line per request on the child's stdin, answered by a
// line of JSON on its stdout: "mounted" once (or "error"), then one reply
// to each of "stats", "unsynced", "crash" and "unmount"; after "crash" and
// "unmount" the child exits. When its stdin closes (the test binary died)
// it unmounts and exits.

// reply is one line from the child.
type reply struct {
	Mounted  bool         `json:"mounted,omitempty"`
	Stats    *Stats       `json:"stats,omitempty"`
	Unsynced int          `json:"unsynced,omitempty"`
	Report   *CrashReport `json:"report,omitempty"`
	Error    string       `json:"error,omitempty"`
}

type child struct {
	helper string
	cmd    *exec.Cmd
	mu     sync.Mutex // one request at a time
	in     io.WriteCloser
	out    *bufio.Scanner
	done   bool
}

// MountIn mounts a lazy view of backing at mountpoint, as Mount does,
// served by the helper binary (cmd/lazyfs) as a child process.
func MountIn(helper, backing, mountpoint string) (*FS, error) {
	cmd := exec.Command(helper, backing, mountpoint)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("lazyfs: start %s: %w", helper, err)
	}
	c := &child{helper: helper, cmd: cmd, in: in, out: bufio.NewScanner(stdout)}
	r, err := c.read()
	if err == nil && !r.Mounted {
		err = errors.New(r.Error)
	}
	if err != nil {
		_ = in.Close()
		_ = cmd.Wait()
		return nil, fmt.Errorf("lazyfs: mount %s on %s in %s: %w", backing, mountpoint, helper, err)
	}
	return &FS{Backing: backing, Mountpoint: mountpoint, child: c}, nil
}

// Remount mounts f's backing directory at its mountpoint again (after
// Crash or Unmount), served as f was.
func (f *FS) Remount() (*FS, error) {
	if f.child != nil {
		return MountIn(f.child.helper, f.Backing, f.Mountpoint)
	}
	return Mount(f.Backing, f.Mountpoint)
}

func (c *child) read() (reply, error) {
	var r reply
	if !c.out.Scan() {
		err := c.out.Err()
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		return r, fmt.Errorf("no answer from the lazyfs process: %w", err)
	}
	if err := json.Unmarshal(c.out.Bytes(), &r); err != nil {
		return r, fmt.Errorf("lazyfs process answered %q: %w", c.out.Text(), err)
	}
	return r, nil
}

// call sends a request; after "crash" and "unmount" it waits for the
// child to exit.
func (c *child) call(req string) (reply, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		if req == "unmount" {
			return reply{}, nil
		}
		return reply{}, ErrCrashed
	}
	if _, err := io.WriteString(c.in, req+"\n"); err != nil {
		return reply{}, fmt.Errorf("lazyfs process: %w", err)
	}
	r, err := c.read()
	if err == nil && r.Error != "" {
		err = errors.New(r.Error)
	}
	if req == "crash" || req == "unmount" {
		c.done = true
		_ = c.in.Close()
		if werr := c.cmd.Wait(); werr != nil && err == nil {
			err = fmt.Errorf("lazyfs process: %w", werr)
		}
	}
	return r, err
}

// Serve is the child's side (cmd/lazyfs): it mounts backing at
// mountpoint, says so on out, and answers the requests read from in until
// "crash" or "unmount", or until in ends.
func Serve(backing, mountpoint string, in io.Reader, out io.Writer) error {
	enc := json.NewEncoder(out)
	lfs, err := Mount(backing, mountpoint)
	if err != nil {
		_ = enc.Encode(reply{Error: err.Error()})
		return err
	}
	if err := enc.Encode(reply{Mounted: true}); err != nil {
		_ = lfs.Unmount()
		return err
	}
	errText := func(err error) string {
		if err == nil {
			return ""
		}
		return err.Error()
	}
	lines := bufio.NewScanner(in)
	for lines.Scan() {
		switch req := strings.TrimSpace(lines.Text()); req {
		case "stats":
			st := lfs.Stats()
			err = enc.Encode(reply{Stats: &st})
		case "unsynced":
			err = enc.Encode(reply{Unsynced: lfs.Unsynced()})
		case "crash":
			rep, cerr := lfs.Crash()
			return errors.Join(cerr, enc.Encode(reply{Report: &rep, Error: errText(cerr)}))
		case "unmount":
			uerr := lfs.Unmount()
			return errors.Join(uerr, enc.Encode(reply{Error: errText(uerr)}))
		default:
			err = enc.Encode(reply{Error: fmt.Sprintf("unknown request %q", req)})
		}
		if err != nil {
			break
		}
	}
	// The caller is gone: leave no mount behind.
	return errors.Join(err, lfs.Unmount())
}
