package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// rotationStreams are the streams the key rotation test fills: several
// message blocks each (MaxBytes 120000 makes 32 KB blocks) and a durable
// consumer that acknowledged the first rotationAcked messages.
const (
	rotationStreams = 6
	rotationMsgs    = 100
	rotationAcked   = 7
)

func rotationConfig(store string, port int, key, oldKey string) string {
	return rotationConfigCipher(store, port, key, oldKey, "")
}

// rotationConfigCipher is rotationConfig with jetstream.encryption_cipher
// (when not "").
func rotationConfigCipher(store string, port int, key, oldKey, cipher string) string {
	js := ""
	if cipher != "" {
		js += fmt.Sprintf("encryption_cipher = %q\n", cipher)
	}
	if key != "" {
		js += fmt.Sprintf("encryption_key_file = %q\n", key)
	}
	if oldKey != "" {
		js += fmt.Sprintf("encryption_old_key_file = %q\n", oldKey)
	}
	return strings.Replace(e2eConfigTOML(store, port, ""), "[http]", js+"\n[http]", 1)
}

// checkRotationStore starts holdfast on cfg and checks that every stream,
// message and consumer ack floor the test made is there.
func checkRotationStore(t *testing.T, cfg string, port int, what string) {
	t.Helper()
	p := startHoldfast(t, cfg)
	p.waitReady()
	_, js := e2eConnect(t, &e2eInstance{port: port})
	ctx := natstest.Context(t)
	for i := range rotationStreams {
		st, err := js.Stream(ctx, fmt.Sprintf("R%d", i))
		if err != nil {
			t.Fatalf("%s: stream R%d: %v", what, i, err)
		}
		state := st.CachedInfo().State
		if state.LastSeq != rotationMsgs {
			t.Fatalf("%s: stream R%d: %+v", what, i, state)
		}
		// Every message read back (decrypted) by one fetch: a GetMsg
		// request each cost most of the test's CPU.
		oc, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
		if err != nil {
			t.Fatalf("%s: stream R%d: %v", what, i, err)
		}
		batch, err := oc.Fetch(int(state.Msgs), jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			t.Fatalf("%s: stream R%d: %v", what, i, err)
		}
		read := uint64(0)
		for m := range batch.Messages() {
			if md, _ := m.Metadata(); len(m.Data()) != 1000 || md == nil || md.Sequence.Stream != state.FirstSeq+read {
				t.Fatalf("%s: stream R%d message %d: %d bytes, %+v", what, i, state.FirstSeq+read, len(m.Data()), md)
			}
			read++
		}
		if err := batch.Error(); err != nil || read != state.Msgs {
			t.Fatalf("%s: stream R%d: read %d of %d messages: %v", what, i, read, state.Msgs, err)
		}
		c, err := st.Consumer(ctx, "C")
		if err != nil {
			t.Fatalf("%s: consumer C of stream R%d: %v", what, i, err)
		}
		if f := c.CachedInfo().AckFloor.Stream; f != rotationAcked {
			t.Fatalf("%s: consumer C of stream R%d: ack floor %d, want %d", what, i, f, rotationAcked)
		}
	}
	if out := p.stderr.String(); strings.Contains(out, "store state lost") || strings.Contains(out, "data loss") {
		t.Fatalf("%s: holdfast reported a loss:\n%s", what, out)
	}
	p.stop()
}

// TestKeyRotationKill9: holdfast killed (SIGKILL) at random moments of
// the start that rotates the encryption key, then started again with
// both keys, then with the new key alone, keeps every stream, message and
// consumer. Before, nats-server's own rotation lost every consumer even
// without a kill.
func TestKeyRotationKill9(t *testing.T) {
	t.Parallel()
	runKeyChangeKill9(t, "A", "B", "A", "")
}

// TestEncryptionAddedKill9 is the same for a key added to a store in
// clear text.
func TestEncryptionAddedKill9(t *testing.T) {
	t.Parallel()
	runKeyChangeKill9(t, "", "B", "", "")
}

// TestCipherChangeKill9 is the same for jetstream.encryption_cipher
// changed from chacha to aes, with the same key.
func TestCipherChangeKill9(t *testing.T) {
	t.Parallel()
	runKeyChangeKill9(t, "A", "A", "", "aes")
}

// runKeyChangeKill9 fills a store written with key from (a name, "" for
// none), then, on fresh copies of it, kills the start with key to (and
// old key old, cipher cipher) at several moments, and checks every
// message and consumer with the same keys and with to alone.
func runKeyChangeKill9(t *testing.T, from, to, old, cipher string) {
	dir := durTempDir(t, "rotation")
	keyA, keyB := filepath.Join(dir, "a.key"), filepath.Join(dir, "b.key")
	for p, k := range map[string]string{keyA: strings.Repeat("A", 44), keyB: strings.Repeat("B", 44)} {
		if err := os.WriteFile(p, []byte(k+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	port := natstest.FreePort(t)
	original := filepath.Join(dir, "original")
	keyOf := map[string]string{"": "", "A": keyA, "B": keyB}
	p := startHoldfast(t, e2eWriteConfig(t, rotationConfig(original, port, keyOf[from], "")))
	p.waitReady()
	_, js := e2eConnect(t, &e2eInstance{port: port})
	ctx := natstest.Context(t)
	payload := []byte(strings.Repeat("r", 1000))
	for i := range rotationStreams {
		name := fmt.Sprintf("R%d", i)
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{fmt.Sprintf("r%d.>", i)}, MaxBytes: 120_000}); err != nil {
			t.Fatal(err)
		}
		for range rotationMsgs {
			if _, err := js.Publish(ctx, fmt.Sprintf("r%d.x", i), payload); err != nil {
				t.Fatal(err)
			}
		}
		c, err := js.CreateConsumer(ctx, name, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy})
		if err != nil {
			t.Fatal(err)
		}
		b, err := c.Fetch(rotationAcked)
		if err != nil {
			t.Fatal(err)
		}
		for m := range b.Messages() {
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	p.stop()

	cycles := durEnvInt("HOLDFAST_ROTATION_CYCLES", 6)
	for cycle := range cycles {
		store := filepath.Join(dir, fmt.Sprintf("store%d", cycle))
		if out, err := exec.Command("cp", "-a", original, store).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v %s", err, out)
		}
		both := e2eWriteConfig(t, rotationConfigCipher(store, port, keyOf[to], keyOf[old], cipher))
		// Killed in turn just before the rotation, after it, while the
		// server recovers the streams (where nats-server rotates what is
		// left), and once ready; each a random 0-5 ms after the line.
		p := startHoldfast(t, both)
		marker := rotationKillMarkers[cycle%len(rotationKillMarkers)]
		for !strings.Contains(p.stderr.String(), marker) && !p.exited() {
			time.Sleep(200 * time.Microsecond)
		}
		time.Sleep(randDuration(0, 5*time.Millisecond))
		_ = p.cmd.Process.Kill()
		p.wait(30 * time.Second)
		t.Logf("cycle %d: killed after %q", cycle, lastLine(p.stderr.String()))

		checkRotationStore(t, both, port, fmt.Sprintf("cycle %d, both keys", cycle))
		checkRotationStore(t, e2eWriteConfig(t, rotationConfigCipher(store, port, keyOf[to], "", cipher)), port, fmt.Sprintf("cycle %d, new key alone", cycle))
	}
}

// rotationKillMarkers are the log lines after which the rotating start
// is killed.
var rotationKillMarkers = []string{"store encrypted at rest", "Starting restore for stream '$G > R0'", "Starting restore for stream '$G > R2'",
	"Recovering 1 consumers for stream - '$G > R1'", "NATS server ready", "holdfast ready"}

// lastLine returns the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// TestBackupOfEncryptedStore: `holdfast backup` of a store encrypted at
// rest says that the backup is not (the server's snapshots are clear
// text), and writes its files 0640 like the manifest (they were 0644);
// the backup restores into a holdfast with another key, which stores the
// messages encrypted again.
func TestBackupOfEncryptedStore(t *testing.T) {
	t.Parallel()
	const canary = "BACKUP-CANARY-5e1d"
	dir := t.TempDir()
	keyA, keyB := filepath.Join(dir, "a.key"), filepath.Join(dir, "b.key")
	for p, k := range map[string]string{keyA: strings.Repeat("A", 44), keyB: strings.Repeat("B", 44)} {
		if err := os.WriteFile(p, []byte(k+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	portA, portB := natstest.FreePort(t), natstest.FreePort(t)
	storeA, storeB := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	cfgA := e2eWriteConfig(t, rotationConfig(storeA, portA, keyA, ""))
	cfgB := e2eWriteConfig(t, rotationConfig(storeB, portB, keyB, ""))
	a := startHoldfast(t, cfgA)
	a.waitReady()
	_, js := e2eConnect(t, &e2eInstance{port: portA})
	for i := range 20 {
		if _, err := js.Publish(natstest.Context(t), "orders.created", fmt.Appendf(nil, "%s-%d", canary, i)); err != nil {
			t.Fatal(err)
		}
	}
	bdir := filepath.Join(dir, "backup")
	res := runHoldfast(t, nil, "backup", "--config", cfgA, bdir)
	if res.code != 0 {
		t.Fatalf("backup: %d %s", res.code, res.stderr)
	}
	if !strings.Contains(res.stderr, "the backup is not") || !strings.Contains(res.stderr, "clear text") {
		t.Errorf("backup of an encrypted store does not say it is in clear text: %q", res.stderr)
	}
	err := filepath.WalkDir(bdir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err == nil && fi.Mode().Perm()&0o027 != 0 {
			t.Errorf("%s: mode %04o, want at most 0640", p, fi.Mode().Perm())
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	a.stop()

	b := startHoldfast(t, cfgB)
	b.waitReady()
	if res := runHoldfast(t, nil, "restore", "--config", cfgB, bdir); res.code != 0 {
		t.Fatalf("restore into another key: %d %s %s", res.code, res.stdout, res.stderr)
	}
	_, jsB := e2eConnect(t, &e2eInstance{port: portB})
	st, err := jsB.Stream(natstest.Context(t), "ORDERS")
	if err != nil || st.CachedInfo().State.Msgs != 20 {
		t.Fatalf("ORDERS after the restore: %v", err)
	}
	b.stop()
	err = filepath.WalkDir(storeB, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(body), canary) {
			t.Errorf("restored message in clear text in %s", p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
