package store

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// nats-server deletes the whole directory of a stream it fails to open
// while it recovers the store at start-up, whatever the cause: too many
// open files, an I/O error, a file it may not open. It skips a stream
// whose meta file it cannot read, which holdfast's data-loss check would
// then find vanished and move aside, though its files are intact.
//
// So before the server starts, holdfast hard-links every file of every
// stream directory into RecoveryLinksDirName (no data is copied), and
// once the server is ready it puts back what the server deleted. A
// failure that comes from the host (StreamLoadFailure.Environmental)
// stops the start-up with the data in place; another one (a damaged
// stream) leaves the deleted stream's files in holdfast-orphans for the
// data-loss check to report.

// RecoveryGuard is the set of stream directories linked before a start.
type RecoveryGuard struct {
	storeDir string
	dir      string
	streams  []string // <account>/streams/<stream>, relative to jetstream/ and to dir
	left     bool     // Finish could not remove dir: the server's recorder retries
}

// LeftDir is the links directory Finish could not remove, or "".
func (g *RecoveryGuard) LeftDir() string {
	if g == nil || !g.left {
		return ""
	}
	return g.dir
}

// GuardStreams links every stream directory of the store's JetStream
// directory into RecoveryLinksDirName, but those in converting (the
// server converts them to encrypted, or to another cipher, at this start:
// their copies keep them, see CopyClearStreams). What an earlier start
// left there (killed while the server recovered) is dealt with first: a
// stream the server deleted then is put back. It returns nil when there is
// nothing to guard or linking is impossible (logged: the start goes on
// unguarded), and, by name, the streams that earlier start had lost after
// its server was ready (see Ready), each with where its files are kept.
//
// A converted stream must not be guarded: the server rewrites its message
// blocks in place (the links see the new cipher) and replaces its key
// files (the links keep the old ones), so links put back after a kill
// would hold a stream no key opens.
func GuardStreams(storeDir string, converting []string, log *slog.Logger) (*RecoveryGuard, map[string]string, error) {
	g := &RecoveryGuard{storeDir: storeDir, dir: filepath.Join(storeDir, RecoveryLinksDirName)}
	if err := os.RemoveAll(g.trash()); err != nil {
		return nil, nil, fmt.Errorf("cannot remove %s: %w", g.trash(), err)
	}
	rescued := map[string]string{}
	if _, err := os.Lstat(g.dir); err == nil {
		left, err := listGuarded(g.dir)
		if err != nil {
			return nil, nil, err
		}
		g.streams = left
		if _, err := os.Lstat(filepath.Join(g.dir, readyMark)); err == nil {
			// Killed after the server was ready: it had recovered every
			// stream, and its clients may have changed them since
			// (blocks removed, new ones written), so the links are no
			// stream as it is now. Only one the server half deleted
			// (without its metadata it never loaded, so no client wrote
			// to it) is put back. A stream gone since is kept aside,
			// never put back: a client may have deleted it.
			moved, err := g.restore(func(rel string, replaced bool) string {
				if replaced {
					return g.live(rel)
				}
				return g.orphan(rel, rescued)
			}, g.unloaded)
			if err != nil {
				return nil, nil, err
			}
			if len(rescued) > 0 {
				log.Warn("streams gone after the server was ready, in a start interrupted then: their files are kept in "+OrphanDirName,
					"orphans", rescued)
			}
			if len(moved) > len(rescued) {
				log.Warn("stream directories the server of an interrupted start-up had half deleted were put back from "+RecoveryLinksDirName,
					"streams", moved)
			}
		} else {
			// Killed before the server was ready: a directory it deleted,
			// or half deleted (a file of the links missing), is put back.
			restored, err := g.restore(func(rel string, _ bool) string { return g.live(rel) }, g.halfDeleted)
			if err != nil {
				return nil, nil, err
			}
			if len(restored) > 0 {
				log.Warn("stream directories deleted by the server during an interrupted start-up were put back from "+RecoveryLinksDirName,
					"streams", restored)
			}
		}
		g.streams = nil
	}
	jsDir := filepath.Join(storeDir, "jetstream")
	all, err := listGuarded(jsDir)
	if err != nil {
		return nil, nil, err
	}
	var streams []string
	for _, rel := range all {
		if !slices.Contains(converting, filepath.Join(jsDir, rel)) {
			streams = append(streams, rel)
		}
	}
	if len(streams) == 0 {
		return nil, rescued, nil
	}
	for _, rel := range streams {
		if err := linkTree(filepath.Join(jsDir, rel), filepath.Join(g.dir, rel)); err != nil {
			log.Warn("cannot link the streams' files before the server recovers them: a stream the server fails to open is not kept",
				"err", err)
			_ = os.RemoveAll(g.dir)
			return nil, rescued, nil
		}
	}
	if err := SyncDir(storeDir); err != nil {
		return nil, nil, err
	}
	g.streams = streams
	return g, rescued, nil
}

// readyMark, in the links directory, says the server was ready.
const readyMark = "SERVER-READY"

// Ready marks the links once the server is ready, before anything else
// runs: from then on clients may change the streams (remove blocks, write
// new ones), and links put back after a kill would lose what they wrote.
func (g *RecoveryGuard) Ready() error {
	if g == nil {
		return nil
	}
	f, err := os.OpenFile(filepath.Join(g.dir, readyMark), os.O_CREATE|os.O_WRONLY, 0o640)
	if err != nil {
		return fmt.Errorf("cannot mark %s: %w", g.dir, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("cannot mark %s: %w", g.dir, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("cannot mark %s: %w", g.dir, err)
	}
	return SyncDir(g.dir)
}

// unloaded reports whether a guarded stream's directory lost its
// metadata: the server half deleted it and never loaded it.
func (g *RecoveryGuard) unloaded(rel string) bool {
	_, linked := os.Lstat(filepath.Join(g.dir, rel, server.JetStreamMetaFile))
	_, live := os.Lstat(filepath.Join(g.live(rel), server.JetStreamMetaFile))
	return linked == nil && errors.Is(live, fs.ErrNotExist)
}

// orphan is where the links of a stream deleted at a start are kept,
// noted in rescued by stream name.
func (g *RecoveryGuard) orphan(rel string, rescued map[string]string) string {
	name := filepath.Base(rel)
	account := filepath.Base(filepath.Dir(filepath.Dir(rel)))
	base := filepath.Join(g.storeDir, OrphanDirName, fmt.Sprintf("%s.%s.%s.deleted-by-server", account, name, time.Now().UTC().Format("20060102T150405Z")))
	dest := base
	for i := 1; ; i++ {
		if _, err := os.Lstat(dest); errors.Is(err, fs.ErrNotExist) {
			break
		}
		dest = fmt.Sprintf("%s.%d", base, i)
	}
	rescued[name] = dest
	return dest
}

// listGuarded lists <account>/streams/<stream> under root.
func listGuarded(root string) ([]string, error) {
	accounts, err := Accounts(root)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, a := range accounts {
		names, err := AccountStreams(filepath.Join(root, a))
		if err != nil {
			return nil, err
		}
		for _, n := range names {
			out = append(out, filepath.Join(a, "streams", n))
		}
	}
	return out, nil
}

// linkTree recreates the directories of src under dst and hard-links its
// files.
func linkTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o750)
		case d.Type().IsRegular():
			return os.Link(p, target)
		}
		return nil
	})
}

// halfDeleted reports whether a file linked before the start is missing
// from the stream's directory.
func (g *RecoveryGuard) halfDeleted(rel string) bool {
	half := false
	_ = filepath.WalkDir(filepath.Join(g.dir, rel), func(p string, d fs.DirEntry, err error) error {
		if err != nil || half || !d.Type().IsRegular() {
			return nil
		}
		sub, rerr := filepath.Rel(filepath.Join(g.dir, rel), p)
		if rerr != nil {
			return nil
		}
		if _, serr := os.Lstat(filepath.Join(g.live(rel), sub)); errors.Is(serr, fs.ErrNotExist) {
			half = true
			return filepath.SkipAll
		}
		return nil
	})
	return half
}

func (g *RecoveryGuard) live(rel string) string {
	return filepath.Join(g.storeDir, "jetstream", rel)
}

// restore moves every guarded stream whose directory is gone to
// dest(rel, false), and removes the guard. It also replaces the
// directories of the streams replace names (dest(rel, true) is then where
// the links go), which exist but may have been half deleted: the server
// removes a stream's files under the same limit that made it fail
// (meta.inf gone, blocks left, so the next start skips the stream). The
// half one goes with the links into the trash. It returns the streams it
// moved.
func (g *RecoveryGuard) restore(dest func(rel string, replaced bool) string, replace func(rel string) bool) ([]string, error) {
	if g.dir == "" {
		return nil, nil
	}
	var moved []string
	for _, rel := range g.streams {
		_, err := os.Lstat(g.live(rel))
		replaced := !errors.Is(err, fs.ErrNotExist)
		if replaced {
			if !replace(rel) {
				continue // still there (or not ours to judge)
			}
			half := filepath.Join(g.dir, "replaced", rel)
			if err := os.MkdirAll(filepath.Dir(half), 0o750); err != nil {
				return moved, err
			}
			if err := os.Rename(g.live(rel), half); err != nil {
				return moved, fmt.Errorf("cannot move the half deleted stream directory %s aside: %w", rel, err)
			}
		}
		to := dest(rel, replaced)
		if err := os.MkdirAll(filepath.Dir(to), 0o750); err != nil {
			return moved, err
		}
		if err := os.Rename(filepath.Join(g.dir, rel), to); err != nil {
			return moved, fmt.Errorf("cannot put back stream directory %s: %w", rel, err)
		}
		moved = append(moved, rel)
		if err := SyncDir(filepath.Dir(to)); err != nil {
			return moved, err
		}
	}
	// What is left are links to files the server has open. Renamed
	// first (no file descriptor needed), so that links a later start
	// finds are never taken for a start killed during recovery: a stream
	// deleted while running must not come back. Removing them may fail
	// like the server did (too many open files): retried while running,
	// and by the next start.
	if err := os.Rename(g.dir, g.trash()); err != nil {
		return moved, fmt.Errorf("%w: %w", errGuardLeft, err)
	}
	if err := os.RemoveAll(g.trash()); err != nil {
		g.dir = g.trash()
		return moved, fmt.Errorf("%w: %w", errGuardLeft, err)
	}
	return moved, SyncDir(g.storeDir)
}

// trash is where the links go once they are no longer needed.
func (g *RecoveryGuard) trash() string {
	return filepath.Join(g.storeDir, RecoveryLinksDirName+".done")
}

// errGuardLeft: the links could not all be removed; the next start does.
var errGuardLeft = errors.New("cannot remove " + RecoveryLinksDirName + " (the next start removes it)")

// Finish is called once the server recovered the store. A stream the
// server deleted for a reason of the host is put back in place and the
// start-up fails; one deleted for another reason goes to holdfast-orphans
// (rescued: the data-loss check reports the stream vanished, with where
// its files are). It returns the orphans by stream name.
func (g *RecoveryGuard) Finish(failures map[string]StreamLoadFailure, log *slog.Logger) (map[string]string, error) {
	if g == nil {
		// Nothing linked (no streams, or linking failed): what the server
		// deleted is gone, but nothing must be created over or moved
		// away from what a host problem kept it from loading.
		g = &RecoveryGuard{}
	}
	env := false
	for _, f := range failures {
		env = env || f.Environmental()
	}
	rescued := map[string]string{}
	// With a host failure, every stream the server failed on (or on one
	// of its consumers) is put back as it was before the start.
	failed := map[string]bool{}
	for name := range failures {
		stream, _, _ := strings.Cut(name, " > ")
		failed[stream] = true
	}
	moved, err := g.restore(func(rel string, _ bool) string {
		if env {
			return g.live(rel)
		}
		return g.orphan(rel, rescued)
	}, func(rel string) bool { return env && failed[filepath.Base(rel)] })
	if errors.Is(err, errGuardLeft) && !env {
		log.Warn("the links to the streams' files could not be removed yet: removed blocks keep their disk space until they are (retried every second)", "err", err)
		g.left = true
		err = nil
	}
	if err != nil && !env {
		return nil, err
	}
	if env {
		var names []string
		for name, f := range failures {
			names = append(names, fmt.Sprintf("%s (%s)", name, f.Err))
		}
		slices.Sort(names)
		what := "their data is left in place"
		if len(moved) > 0 {
			what = fmt.Sprintf("holdfast put %s back as it was before this start (the server deletes what it fails to open)", strings.Join(moved, ", "))
		}
		return nil, fmt.Errorf("nats-server could not load %s at start-up because of the host: %s. holdfast stops before anything is created over them: fix the cause (file permissions, open files limit, the disk) and start again",
			strings.Join(names, "; "), what)
	}
	for name := range rescued {
		if !slices.ContainsFunc(moved, func(rel string) bool { return filepath.Base(rel) == name }) {
			delete(rescued, name)
		}
	}
	return rescued, nil
}

// StreamLoadFailure is a stream (or consumer, "STREAM > CONSUMER") the
// server logged it could not load while it recovered the store.
type StreamLoadFailure struct {
	Name string
	Err  string
}

// hostErrors are what an error from the host, not from a damaged store,
// says (strerror texts, and the server's own write probe).
var hostErrors = []string{"too many open files", "permission denied", "operation not permitted",
	"input/output error", "cannot allocate memory", "no space left on device", "read-only file system",
	"storage directory is not writable", "disk quota exceeded"}

// Environmental reports whether the failure comes from the host (limits,
// permissions, the disk), so that a later start can load the stream.
func (f StreamLoadFailure) Environmental() bool {
	e := strings.ToLower(f.Err)
	return slices.ContainsFunc(hostErrors, func(h string) bool { return strings.Contains(e, h) })
}
