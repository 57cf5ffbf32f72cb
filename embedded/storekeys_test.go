package embedded

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/embedded/store"
	"github.com/holdfast-io/holdfast/internal/configtest"
	"github.com/holdfast-io/holdfast/internal/natstest"
)

// keyedStore fills an encrypted store: three streams of several message
// blocks each (MaxBytes 120000 makes 32 KB blocks), each with a durable
// consumer that acknowledged its first 7 messages. It returns the store's
// config (closed).
func keyedStore(t *testing.T, keyFile, cipher string) *config.Config {
	t.Helper()
	cfg := configtest.Default(t)
	cfg.JetStream.EncryptionKeyFile = keyFile
	cfg.JetStream.EncryptionCipher = cipher
	log, _ := natstest.Logger(t)
	s := New(cfg, log)
	s.ReadyTimeout = 30 * time.Second
	if err := openWithin(t, s, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	ctx := natstest.Context(t)
	js := s.JetStream()
	payload := []byte(strings.Repeat("p", 1000))
	for i := range 3 {
		name := fmt.Sprintf("K%d", i)
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{fmt.Sprintf("k%d.>", i)}, MaxBytes: 120_000}); err != nil {
			t.Fatal(err)
		}
		for range 100 {
			if _, err := js.Publish(ctx, fmt.Sprintf("k%d.x", i), payload); err != nil {
				t.Fatal(err)
			}
		}
		c, err := js.CreateConsumer(ctx, name, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy})
		if err != nil {
			t.Fatal(err)
		}
		b, err := c.Fetch(7)
		if err != nil {
			t.Fatal(err)
		}
		for m := range b.Messages() {
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// checkKeyedStore opens cfg and checks every stream, message and consumer
// of keyedStore is there.
func checkKeyedStore(t *testing.T, cfg *config.Config) {
	t.Helper()
	log, lb := natstest.Logger(t)
	s := New(cfg, log)
	s.ReadyTimeout = 30 * time.Second
	if err := openWithin(t, s, 30*time.Second); err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer s.Close(context.Background())
	ctx := natstest.Context(t)
	for i := range 3 {
		st, err := s.JetStream().Stream(ctx, fmt.Sprintf("K%d", i))
		if err != nil {
			t.Fatalf("stream K%d: %v", i, err)
		}
		state := st.CachedInfo().State
		if state.LastSeq != 100 || state.Msgs < 50 {
			t.Errorf("stream K%d: %+v", i, state)
		}
		for seq := state.FirstSeq; seq <= state.LastSeq; seq++ {
			if m, err := st.GetMsg(ctx, seq); err != nil || len(m.Data) != 1000 {
				t.Fatalf("stream K%d message %d: %v", i, seq, err)
			}
		}
		c, err := st.Consumer(ctx, "C")
		if err != nil {
			t.Fatalf("consumer C of stream K%d: %v", i, err)
		}
		if f := c.CachedInfo().AckFloor.Stream; f != 7 {
			t.Errorf("consumer C of stream K%d: ack floor %d, want 7", i, f)
		}
	}
	if strings.Contains(lb.String(), "store state lost") {
		t.Errorf("the data-loss check reported a loss:\n%s", lb.String())
	}
}

// countKeyFiles counts the store's key files of each kind.
func countKeyFiles(t *testing.T, storeDir string) (streams, blocks, consumers int) {
	t.Helper()
	files, err := store.ListKeyFiles(filepath.Join(storeDir, "jetstream"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		switch {
		case strings.HasPrefix(f.What, "stream "):
			streams++
		case strings.HasPrefix(f.What, "message block "):
			blocks++
		default:
			consumers++
		}
	}
	return
}

// TestKeyRotationKeepsConsumers: a rotation (encryption_old_key_file)
// keeps every stream, message and consumer. Before, the server loaded the
// streams but could not open their consumers' key files (it rotates a
// consumer only between ciphers, not between keys), skipped them with a
// warning, and the consumers were lost: created anew, the stream
// delivered again from the start.
func TestKeyRotationKeepsConsumers(t *testing.T) {
	t.Parallel()
	for _, cipher := range []string{"chacha", "aes"} {
		t.Run(cipher, func(t *testing.T) {
			t.Parallel()
			keys := t.TempDir()
			oldKey := writeKey(t, keys, "old", strings.Repeat("o", 40))
			newKey := writeKey(t, keys, "new", strings.Repeat("n", 44))
			cfg := keyedStore(t, oldKey, cipher)
			streams, blocks, consumers := countKeyFiles(t, cfg.JetStream.StoreDir)
			if streams != 3 || consumers != 3 || blocks < 9 {
				t.Fatalf("key files: %d streams, %d blocks, %d consumers; want 3, at least 9, 3", streams, blocks, consumers)
			}

			rotated := *cfg
			rotated.JetStream.EncryptionKeyFile = newKey
			rotated.JetStream.EncryptionOldKeyFile = oldKey
			checkKeyedStore(t, &rotated)

			rotated.JetStream.EncryptionOldKeyFile = ""
			checkKeyedStore(t, &rotated)
			before := treeDigest(t, cfg.JetStream.StoreDir)
			log, _ := natstest.Logger(t)
			s := New(cfg, log)
			s.ReadyTimeout = 30 * time.Second
			err := openWithin(t, s, 30*time.Second)
			if err == nil {
				s.Close(context.Background())
				t.Fatal("the old key alone opened the store after the rotation")
			}
			if !errors.Is(err, store.ErrEncryptionKey) || !strings.Contains(err.Error(), "encryption_old_key_file") ||
				!strings.Contains(err.Error(), "nothing was changed on disk") {
				t.Errorf("error %v", err)
			}
			if after := treeDigest(t, cfg.JetStream.StoreDir); after != before {
				t.Error("the refused start changed the store")
			}
		})
	}
}

// TestKeyRotationInterrupted: a rotation stopped half-way (kill -9 during
// the start that rotates) leaves some key files under the old key. A start
// with the new key alone refuses, names them and changes nothing; the
// next start with both keys finishes the rotation. Before, the start with
// the new key alone went on without the consumers still under the old
// key (created anew: the stream delivered again).
func TestKeyRotationInterrupted(t *testing.T) {
	t.Parallel()
	keys := t.TempDir()
	oldKey := writeKey(t, keys, "old", strings.Repeat("o", 40))
	newKey := writeKey(t, keys, "new", strings.Repeat("n", 44))
	cfg := keyedStore(t, oldKey, "chacha")
	files, err := store.ListKeyFiles(filepath.Join(cfg.JetStream.StoreDir, "jetstream"))
	if err != nil {
		t.Fatal(err)
	}
	// Every other key file (a consumer's among them) stays under the old
	// key, the others are rotated: what a crash in the middle leaves.
	oldContent := map[string][]byte{}
	for i, f := range files {
		if i%2 == 0 || strings.HasPrefix(f.What, "consumer K1") {
			b, err := os.ReadFile(f.Path)
			if err != nil {
				t.Fatal(err)
			}
			oldContent[f.Path] = b
		}
	}
	rotated := *cfg
	rotated.JetStream.EncryptionKeyFile = newKey
	rotated.JetStream.EncryptionOldKeyFile = oldKey
	checkKeyedStore(t, &rotated)
	for p, b := range oldContent {
		if err := os.WriteFile(p, b, 0o640); err != nil {
			t.Fatal(err)
		}
	}

	rotated.JetStream.EncryptionOldKeyFile = ""
	before := treeDigest(t, cfg.JetStream.StoreDir)
	log, _ := natstest.Logger(t)
	s := New(&rotated, log)
	s.ReadyTimeout = 30 * time.Second
	err = openWithin(t, s, 30*time.Second)
	if err == nil {
		s.Close(context.Background())
		t.Fatal("started with the new key alone while key files are under the old key")
	}
	if !errors.Is(err, store.ErrEncryptionKey) || !strings.Contains(err.Error(), "consumer K1 > C") ||
		!strings.Contains(err.Error(), "jetstream.encryption_old_key_file") || !strings.Contains(err.Error(), "nothing was changed on disk") {
		t.Errorf("error %v", err)
	}
	if after := treeDigest(t, cfg.JetStream.StoreDir); after != before {
		t.Error("the refused start changed the store")
	}

	rotated.JetStream.EncryptionOldKeyFile = oldKey
	checkKeyedStore(t, &rotated)
	rotated.JetStream.EncryptionOldKeyFile = ""
	checkKeyedStore(t, &rotated)
}

// TestEncryptionAddedToUnusedStream: a key added to a store whose
// streams were never written to (a fresh install's ORDERS and dead-letter
// stream) keeps them over every later start. Before, the server left the
// stream's clear state file and empty message block as they were; the
// second start with the key could read neither ("corrupt state file"),
// dropped the streams, and holdfast reported them as lost data (refusing
// to start with on_data_loss = "refuse").
func TestEncryptionAddedToUnusedStream(t *testing.T) {
	t.Parallel()
	checkUnusedStreamsConverted(t, func(c *config.Config) {}, func(c *config.Config) {
		c.JetStream.EncryptionKeyFile = writeKey(t, t.TempDir(), "key", strings.Repeat("k", 40))
	})
}

// TestCipherChangeKeepsUnusedStream: the same for a change of
// jetstream.encryption_cipher: the server's conversion of a stream never
// written to failed ("corrupt state file") and it removed the stream's
// directory; holdfast reported the streams as lost data.
func TestCipherChangeKeepsUnusedStream(t *testing.T) {
	t.Parallel()
	key := writeKey(t, t.TempDir(), "key", strings.Repeat("k", 40))
	checkUnusedStreamsConverted(t, func(c *config.Config) {
		c.JetStream.EncryptionKeyFile = key
	}, func(c *config.Config) { c.JetStream.EncryptionCipher = "aes" })
}

// checkUnusedStreamsConverted bootstraps a store configured by before
// (ORDERS and ORDERS_DLQ never written to), then starts it three times as
// configured by after: the streams must stay.
func checkUnusedStreamsConverted(t *testing.T, before, after func(*config.Config)) {
	cfg := configtest.Default(t)
	cfg.JetStream.OnDataLoss = "refuse"
	before(cfg)
	s := runServer(t, cfg)
	applyConfig(t, s, cfg)
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	after(cfg)
	for start := range 3 {
		log, lb := natstest.Logger(t)
		s := New(cfg, log)
		s.ReadyTimeout = 30 * time.Second
		if err := openWithin(t, s, 30*time.Second); err != nil {
			t.Fatalf("start %d with the key: %v", start, err)
		}
		for _, name := range []string{"ORDERS", "ORDERS_DLQ"} {
			if _, err := s.JetStream().Stream(natstest.Context(t), name); err != nil {
				t.Errorf("start %d: stream %s: %v", start, name, err)
			}
		}
		if err := s.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(lb.String(), "Error recreating stream") {
			t.Errorf("start %d: the server could not read a stream:\n%s", start, lb.String())
		}
	}
	if _, err := os.Stat(filepath.Join(cfg.JetStream.StoreDir, store.EncryptingDirName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the clear-text copies are still there: %v", err)
	}
}

// TestEncryptingStartInterrupted: what a start killed while the server
// encrypted a clear-text store leaves (the copies complete, a stream half
// converted: here a key file written before its metadata) is put back
// from the copies at the next start, and encrypted again. A copy without
// its completion mark is only removed: the server never started on it.
func TestEncryptingStartInterrupted(t *testing.T) {
	t.Parallel()
	cfg := configtest.Default(t)
	s, _ := lossServer(t, cfg, 10)
	closeServer(t, s)
	storeDir := cfg.JetStream.StoreDir
	orders := filepath.Join(storeDir, "jetstream", "$G", "streams", "ORDERS")

	// An incomplete copy: removed, the stream untouched.
	partial := filepath.Join(storeDir, store.EncryptingDirName, "$G", "ORDERS")
	if err := os.MkdirAll(partial, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(partial, "meta.inf"), []byte("torn"), 0o640); err != nil {
		t.Fatal(err)
	}
	s2, _, err := reopen(t, cfg, false)
	if err != nil {
		t.Fatalf("with an incomplete copy: %v", err)
	}
	closeServer(t, s2)
	if _, err := os.Stat(filepath.Join(storeDir, store.EncryptingDirName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the incomplete copy is still there: %v", err)
	}

	// A complete copy and a half-encrypted stream: put back, encrypted.
	dirs, err := store.ClearStreams(filepath.Join(storeDir, "jetstream"))
	if err != nil || len(dirs) != 2 {
		t.Fatalf("clear streams %v, %v", dirs, err)
	}
	if err := store.CopyClearStreams(storeDir, dirs, nil, 1<<40); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(orders, "meta.key"), bytes.Repeat([]byte{7}, 72), 0o640); err != nil {
		t.Fatal(err)
	}
	cfg.JetStream.EncryptionKeyFile = writeKey(t, t.TempDir(), "key", strings.Repeat("k", 40))
	s3, lb, err := reopen(t, cfg, false)
	if err != nil {
		t.Fatalf("after an interrupted encrypting start: %v", err)
	}
	st, err := s3.JetStream().Stream(natstest.Context(t), "ORDERS")
	if err != nil || st.CachedInfo().State.Msgs != 10 {
		t.Fatalf("ORDERS after the copies were put back: %v", err)
	}
	closeServer(t, s3)
	if !strings.Contains(lb.String(), "are put back as they were") {
		t.Errorf("no word of the copies put back:\n%s", lb.String())
	}
	if _, err := os.Stat(filepath.Join(orders, "meta.key")); err != nil {
		t.Errorf("ORDERS not encrypted: %v", err)
	}
}

// TestEncryptingKeepsAStreamTheServerCannotLoad: a clear-text stream the
// server cannot load (its checksum file damaged) when a key is added is
// left as it was, and the data-loss check deals with it as without a key,
// instead of holdfast refusing every start.
func TestEncryptingKeepsAStreamTheServerCannotLoad(t *testing.T) {
	t.Parallel()
	cfg := configtest.Default(t)
	s, _ := lossServer(t, cfg, 3)
	closeServer(t, s)
	sum := filepath.Join(cfg.JetStream.StoreDir, "jetstream", "$G", "streams", "ORDERS", "meta.sum")
	if err := os.WriteFile(sum, []byte("0000000000000000"), 0o640); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(filepath.Join(filepath.Dir(sum), "meta.inf"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.JetStream.EncryptionKeyFile = writeKey(t, t.TempDir(), "key", strings.Repeat("k", 40))
	s2, lb, err := reopen(t, cfg, false)
	if err != nil {
		t.Fatalf("start with the key: %v", err)
	}
	closeServer(t, s2)
	if !strings.Contains(lb.String(), "stream ORDERS vanished") {
		t.Errorf("the data-loss check did not report ORDERS:\n%s", lb.String())
	}
	moved, _ := filepath.Glob(filepath.Join(cfg.JetStream.StoreDir, store.OrphanDirName, "*ORDERS*", "meta.inf"))
	if len(moved) != 1 {
		t.Fatalf("ORDERS's directory not moved aside: %v", moved)
	}
	if after, err := os.ReadFile(moved[0]); err != nil || !bytes.Equal(after, before) {
		t.Errorf("ORDERS's metadata changed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(cfg.JetStream.StoreDir, store.EncryptingDirName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the clear-text copies are still there: %v", err)
	}
}

// TestEncryptingCopyKeepsModes: the clear-text copies holdfast keeps
// while the server encrypts a store are no more readable than the
// streams (the server writes 0600); they were 0640.
func TestEncryptingCopyKeepsModes(t *testing.T) {
	t.Parallel()
	cfg := configtest.Default(t)
	s, _ := lossServer(t, cfg, 3)
	closeServer(t, s)
	storeDir := cfg.JetStream.StoreDir
	dirs, err := store.ClearStreams(filepath.Join(storeDir, "jetstream"))
	if err != nil || len(dirs) == 0 {
		t.Fatalf("clear streams %v, %v", dirs, err)
	}
	if err := store.CopyClearStreams(storeDir, dirs, nil, 1<<40); err != nil {
		t.Fatal(err)
	}
	err = filepath.WalkDir(filepath.Join(storeDir, store.EncryptingDirName), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == store.EncryptingComplete {
			return err
		}
		rel, _ := filepath.Rel(filepath.Join(storeDir, store.EncryptingDirName, "$G"), p)
		orig, err := os.Stat(filepath.Join(storeDir, "jetstream", "$G", "streams", rel))
		if err != nil {
			return nil // removed from the stream after the copy (index.db)
		}
		if fi, err := d.Info(); err == nil && fi.Mode().Perm() != orig.Mode().Perm() {
			t.Errorf("%s: mode %04o, the stream's file is %04o", p, fi.Mode().Perm(), orig.Mode().Perm())
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestDamagedKeyFileFollowsOnDataLoss: a key file too short to hold a
// key (damaged: no key opens it) does not stop start-up by itself; the
// server drops the block, and the data-loss check reports the lost
// messages under jetstream.on_data_loss, as for any damaged block. 57b4bca
// refused every start until the file was moved by hand, whatever
// on_data_loss said.
func TestDamagedKeyFileFollowsOnDataLoss(t *testing.T) {
	t.Parallel()
	key := writeKey(t, t.TempDir(), "key", strings.Repeat("k", 40))
	cfg := keyedStore(t, key, "chacha")
	blocks, err := filepath.Glob(filepath.Join(cfg.JetStream.StoreDir, "jetstream", "$G", "streams", "K0", "msgs", "*.key"))
	if err != nil || len(blocks) < 2 {
		t.Fatalf("block keys %v, %v", blocks, err)
	}
	if err := os.WriteFile(blocks[len(blocks)-1], []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(cfg.JetStream.StoreDir, "jetstream", "$G", "streams", "K0", "msgs", "index.db"))
	s, lb, err := reopen(t, cfg, false)
	if err != nil {
		t.Fatalf("start with a damaged block key and on_data_loss = warn: %v", err)
	}
	closeServer(t, s)
	if !strings.Contains(lb.String(), "damaged key file") || !strings.Contains(lb.String(), "data loss: stream K0") {
		t.Errorf("the damaged key file and the loss are not reported:\n%s", lb.String())
	}
}

// TestDamagedStreamKeyFileSaysSo: a stream whose key file is damaged
// (too short to hold a key) stops start-up with an error that says so and
// names the file. Before, it said the key was "not the key the store was
// written with", sending the operator after the wrong key.
func TestDamagedStreamKeyFileSaysSo(t *testing.T) {
	t.Parallel()
	key := writeKey(t, t.TempDir(), "key", strings.Repeat("k", 40))
	cfg := keyedStore(t, key, "chacha")
	p := filepath.Join(cfg.JetStream.StoreDir, "jetstream", "$G", "streams", "K1", "meta.key")
	if err := os.WriteFile(p, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, err := reopen(t, cfg, false)
	if !errors.Is(err, store.ErrEncryptionKey) || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "damaged") ||
		strings.Contains(err.Error(), "not the key the store was written with") {
		t.Fatalf("start with a damaged stream key file: %v", err)
	}
}

// TestCipherChangeKilledAfterConverting: a start that converts the store
// to another cipher, killed once the server had converted every stream
// and holdfast had removed the copies, but before it removed its recovery
// links, loses nothing. The next start took each converted stream for one
// the server had half deleted (the conversion replaces key files) and put
// its links back: the message blocks under them were already rewritten
// in the new cipher (in place, the same files), the key files the old
// ones, and the server could then load none of it. Found by
// TestCipherChangeKill9 under CI load.
func TestCipherChangeKilledAfterConverting(t *testing.T) {
	t.Parallel()
	key := writeKey(t, t.TempDir(), "key", strings.Repeat("k", 40))
	cfg := keyedStore(t, key, "chacha")
	cfg.JetStream.EncryptionCipher = "aes"
	log, _ := natstest.Logger(t)
	s := New(cfg, log)
	s.ReadyTimeout = 30 * time.Second
	// What the disk holds at that moment (hard links kept): the store a
	// kill leaves.
	killed := filepath.Join(t.TempDir(), "killed")
	s.atStep = func(step string) {
		if step != "converted" {
			return
		}
		if out, err := exec.Command("cp", "-a", cfg.JetStream.StoreDir, killed).CombinedOutput(); err != nil {
			t.Errorf("cp: %v: %s", err, out)
		}
	}
	if err := openWithin(t, s, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	closeServer(t, s)
	if err := os.Remove(filepath.Join(killed, store.LockFileName)); err != nil {
		t.Fatal(err)
	}
	cfg.JetStream.StoreDir = killed
	checkKeyedStore(t, cfg)
}
