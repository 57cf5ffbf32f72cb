// Package backup writes and restores online backups of holdfast's streams
// through the JetStream snapshot and restore API: one directory per backup
// with a snapshot (and the stream's consumers with their state) per stream,
// a manifest that describes it, and checksums of every file.
//
// The snapshot protocol itself is spoken by github.com/nats-io/jsm.go (the
// library natscli's `nats stream backup` uses): the jetstream package of
// nats.go has no snapshot API.
package backup

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/jsm.go"
	jsmbackup "github.com/nats-io/jsm.go/backup"
)

const (
	// ManifestFile describes a backup; it is written last, so a directory
	// without it is a backup that did not finish.
	ManifestFile = "manifest.json"
	// SumsFile lists the SHA-256 of every file of the backup, the manifest
	// included, in the format of sha256sum(1): `sha256sum -c SHA256SUMS`
	// checks a backup without holdfast.
	SumsFile = "SHA256SUMS"
	// FormatVersion is the manifest's format; Restore refuses another.
	FormatVersion = 1
	// streamsDir holds one directory per stream, named after it.
	streamsDir = "streams"
)

// Manifest describes one backup directory.
type Manifest struct {
	Format int `json:"format"`
	// Created is when the backup started; Finished when its last stream
	// was written.
	Created  time.Time `json:"created"`
	Finished time.Time `json:"finished"`
	// HoldfastVersion and NATSServerVersion are the versions of the holdfast
	// that wrote the backup and of the server it took the snapshots from.
	HoldfastVersion   string `json:"holdfast_version"`
	NATSServerVersion string `json:"nats_server_version"`
	// ServerName is the name of the server the snapshots came from.
	ServerName string        `json:"server_name,omitempty"`
	Streams    []StreamEntry `json:"streams"`
	// Skipped are the streams that were not backed up, with the reason
	// (memory storage cannot be snapshotted).
	Skipped []SkippedStream `json:"skipped,omitempty"`
	// Files are every file of the backup except the manifest and SumsFile,
	// relative to the backup directory.
	Files []File `json:"files"`
}

// StreamEntry is one stream of a backup, as its snapshot holds it.
type StreamEntry struct {
	Name string `json:"name"`
	// Dir holds the snapshot (backup.json, stream.arc.s2), relative to the
	// backup directory.
	Dir string `json:"dir"`
	// Messages, Bytes, FirstSeq and LastSeq are the stream in the snapshot:
	// what a restore creates. LastSeq is the stream's last sequence at the
	// snapshot point (a restore keeps it even when the last messages were
	// deleted).
	Messages uint64 `json:"messages"`
	Bytes    uint64 `json:"bytes"`
	FirstSeq uint64 `json:"first_seq"`
	LastSeq  uint64 `json:"last_seq"`
	// SnapshotAt is when the server took the stream's state.
	SnapshotAt time.Time       `json:"snapshot_at"`
	Consumers  []ConsumerEntry `json:"consumers"`
}

// ConsumerEntry is one consumer of a stream in a backup.
type ConsumerEntry struct {
	Name string `json:"name"`
	// AckFloor is the stream sequence up to which every message was
	// acknowledged: after a restore the consumer delivers only later ones.
	AckFloor uint64 `json:"ack_floor_stream_seq"`
	// AckFloorConsumer is the same floor in consumer sequences.
	AckFloorConsumer uint64 `json:"ack_floor_consumer_seq"`
	// Delivered is the last stream sequence delivered at the snapshot.
	Delivered uint64 `json:"delivered_stream_seq"`
	// AckPending counts the messages delivered but not yet acknowledged at
	// the snapshot: they are delivered again after a restore.
	AckPending int `json:"ack_pending"`
}

// SkippedStream is a stream a backup left out, and why.
type SkippedStream struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// File is one file of a backup with its size and SHA-256.
type File struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Stream returns the entry of the named stream, or nil.
func (m *Manifest) Stream(name string) *StreamEntry {
	for i := range m.Streams {
		if m.Streams[i].Name == name {
			return &m.Streams[i]
		}
	}
	return nil
}

// Select returns the entries of the named streams, each once, in the
// order given, or every stream of the backup when names is empty. It fails
// naming a stream the backup does not hold, or when it holds none.
func (m *Manifest) Select(names []string) ([]StreamEntry, error) {
	var have []string
	for _, s := range m.Streams {
		have = append(have, s.Name)
	}
	if len(have) == 0 {
		return nil, errors.New("the backup holds no stream")
	}
	if len(names) == 0 {
		return m.Streams, nil
	}
	var out []StreamEntry
	for _, name := range distinct(names) {
		e := m.Stream(name)
		if e == nil {
			return nil, fmt.Errorf("stream %s is not in the backup (it holds %s)", name, strings.Join(have, ", "))
		}
		out = append(out, *e)
	}
	return out, nil
}

// Consumer returns the entry of the named consumer, or nil.
func (s *StreamEntry) Consumer(name string) *ConsumerEntry {
	for i := range s.Consumers {
		if s.Consumers[i].Name == name {
			return &s.Consumers[i]
		}
	}
	return nil
}

// ErrDamaged is wrapped by every error of Verify about a backup that is
// incomplete, truncated or corrupted.
var ErrDamaged = errors.New("backup damaged")

// DamagedError names the file of a backup that failed verification.
type DamagedError struct {
	Dir    string
	File   string // relative to Dir
	Reason string
}

func (e *DamagedError) Error() string {
	return fmt.Sprintf("backup %s is not usable: %s: %s", e.Dir, filepath.Join(e.Dir, e.File), e.Reason)
}

// Unwrap lets errors.Is(err, ErrDamaged) match.
func (e *DamagedError) Unwrap() error { return ErrDamaged }

// Verify reads the backup in dir and checks it before anything is
// restored: the manifest is there (the backup finished), SumsFile lists
// it with its checksum, and every file the manifest lists has its size
// (else: truncated) and SHA-256 (else: corrupted). It returns the manifest
// or a *DamagedError naming the first bad file.
func Verify(dir string) (*Manifest, error) {
	damaged := func(file, format string, args ...any) error {
		return &DamagedError{Dir: dir, File: file, Reason: fmt.Sprintf(format, args...)}
	}
	sums, err := readSums(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			if _, merr := os.Stat(filepath.Join(dir, ManifestFile)); merr != nil {
				return nil, damaged(ManifestFile, "missing: not a holdfast backup, or a backup that did not finish")
			}
			return nil, damaged(SumsFile, "missing: the backup did not finish or was copied incompletely")
		}
		return nil, damaged(SumsFile, "%v", err)
	}
	want, ok := sums[ManifestFile]
	if !ok {
		return nil, damaged(SumsFile, "does not list %s", ManifestFile)
	}
	if err := checkFile(dir, File{Path: ManifestFile, Size: -1, SHA256: want}, SumsFile); err != nil {
		return nil, err
	}
	raw, err := readFile(dir, ManifestFile)
	if err != nil {
		return nil, damaged(ManifestFile, "%v", err)
	}
	var m Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, damaged(ManifestFile, "not a manifest: %v", err)
	}
	if m.Format != FormatVersion {
		return nil, damaged(ManifestFile, "format %d, this holdfast reads format %d", m.Format, FormatVersion)
	}
	for _, f := range m.Files {
		if !filepath.IsLocal(f.Path) {
			return nil, damaged(ManifestFile, "file %q is outside the backup", f.Path)
		}
		if sums[f.Path] != f.SHA256 {
			return nil, damaged(SumsFile, "checksum of %s differs from the manifest's", f.Path)
		}
		if err := checkFile(dir, f, "the manifest"); err != nil {
			return nil, err
		}
	}
	seen := map[string]bool{}
	for _, s := range m.Streams {
		if seen[s.Name] {
			return nil, damaged(ManifestFile, "stream %s is listed twice", s.Name)
		}
		seen[s.Name] = true
		for _, name := range []string{jsm.SnapshotMetaFile, jsm.SnapshotDataFile} {
			p := filepath.ToSlash(filepath.Join(s.Dir, name))
			if !slices.ContainsFunc(m.Files, func(f File) bool { return f.Path == p }) {
				return nil, damaged(ManifestFile, "stream %s: %s is not listed", s.Name, p)
			}
		}
		meta := filepath.ToSlash(filepath.Join(s.Dir, jsm.SnapshotMetaFile))
		cfg, err := snapshotConfig(filepath.Join(dir, filepath.FromSlash(s.Dir)))
		if err != nil {
			return nil, damaged(meta, "%v", err)
		}
		if cfg.Name != s.Name {
			return nil, damaged(ManifestFile, "stream %s: its snapshot %s holds stream %q", s.Name, meta, cfg.Name)
		}
	}
	return &m, nil
}

// openFile opens the file rel of the backup in dir for reading. A backup
// holds regular files of its own: a symbolic link that leads out of dir,
// a device or a FIFO is refused (reading one could read another file, or
// never end).
func openFile(dir, rel string) (*os.File, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	fi, err := root.Stat(rel)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		if target, lerr := os.Readlink(filepath.Join(dir, rel)); lerr == nil {
			return nil, fmt.Errorf("a symbolic link to %s, outside the backup", target)
		}
		return nil, fmt.Errorf("%w (outside the backup?)", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file (%s), as a backup holds", fi.Mode().Type())
	}
	return root.Open(rel)
}

// readFile reads the file rel of the backup in dir (see openFile).
func readFile(dir, rel string) ([]byte, error) {
	f, err := openFile(dir, rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// checkFile compares a file's size (unless Size < 0) and SHA-256 with f,
// which comes from source.
func checkFile(dir string, f File, source string) error {
	got, err := hashFile(dir, f.Path, f.Size)
	if errors.Is(err, os.ErrNotExist) {
		return &DamagedError{Dir: dir, File: f.Path, Reason: "missing"}
	}
	if err != nil {
		return &DamagedError{Dir: dir, File: f.Path, Reason: err.Error()}
	}
	if f.Size >= 0 && got.Size != f.Size {
		how := "truncated"
		if got.Size > f.Size {
			how = "longer than written"
		}
		return &DamagedError{Dir: dir, File: f.Path, Reason: fmt.Sprintf("%s: %d bytes, %s says %d", how, got.Size, source, f.Size)}
	}
	if got.SHA256 != f.SHA256 {
		return &DamagedError{Dir: dir, File: f.Path, Reason: fmt.Sprintf("corrupted: SHA-256 %s, %s says %s", got.SHA256, source, f.SHA256)}
	}
	return nil
}

// hashFile returns the File entry for path (relative to dir; see
// openFile). When want >= 0 and the file has another size, the entry has
// that size and no SHA-256: the file is not read.
func hashFile(dir, rel string, want int64) (File, error) {
	fh, err := openFile(dir, rel)
	if err != nil {
		return File{}, err
	}
	defer fh.Close()
	if fi, err := fh.Stat(); err != nil {
		return File{}, err
	} else if want >= 0 && fi.Size() != want {
		return File{Path: filepath.ToSlash(rel), Size: fi.Size()}, nil
	}
	h := sha256.New()
	n, err := io.Copy(h, fh)
	if err != nil {
		return File{}, err
	}
	return File{Path: filepath.ToSlash(rel), Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// readSums parses the SumsFile of the backup in dir into path -> hex
// digest.
func readSums(dir string) (map[string]string, error) {
	fh, err := openFile(dir, SumsFile)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(fh)
	line := 0
	for sc.Scan() {
		line++
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok || len(sum) != sha256.Size*2 || name == "" {
			return nil, fmt.Errorf("line %d is not \"SHA256  FILE\"", line)
		}
		out[name] = sum
	}
	return out, sc.Err()
}

// writeSums writes files as a sha256sum(1) file.
func writeSums(path string, files []File) error {
	var b strings.Builder
	for _, f := range files {
		b.WriteString(f.SHA256 + "  " + f.Path + "\n")
	}
	return writeFileSync(path, []byte(b.String()))
}

// writeFileSync writes data to path through a temporary file, synced and
// renamed, so that a crash leaves the old file or the new one.
func writeFileSync(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return syncPath(filepath.Dir(path))
}

// syncPath flushes a file (one the snapshot library wrote) or a
// directory (its entries) to the device.
func syncPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// Configs is the configuration of one stream of a backup and of its
// consumers, as the server will have them after a restore: JSON in the
// server's own shape (that of jetstream.StreamConfig and ConsumerConfig).
type Configs struct {
	Stream    json.RawMessage
	Consumers map[string]json.RawMessage
}

// ReadConfigs reads the configuration of stream e of the backup in dir
// (see Verify for the files' integrity).
func ReadConfigs(dir string, e StreamEntry) (Configs, error) {
	sdir := filepath.Join(dir, filepath.FromSlash(e.Dir))
	raw, err := os.ReadFile(filepath.Join(sdir, jsm.SnapshotMetaFile))
	if err != nil {
		return Configs{}, err
	}
	var meta struct {
		Config json.RawMessage `json:"config"`
	}
	if err := json.Unmarshal(raw, &meta); err != nil {
		return Configs{}, fmt.Errorf("%s: %w", filepath.Join(sdir, jsm.SnapshotMetaFile), err)
	}
	out := Configs{Stream: meta.Config, Consumers: map[string]json.RawMessage{}}
	f, err := os.Open(filepath.Join(sdir, jsm.SnapshotDataFile))
	if err != nil {
		return Configs{}, err
	}
	defer f.Close()
	dec := jsmbackup.NewDecoder(f)
	for {
		item, err := dec.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return Configs{}, fmt.Errorf("%s: %w", filepath.Join(sdir, jsm.SnapshotDataFile), err)
		}
		switch it := item.(type) {
		case *jsmbackup.State:
			continue
		case *jsmbackup.Consumer:
			var c struct {
				Config json.RawMessage `json:"config"`
			}
			if err := json.Unmarshal(it.Data, &c); err != nil {
				return Configs{}, fmt.Errorf("consumer %s: %w", it.Name, err)
			}
			out.Consumers[it.Name] = c.Config
			continue
		}
		return out, nil // the consumers precede the messages
	}
}
