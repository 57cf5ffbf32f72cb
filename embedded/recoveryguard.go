package embedded

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
)

// nats-server (v2.15.2) deletes the whole directory of a stream it fails
// to open while it recovers the store at start-up (stream.go: setupStore
// fails, stop(true) removes the directory), whatever the cause: too many
// open files, an I/O error, a file it may not open. It skips a stream
// whose meta file it cannot read, and holdfast's data-loss check then
// found it vanished and moved it aside. Measured with 40 streams and
// `ulimit -n 12`: 3 stream directories deleted and 25 moved aside by one
// start, all of them intact before it.
//
// So before the server starts, holdfast hard-links every file of every
// stream directory into RecoveryLinksDirName (no data is copied), and
// once the server is ready it puts back what the server deleted. A
// failure that comes from the host (StreamLoadFailure.Environmental)
// stops the start-up with the data in place; another one (a damaged
// stream) leaves the deleted stream's files in holdfast-orphans for the
// data-loss check to report.

// RecoveryLinksDirName is the directory in the store dir that holds hard
// links to the streams' files while the server recovers them.
const RecoveryLinksDirName = "holdfast-recovery-links"

// recoveryGuard is the set of stream directories linked before a start.
type recoveryGuard struct {
	storeDir string
	dir      string
	streams  []string // <account>/streams/<stream>, relative to jetstream/ and to dir
}

// guardStreams links every stream directory of the store's JetStream
// directory into RecoveryLinksDirName. What an earlier start left there
// (killed while the server recovered) is dealt with first: a stream the
// server deleted then is put back. It returns nil when there is nothing to
// guard or linking is impossible (logged: the start goes on unguarded).
func guardStreams(storeDir string, log *slog.Logger) (*recoveryGuard, error) {
	g := &recoveryGuard{storeDir: storeDir, dir: filepath.Join(storeDir, RecoveryLinksDirName)}
	if _, err := os.Lstat(g.dir); err == nil {
		left, err := listGuarded(g.dir)
		if err != nil {
			return nil, err
		}
		g.streams = left
		restored, err := g.putBack(g.live)
		if err != nil {
			return nil, err
		}
		if len(restored) > 0 {
			log.Warn("stream directories deleted by the server during an interrupted start-up were put back from "+RecoveryLinksDirName,
				"streams", restored)
		}
		g.streams = nil
	}
	jsDir := filepath.Join(storeDir, "jetstream")
	streams, err := listGuarded(jsDir)
	if err != nil || len(streams) == 0 {
		return nil, err
	}
	for _, rel := range streams {
		if err := linkTree(filepath.Join(jsDir, rel), filepath.Join(g.dir, rel)); err != nil {
			log.Warn("cannot link the streams' files before the server recovers them: a stream the server fails to open is not kept",
				"err", err)
			_ = os.RemoveAll(g.dir)
			return nil, nil
		}
	}
	if err := syncDir(storeDir); err != nil {
		return nil, err
	}
	g.streams = streams
	return g, nil
}

// listGuarded lists <account>/streams/<stream> under root.
func listGuarded(root string) ([]string, error) {
	accounts, err := storeAccounts(root)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, a := range accounts {
		names, err := accountStreams(filepath.Join(root, a))
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

func (g *recoveryGuard) live(rel string) string {
	return filepath.Join(g.storeDir, "jetstream", rel)
}

// putBack moves every guarded stream whose directory is gone to dest(rel),
// and removes the guard. It returns the streams it moved.
func (g *recoveryGuard) putBack(dest func(rel string) string) ([]string, error) {
	if g.dir == "" {
		return nil, nil
	}
	var moved []string
	for _, rel := range g.streams {
		if _, err := os.Lstat(g.live(rel)); !errors.Is(err, fs.ErrNotExist) {
			continue // still there (or not ours to judge)
		}
		to := dest(rel)
		if err := os.MkdirAll(filepath.Dir(to), 0o750); err != nil {
			return moved, err
		}
		if err := os.Rename(filepath.Join(g.dir, rel), to); err != nil {
			return moved, fmt.Errorf("cannot put back stream directory %s: %w", rel, err)
		}
		moved = append(moved, rel)
		if err := syncDir(filepath.Dir(to)); err != nil {
			return moved, err
		}
	}
	// What is left are links to files the server has open: removing
	// them may fail like the server did (too many open files); the next
	// start removes them.
	if err := os.RemoveAll(g.dir); err != nil {
		return moved, fmt.Errorf("%w: %w", errGuardLeft, err)
	}
	return moved, syncDir(g.storeDir)
}

// errGuardLeft: the links could not all be removed; the next start does.
var errGuardLeft = errors.New("cannot remove " + RecoveryLinksDirName + " (the next start removes it)")

// finish is called once the server recovered the store. A stream the
// server deleted for a reason of the host is put back in place and the
// start-up fails; one deleted for another reason goes to holdfast-orphans
// (rescued: the data-loss check reports the stream vanished, with where
// its files are). It returns the orphans by stream name.
func (g *recoveryGuard) finish(failures map[string]StreamLoadFailure, log *slog.Logger) (map[string]string, error) {
	if g == nil {
		// Nothing linked (no streams, or linking failed): what the server
		// deleted is gone, but nothing must be created over or moved
		// away from what a host problem kept it from loading.
		g = &recoveryGuard{}
	}
	env := false
	for _, f := range failures {
		env = env || f.Environmental()
	}
	rescued := map[string]string{}
	at := time.Now().UTC().Format("20060102T150405Z")
	moved, err := g.putBack(func(rel string) string {
		name := filepath.Base(rel)
		if env {
			return g.live(rel)
		}
		account := filepath.Base(filepath.Dir(filepath.Dir(rel)))
		dest := filepath.Join(g.storeDir, OrphanDirName, fmt.Sprintf("%s.%s.%s.deleted-by-server", account, name, at))
		rescued[name] = dest
		return dest
	})
	if errors.Is(err, errGuardLeft) && !env {
		log.Warn("the links to the streams' files stay until the next start: removed blocks keep their disk space until then", "err", err)
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
			what = fmt.Sprintf("the server deleted %s and holdfast put it back; the data is in place", strings.Join(moved, ", "))
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

// noteLoadFailure records a stream or consumer the server says it could
// not load (nats-server v2.15.2, jetstream.go's wording).
func (l *serverLogger) noteLoadFailure(format string, v []any) {
	var name string
	switch format {
	case "  Error recreating stream %q: %v":
		name, _ = v[0].(string)
	case "  Error reading metafile %q: %v", "  Error reading Stream metafile checksum %q: %v":
		if p, ok := v[0].(string); ok {
			name = filepath.Base(filepath.Dir(p))
		}
	case "    Error adding consumer '%s > %s > %s': %v":
		name = fmt.Sprintf("%v > %v", v[1], v[2])
	default:
		return
	}
	if name == "" || len(v) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.loadFailures == nil {
		l.loadFailures = map[string]StreamLoadFailure{}
	}
	l.loadFailures[name] = StreamLoadFailure{Name: name, Err: fmt.Sprint(v[len(v)-1])}
}

// LoadFailures returns what noteLoadFailure recorded.
func (l *serverLogger) LoadFailures() map[string]StreamLoadFailure {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]StreamLoadFailure, len(l.loadFailures))
	for k, f := range l.loadFailures {
		out[k] = f
	}
	return out
}
