package store

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"
)

// ErrDataLoss is the sentinel a start-up refused for lost data unwraps to.
var ErrDataLoss = errors.New("data loss detected at start-up")

// DataLoss is one difference between the recorded state and the store.
type DataLoss struct {
	Stream   string
	Consumer string // set for a consumer that vanished or went backwards
	// Vanished: the stream (or consumer) is not on the server any more.
	Vanished bool
	// RecordedLast and FoundLast are the stream's last sequences (for a
	// consumer: its ack floors) recorded and found now.
	RecordedLast, FoundLast uint64
	// Messages is how many acknowledged messages are gone at least
	// (RecordedLast - FoundLast, or RecordedLast for a vanished stream).
	Messages uint64
	// Recreated: the stream found is another one of the same name (created
	// at another time) than the one recorded.
	Recreated bool
	// ByCluster: a cluster node found the stream vanished or recreated.
	// The meta group deleted or replaced it, by an operator's decision
	// while this node was down or through a loss of the whole cluster:
	// one node cannot tell which, so it reports and never refuses.
	ByCluster bool
	// MovedTo is where the orphaned data directory of a vanished stream
	// was moved, if it was.
	MovedTo string
}

// Lost reports whether a stream lost data: it vanished, or acknowledged
// messages are gone. A consumer that lost its position only redelivers,
// and a stream the cluster deleted or replaced is reported, not lost.
func (d DataLoss) Lost() bool {
	return d.Consumer == "" && !d.ByCluster && (d.Vanished || d.Messages > 0)
}

func (d DataLoss) String() string {
	if d.Consumer != "" {
		if d.Vanished {
			return fmt.Sprintf("consumer %s on stream %s vanished (its ack floor was %d): it is created anew and the stream's messages are delivered again", d.Consumer, d.Stream, d.RecordedLast)
		}
		return fmt.Sprintf("consumer %s on stream %s went back from ack floor %d to %d: %d messages are delivered again", d.Consumer, d.Stream, d.RecordedLast, d.FoundLast, d.RecordedLast-d.FoundLast)
	}
	if d.ByCluster {
		what := "is not in the cluster any more"
		if d.Recreated {
			what = fmt.Sprintf("was created anew in the cluster (last sequence %d recorded, %d found)", d.RecordedLast, d.FoundLast)
		}
		return fmt.Sprintf("stream %s %s: deleted while this node was down, or lost by the whole cluster (a jetstream.sync interval and a power cut of most nodes); "+
			"this node cannot tell which: the other nodes' logs at their start-up say if it was lost", d.Stream, what)
	}
	var s string
	if d.Vanished {
		s = fmt.Sprintf("stream %s vanished with every message it held (it was recorded at last sequence %d; messages stored after that record are gone too)", d.Stream, d.RecordedLast)
	} else {
		s = fmt.Sprintf("stream %s went backwards: last sequence %d recorded, %d found, at least %d acknowledged messages (sequences %d-%d) are lost",
			d.Stream, d.RecordedLast, d.FoundLast, d.Messages, d.FoundLast+1, d.RecordedLast)
	}
	if d.MovedTo != "" {
		s += "; its data directory was moved to " + d.MovedTo
	}
	return s
}

// DataLossError refuses a start-up (jetstream.on_data_loss = "refuse")
// and says how to accept the loss.
type DataLossError struct {
	Losses    []DataLoss
	StateFile string
}

func (e *DataLossError) Error() string {
	var parts []string
	for _, l := range e.Losses {
		if l.Lost() {
			parts = append(parts, l.String())
		}
	}
	return fmt.Sprintf("%s (jetstream.on_data_loss = \"refuse\"): %s; the store may have lost writes that were not synced (power cut with a jetstream.sync interval, or a damaged disk). "+
		"Inspect the store, restore a backup if you have one, then accept the loss: start once with jetstream.on_data_loss = \"warn\", or remove %s",
		ErrDataLoss, strings.Join(parts, "; "), e.StateFile)
}

// Unwrap returns ErrDataLoss.
func (e *DataLossError) Unwrap() error { return ErrDataLoss }

// CompareStoreState lists what the store lost against what was recorded:
// streams that vanished or whose last sequence went backwards (or that
// were created anew), and consumers that vanished or went backwards.
func CompareStoreState(recorded, now *StoreState) []DataLoss {
	if recorded == nil {
		return nil
	}
	var losses []DataLoss
	for _, name := range slices.Sorted(maps.Keys(recorded.Streams)) {
		if _, unknown := now.Unavailable[name]; unknown {
			continue
		}
		rec := recorded.Streams[name]
		cur, ok := now.Streams[name]
		switch {
		case !ok:
			losses = append(losses, DataLoss{Stream: name, Vanished: true, RecordedLast: rec.LastSeq, Messages: rec.LastSeq})
			continue
		case cur.LastSeq < rec.LastSeq:
			recreated := !rec.Created.IsZero() && !cur.Created.IsZero() && !rec.Created.Equal(cur.Created)
			losses = append(losses, DataLoss{Stream: name, RecordedLast: rec.LastSeq, FoundLast: cur.LastSeq, Messages: rec.LastSeq - cur.LastSeq,
				Recreated: recreated})
			continue
		}
	}
	for _, key := range slices.Sorted(maps.Keys(recorded.Consumers)) {
		rec := recorded.Consumers[key]
		if _, ok := now.Streams[rec.Stream]; !ok {
			continue // the stream's loss is reported, or it is unavailable
		}
		if _, unknown := now.Unavailable[key]; unknown {
			continue
		}
		cur, ok := now.Consumers[key]
		switch {
		case !ok:
			losses = append(losses, DataLoss{Stream: rec.Stream, Consumer: rec.Name, Vanished: true, RecordedLast: rec.AckFloor})
		case cur.AckFloor < rec.AckFloor:
			losses = append(losses, DataLoss{Stream: rec.Stream, Consumer: rec.Name, RecordedLast: rec.AckFloor, FoundLast: cur.AckFloor})
		}
	}
	return losses
}

// MoveOrphan moves the data directory a vanished stream left in the store
// (the server could not load it) out of the server's way, so that the
// bootstrap does not create the stream over it. It returns where it went,
// or "" when there was nothing to move.
func MoveOrphan(storeDir, stream string, now time.Time) (string, error) {
	dirs, err := orphanDirs(storeDir, stream)
	if err != nil {
		return "", err
	}
	var moved []string
	for _, dir := range dirs {
		account := filepath.Base(filepath.Dir(filepath.Dir(dir)))
		destDir := filepath.Join(storeDir, OrphanDirName)
		if err := os.MkdirAll(destDir, 0o750); err != nil {
			return "", err
		}
		// Losses can follow each other within a second: never reuse a name.
		base := filepath.Join(destDir, fmt.Sprintf("%s.%s.%s", account, stream, now.UTC().Format("20060102T150405Z")))
		dest := base
		for i := 1; ; i++ {
			if _, err := os.Lstat(dest); errors.Is(err, os.ErrNotExist) {
				break
			}
			dest = fmt.Sprintf("%s.%d", base, i)
		}
		if err := moveDir(dir, dest); err != nil {
			return "", fmt.Errorf("cannot move the data directory of vanished stream %s aside: %w", stream, err)
		}
		if err := SyncDir(filepath.Dir(dir)); err != nil {
			return "", err
		}
		if err := SyncDir(destDir); err != nil {
			return "", err
		}
		moved = append(moved, dest)
	}
	sort.Strings(moved)
	return strings.Join(moved, ", "), nil
}

// moveDir renames dir to dest, or, when they are on different file
// systems (STORE/jetstream or a stream's directory may be a symbolic link
// to another disk), copies it, flushes the copy and removes dir.
func moveDir(dir, dest string) error {
	err := os.Rename(dir, dest)
	if !errors.Is(err, syscall.EXDEV) {
		return err
	}
	if err := os.CopyFS(dest, os.DirFS(dir)); err != nil {
		_ = os.RemoveAll(dest)
		return fmt.Errorf("cannot copy it to %s: %w", dest, err)
	}
	if err := syncTree(dest); err != nil {
		_ = os.RemoveAll(dest)
		return err
	}
	return os.RemoveAll(dir)
}

// syncTree flushes every file and directory under root, root too, each
// readable by its owner and group only (os.CopyFS creates them 0666 less
// the umask).
func syncTree(root string) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if err := os.Chmod(path, 0o750); err != nil {
				return err
			}
			return SyncDir(path)
		}
		if err := os.Chmod(path, 0o640); err != nil {
			return err
		}
		return flushFile(path)
	})
}

// orphanDirs lists the data directories named exactly stream, in every
// account of the store (jetstream/<account>/streams/<stream>). Names are
// compared as they are, never as patterns: a stream may be called "A?" or
// "A[1]" and must not take "AB"'s or "A1"'s directory with it.
func orphanDirs(storeDir, stream string) ([]string, error) {
	if stream == "" || stream == "." || stream == ".." || strings.ContainsAny(stream, `/\`) {
		return nil, fmt.Errorf("cannot look for the data directory of stream %q: not a valid stream name", stream)
	}
	root := filepath.Join(storeDir, "jetstream")
	accounts, err := Accounts(root)
	if err != nil {
		return nil, fmt.Errorf("cannot look for the data directory of vanished stream %s: %w", stream, err)
	}
	var dirs []string
	for _, a := range accounts {
		dir := filepath.Join(root, a, "streams", stream)
		fi, err := os.Lstat(dir)
		switch {
		case errors.Is(err, os.ErrNotExist):
			continue
		case err != nil:
			return nil, fmt.Errorf("cannot look for the data directory of vanished stream %s: %w", stream, err)
		case fi.IsDir():
			dirs = append(dirs, dir)
		}
	}
	return dirs, nil
}

// ErrStoreOfAnotherCluster is the sentinel the start-up refusal of a store
// recorded in another cluster unwraps to.
var ErrStoreOfAnotherCluster = errors.New("the store dir belongs to another cluster")
