package embedded

import (
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/embedded/store"
	"github.com/holdfast-io/holdfast/internal/configtest"
	"github.com/holdfast-io/holdfast/internal/natstest"
)

func TestNoteLoadFailure(t *testing.T) {
	l := newServerLogger(slog.New(slog.DiscardHandler))
	l.Warnf("  Error recreating stream %q: %v", "S8", "open /s/S8/__new_msgs__: too many open files (10077)")
	l.Warnf("  Error reading metafile %q: %v", "/store/jetstream/$G/streams/S9/meta.inf", "open meta.inf: too many open files")
	l.Warnf("    Error adding consumer '%s > %s > %s': %v", "$G", "S5", "C5", "error creating store for consumer: open o.dat: too many open files")
	l.Warnf("  Stream metafile %q: checksums do not match %q vs %q", "/store/jetstream/$G/streams/S1/meta.inf", "a", "b")
	got := l.LoadFailures()
	for _, name := range []string{"S8", "S9", "S5 > C5"} {
		if f, ok := got[name]; !ok || !f.Environmental() {
			t.Errorf("%s: %+v, want a host failure recorded", name, f)
		}
	}
	if len(got) != 3 {
		t.Errorf("recorded %v, want 3 (a checksum mismatch is a damaged stream, not a load failure)", got)
	}
	if (store.StreamLoadFailure{Err: "corrupt state file"}).Environmental() {
		t.Error("a corrupt state file taken for a host failure")
	}
}

// TestKilledJustAfterReady: a start killed once the server was ready but
// before holdfast removed its recovery links loses nothing acknowledged
// in between. The server serves clients from then on: here one purges
// the stream (its first blocks go) and publishes into a new block. The
// next start took the stream for one the server had half deleted while
// recovering (a linked block missing) and put the links in its place:
// the purged messages back, the acknowledged new ones gone.
func TestKilledJustAfterReady(t *testing.T) {
	t.Parallel()
	cfg := configtest.Default(t)
	s := runServer(t, cfg)
	ctx := natstest.Context(t)
	payload := []byte(strings.Repeat("p", 1000))
	// MaxBytes 120000 makes 32 KB blocks: 100 messages fill four.
	if _, err := s.JetStream().CreateStream(ctx, jetstream.StreamConfig{Name: "K", Subjects: []string{"k.>"}, MaxBytes: 120_000}); err != nil {
		t.Fatal(err)
	}
	for range 100 {
		if _, err := s.JetStream().Publish(ctx, "k.x", payload); err != nil {
			t.Fatal(err)
		}
	}
	closeServer(t, s)

	log, _ := natstest.Logger(t)
	s = New(cfg, log)
	s.ReadyTimeout = 30 * time.Second
	killed := filepath.Join(t.TempDir(), "killed")
	s.atStep = func(step string) {
		if step != "ready" {
			return
		}
		nc, err := nats.Connect(s.ns.ClientURL())
		if err != nil {
			t.Errorf("connect: %v", err)
			return
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		st, err := js.Stream(ctx, "K")
		if err == nil {
			err = st.Purge(ctx)
		}
		for i := 0; err == nil && i < 50; i++ {
			_, err = js.Publish(ctx, "k.x", payload)
		}
		if err != nil {
			t.Errorf("purge and publish: %v", err)
		}
		if out, err := exec.Command("cp", "-a", cfg.JetStream.StoreDir, killed).CombinedOutput(); err != nil {
			t.Errorf("cp: %v: %s", err, out)
		}
	}
	if err := openWithin(t, s, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	closeServer(t, s)
	if t.Failed() {
		return
	}
	if err := os.Remove(filepath.Join(killed, store.LockFileName)); err != nil {
		t.Fatal(err)
	}
	cfg.JetStream.StoreDir = killed
	s = runServer(t, cfg)
	defer closeServer(t, s)
	st, err := s.JetStream().Stream(ctx, "K")
	if err != nil {
		t.Fatal(err)
	}
	if state := st.CachedInfo().State; state.FirstSeq != 101 || state.LastSeq != 150 || state.Msgs != 50 {
		t.Errorf("after the kill: messages %d..%d (%d), want the 50 acknowledged after the purge, 101..150", state.FirstSeq, state.LastSeq, state.Msgs)
	}
}
