// Package subjects names every subject, subject prefix and size that
// holdfast reserves on the NATS server it embeds: dead letters, the
// requests the CLI makes of a running holdfast, and the internal subjects
// only holdfast's own identity may use. It imports nothing of holdfast's,
// so that every package may use it.
package subjects

import "strings"

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

// Replay is the subject on which the workers of consumer take requests to
// replay dead letters.
func Replay(consumer string) string { return Internal + "REPLAY." + consumer }
