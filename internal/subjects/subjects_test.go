package subjects

import (
	"strings"
	"testing"
)

func TestNames(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{Status("edge 01.a*b>c"), "$HOLDFAST.STATUS.edge_01_a_b_c"},
		{Reload("edge-01"), "$HOLDFAST.RELOAD.edge-01"},
		{Replay("WORKER1"), "$HOLDFAST.REPLAY.WORKER1"},
		{DeadLetter("WORKER1", "orders.created"), "dlq.WORKER1.orders.created"},
		{DeadLetters("WORKER1"), "dlq.WORKER1.>"},
		{GroupCommit("ORDERS", "orders.*"), "$HOLDFAST.GC.ORDERS.orders.*"},
		{ReplayClaim(42), "holdfast-claim-42"},
		{Replacing("ORDERS"), "$HOLDFAST.REPLACING.ORDERS"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	if !IsReplayClaim(ReplayClaim(7)) || IsReplayClaim("WORKER1") {
		t.Error("IsReplayClaim")
	}
	if !IsGroupCommit(GroupCommit("S", "a.b")) || IsGroupCommit("a.b") {
		t.Error("IsGroupCommit")
	}
	if got := GroupCommitSubjects("S", []string{"a.*", "b.>"}); len(got) != 2 || got[1] != "$HOLDFAST.GC.S.b.>" {
		t.Errorf("GroupCommitSubjects = %q", got)
	}
}

// ConfiguredSubjects undoes GroupCommitSubjects, and leaves others alone.
func TestConfiguredSubjects(t *testing.T) {
	subjs := []string{"orders.*", "orders.>"}
	got := ConfiguredSubjects("ORDERS", append(GroupCommitSubjects("ORDERS", subjs), "other.x"))
	if want := []string{"orders.*", "orders.>", "other.x"}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("ConfiguredSubjects: %q, want %q", got, want)
	}
}
