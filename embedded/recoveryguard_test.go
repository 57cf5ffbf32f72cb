package embedded

import (
	"log/slog"
	"testing"

	"github.com/holdfast-io/holdfast/embedded/store"
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
