// Package subjects names every subject, subject prefix and size that
// holdfast reserves on the NATS server it embeds: dead letters, the
// requests the CLI makes of a running holdfast, and the internal subjects
// only holdfast's own identity may use. It imports nothing of holdfast's,
// so that every package may use it.
package subjects

import (
	"strconv"
	"strings"
)

// Internal is the prefix of the subjects only holdfast's own in-process
// identity may subscribe to: nobody else can answer a request made on
// them.
const Internal = "$HOLDFAST."

// DeadLetterPrefix starts every dead-letter subject:
// dlq.<CONSUMER>.<original subject>.
const DeadLetterPrefix = "dlq."

// DeadLetterHeadroom is what the server accepts beyond server.max_payload:
// room for the headers a dead letter adds (the workers cut Holdfast-Error,
// the handler's reason, to 1 KiB).
const DeadLetterHeadroom = 8 << 10

// DeadLetter is the subject of the dead letters of consumer for messages
// of subject.
func DeadLetter(consumer, subject string) string {
	return DeadLetterPrefix + consumer + "." + subject
}

// DeadLetters is the wildcard of every dead letter of consumer.
func DeadLetters(consumer string) string { return DeadLetterPrefix + consumer + ".>" }

// Status is the subject on which the holdfast whose server is named name
// answers `holdfast status` (with a daemon.StatusReply in JSON). It ends
// with the server's name, so that in a cluster or across a leafnode each
// node answers for itself; any NATS client may ask:
//
//	nats request '$HOLDFAST.STATUS.edge-01' ''
func Status(name string) string { return Internal + "STATUS." + Token(name) }

// Reload is the subject on which the holdfast whose server is named name
// answers what a reload of its config file would apply, what needs a
// restart, and what its last reload did (a daemon.ReloadReply in JSON). It
// only reads: a reload is SIGHUP.
//
//	nats request '$HOLDFAST.RELOAD.edge-01' ''
func Reload(name string) string { return Internal + "RELOAD." + Token(name) }

// Flush is the subject on which the holdfast whose server is named name
// answers once what its server stored before the request is on disk
// (jetstream.commit_window: holdfast flushes the store itself; without
// it the server flushed each write already). The answer is empty, or an
// error text. `holdfast restore` asks it before it reports success.
func Flush(name string) string { return Internal + "FLUSH." + Token(name) }

// Leafs is the subject on which every node of the hub cluster named
// cluster answers which edges have their leafnode link on it (a JSON list
// of server names): a node gathers the answers for its view of the fleet.
// The cluster's name keeps a hub that is itself an edge of another from
// asking that one's nodes too.
func Leafs(cluster string) string { return Internal + "LEAFS." + Token(cluster) }

// Barrier is the subject, one per stream, that holdfast's MQTT gate
// publishes to with a Nats-Expected-Stream the stream refuses: the
// refusal comes back once the stream has processed every message queued
// before it (embedded/mqtt). It names the server, so that a stream of the
// same name across a leafnode never answers.
func Barrier(server, stream string) string {
	return BarrierPrefix + Token(server) + "." + stream
}

// BarrierPrefix starts every Barrier subject; only holdfast's own
// identity may publish there.
const BarrierPrefix = Internal + "BARRIER."

// Token is name as one subject token: characters a token cannot hold
// become '_'.
func Token(name string) string {
	return strings.Map(func(r rune) rune {
		if r <= ' ' || r == '.' || r == '*' || r == '>' || r == 0x7f {
			return '_'
		}
		return r
	}, name)
}

// Replacing is the only subject of a stream that `holdfast restore
// --replace` is about to replace: nobody publishes to it.
func Replacing(stream string) string { return Internal + "REPLACING." + stream }

// HeldMeta is the stream metadata key under which a stream whose subjects
// `holdfast restore` holds back (its only subject Replacing) keeps its
// own, separated by spaces.
const HeldMeta = "holdfast_held_subjects"

// Held returns the subjects a stream of that name, subjects and metadata
// had before a restore held them back, and whether they are held back.
func Held(stream string, subjects []string, meta map[string]string) ([]string, bool) {
	held := meta[HeldMeta]
	if held == "" || len(subjects) != 1 || subjects[0] != Replacing(stream) {
		return nil, false
	}
	return strings.Fields(held), true
}

// RestoringMeta is the stream metadata key a stream has while `holdfast
// restore` creates it from a backup (its subjects held back, as Replacing
// holds them, until it is checked), with the backup directory as value. A
// stream that still has it is what a restore stopped before its end left:
// part of a backup, which must take no publishes.
const RestoringMeta = "holdfast_restoring"

// Restoring reports whether a stream of that name, subjects and metadata
// is one a restore left unfinished, and the backup it came from.
func Restoring(stream string, subjects []string, meta map[string]string) (backup string, ok bool) {
	backup, ok = meta[RestoringMeta]
	return backup, ok && len(subjects) == 1 && subjects[0] == Replacing(stream)
}

// Replay is the subject on which the workers of consumer take requests to
// replay dead letters.
func Replay(consumer string) string { return Internal + "REPLAY." + consumer }

// GroupCommitPrefix is where a stream with group_commit stores what
// holdfast's ingest publishes: the stream's subjects behind this prefix and
// the stream name, mapped back to the configured subjects by a subject
// transform. Clients may not publish here (embedded denies it), so every
// message reaches the stream through holdfast's batches.
const GroupCommitPrefix = Internal + "GC."

// GroupCommitQueue is the queue group in which holdfast's ingest
// subscribes to the subjects of stream, a stream with group_commit, on
// every node. Only holdfast's own identity may join it (embedded denies
// it): a member takes its share of the publishes away from the stream.
func GroupCommitQueue(stream string) string { return "holdfast-gc-" + stream }

// MaxDeliveriesQueue is the queue group of the workers' subscriptions to
// their consumer's max-deliveries advisories (one node's workers act on
// each). Only holdfast's own identity may join it (embedded denies it): a
// member takes a share of the advisories, whose messages are then never
// dead-lettered.
const MaxDeliveriesQueue = "holdfast-max-deliveries"

// GroupCommit is the subject holdfast publishes a client's message
// on subj to, for stream.
func GroupCommit(stream, subj string) string {
	return GroupCommitPrefix + stream + "." + subj
}

// RetiredPrefix starts the subject a dead-letter stream keeps once it
// gave up its last consumer's dead-letter subject (Retired): a stream has
// at least one subject, and the server would give it its own name, on
// which any client could publish into it.
const RetiredPrefix = Internal + "RETIRED."

// Retired is the subject of stream once it takes no dead letters.
func Retired(stream string) string { return RetiredPrefix + stream }

// GroupCommitReplyBytes is the longest reply group commit's ingest gives
// a publish of its own: its connection's inbox ("_INBOX." and a 22-byte
// nuid) and a unit id of at most 16 bytes.
const GroupCommitReplyBytes = len("_INBOX.") + 22 + 16

// GroupCommitFits reports whether group commit's ingest of stream can pass
// on a publish on subj with a reply of replyBytes: with its prefix, and
// its own reply when that is longer, it fits ControlLineBudget.
func GroupCommitFits(stream, subj string, replyBytes int) bool {
	return len(GroupCommit(stream, subj))+max(replyBytes, GroupCommitReplyBytes) <= ControlLineBudget
}

// GroupCommitSubjects are the subjects the stored stream listens on.
func GroupCommitSubjects(stream string, subjs []string) []string {
	out := make([]string, len(subjs))
	for i, s := range subjs {
		out[i] = GroupCommit(stream, s)
	}
	return out
}

// ConfiguredSubjects are subjs (a stream's, as the server lists them)
// without group commit's prefix: the subjects its clients publish to.
// Subjects without the prefix stay as they are.
func ConfiguredSubjects(stream string, subjs []string) []string {
	out := make([]string, len(subjs))
	for i, s := range subjs {
		out[i] = strings.TrimPrefix(s, GroupCommit(stream, ""))
	}
	return out
}

// IsGroupCommit reports whether subj is one of the prefixed
// subjects (as a stream lists them while group commit is on).
func IsGroupCommit(subj string) bool { return strings.HasPrefix(subj, GroupCommitPrefix) }

// ReplayClaimPrefix begins the name of the consumer that claims a dead
// letter on its dead-letter stream while a replay of it runs in a cluster
// (one node runs the handler; the consumer is deleted when the replay
// ends). A stream restored from a backup taken meanwhile holds it too,
// with no replay running.
const ReplayClaimPrefix = "holdfast-claim-"

// ReplayClaim is the name of the consumer that claims dead letter seq.
func ReplayClaim(seq uint64) string { return ReplayClaimPrefix + strconv.FormatUint(seq, 10) }

// IsReplayClaim reports whether a consumer's name is a replay claim's.
func IsReplayClaim(name string) bool { return strings.HasPrefix(name, ReplayClaimPrefix) }

// ControlLineBudget is how long the subject and the reply of a message
// that holdfast publishes on its own in-process connections may be
// together. nats-server closes a connection whose control line ("HPUB
// subject reply header_size total_size") is longer than max_control_line,
// 4096 bytes by default, which holdfast keeps: a client's publish that
// fits can exceed it once holdfast adds a prefix (dlq.CONSUMER. for a
// dead letter, $HOLDFAST.GC.STREAM. for group commit, the forward
// subject's), and a closed in-process connection stops the workers, the
// dead letters or group commit. 32 bytes are left for the sizes and
// spaces.
const ControlLineBudget = 4096 - 32
