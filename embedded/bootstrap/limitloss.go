package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/config"
)

// keepLimitsThatWouldLoseMessages undoes in next each lowered limit
// (max_msgs, max_bytes, max_age) that the server would enforce at once by
// deleting messages a durable consumer of the stream has not processed
// yet, and returns one line per limit kept, naming the key, the consumer
// and what to do. A config edit is not a retention loss: a reload or
// start that lowers max_msgs below the backlog would otherwise delete the
// unprocessed messages in the same instant, and holdfast would only
// report the loss afterwards.
//
// The server enforces max_msgs and max_bytes on an update only with
// discard old; max_age always. A stream that holds more than its
// max_msgs or max_bytes (lowered while discard was new) keeps discard new
// when discard old would delete such messages. max_msgs is judged by the
// messages held from the oldest unprocessed one on, interior deletes
// counted (see interiorDeletes); max_bytes by the stored size of the
// messages from it on (see removedByMaxBytes).
func keepLimitsThatWouldLoseMessages(ctx context.Context, s jetstream.Stream, have jetstream.StreamConfig, next *jetstream.StreamConfig) ([]string, error) {
	lowered := func(h, n int64) bool { return n > 0 && (h <= 0 || n < h) }
	// enforced: the server starts enforcing max_msgs and max_bytes as
	// they are, whatever they were.
	enforced := have.Discard != jetstream.DiscardOld && next.Discard == jetstream.DiscardOld
	msgs := (lowered(have.MaxMsgs, next.MaxMsgs) || enforced && next.MaxMsgs > 0) && next.Discard == jetstream.DiscardOld
	bytes := (lowered(have.MaxBytes, next.MaxBytes) || enforced && next.MaxBytes > 0) && next.Discard == jetstream.DiscardOld
	age := lowered(int64(have.MaxAge), int64(next.MaxAge))
	if !msgs && !bytes && !age {
		return nil, nil
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("cannot read stream %s: %w", have.Name, err)
	}
	st := info.State
	if st.Msgs == 0 {
		return nil, nil
	}
	msgs = msgs && st.Msgs > uint64(next.MaxMsgs)
	bytes = bytes && st.Bytes > uint64(next.MaxBytes)
	cutoff := time.Now().Add(-next.MaxAge)
	if !msgs && !bytes && (!age || !st.FirstTime.Before(cutoff)) {
		return nil, nil
	}
	var deleted *deletedSeqs

	var kept []string
	keep := func(field, value, consumer string, seq uint64) {
		raise := "the value"
		if enforced {
			// Discard new keeps the server from enforcing the limit.
			field, value, raise = "discard", `"old"`, field
			next.Discard, msgs, bytes = have.Discard, false, false
		}
		kept = append(kept, fmt.Sprintf("streams.%s.%s = %s not applied: it would delete at once messages consumer %s has not processed yet (from stream sequence %d); "+
			"holdfast keeps %s %s. Reload once the consumer has caught up (holdfast status), or raise %s; to drop them on purpose, set it with nats stream edit %s",
			have.Name, field, value, consumer, seq, field, limitValue(field, have), raise, have.Name))
	}
	// oldest is the consumer with the oldest unprocessed message: the
	// messages max_bytes removes are the oldest ones.
	var oldest struct {
		name string
		seq  uint64
	}
	lister := s.ListConsumers(ctx)
	for ci := range lister.Info() {
		if ci.Config.Durable == "" || ci.NumPending+uint64(ci.NumAckPending) == 0 {
			continue
		}
		first, t, err := firstUnprocessed(ctx, s, ci)
		if err != nil {
			return nil, err
		}
		if first == 0 {
			continue
		}
		if oldest.seq == 0 || first < oldest.seq {
			oldest.name, oldest.seq = ci.Name, first
		}
		if msgs {
			if deleted == nil {
				if deleted, err = interiorDeletes(ctx, s, st); err != nil {
					return nil, err
				}
			}
			// max_msgs keeps the newest messages: first goes when more
			// than that many are held from it on.
			if deleted.heldFrom(first) > uint64(next.MaxMsgs) {
				if keep("max_msgs", fmt.Sprint(next.MaxMsgs), ci.Name, first); !enforced {
					next.MaxMsgs, msgs = have.MaxMsgs, false
				}
			}
		}
		if age && t.Before(cutoff) {
			keep("max_age", next.MaxAge.String(), ci.Name, first)
			next.MaxAge, age = have.MaxAge, false
		}
	}
	if err := lister.Err(); err != nil {
		return nil, fmt.Errorf("cannot list the consumers of stream %s: %w", have.Name, err)
	}
	if bytes && oldest.seq != 0 {
		removed := oldest.seq <= st.FirstSeq
		if !removed {
			if removed, err = removedByMaxBytes(ctx, s, have.Storage, oldest.seq, next.MaxBytes); err != nil {
				return nil, err
			}
		}
		if removed {
			if keep("max_bytes", fmt.Sprint(next.MaxBytes), oldest.name, oldest.seq); !enforced {
				next.MaxBytes = have.MaxBytes
			}
		}
	}
	return kept, nil
}

// maxDeletedDetails is how many interior deletes interiorDeletes asks
// the server to list at most. A stream with more is judged as if all of
// them were before the oldest unprocessed message: that can hold back a
// max_msgs that would remove processed messages only, never apply one
// that removes an unprocessed one.
const maxDeletedDetails = 100_000

// deletedSeqs are a stream's interior deletes: the sequences between its
// first and last that it no longer holds.
type deletedSeqs struct {
	msgs, first, num uint64
	seqs             []uint64 // sorted; nil when not listed
}

// interiorDeletes lists st's interior deletes (not asked for when there
// are none, or more than maxDeletedDetails).
func interiorDeletes(ctx context.Context, s jetstream.Stream, st jetstream.StreamState) (*deletedSeqs, error) {
	d := &deletedSeqs{msgs: st.Msgs, first: st.FirstSeq, num: uint64(st.NumDeleted)}
	if d.num == 0 || d.num > maxDeletedDetails {
		return d, nil
	}
	info, err := s.Info(ctx, jetstream.WithDeletedDetails(true))
	if err != nil {
		return nil, fmt.Errorf("cannot read the deleted messages of stream %s: %w", s.CachedInfo().Config.Name, err)
	}
	d.seqs = slices.Clone(info.State.Deleted)
	slices.Sort(d.seqs)
	d.num = uint64(len(d.seqs))
	return d, nil
}

// heldFrom is how many messages the stream holds from sequence seq on:
// all of them, less those held before seq (the sequences from the first
// up to seq, less the deleted ones among them).
func (d *deletedSeqs) heldFrom(seq uint64) uint64 {
	if seq <= d.first {
		return d.msgs
	}
	span := seq - d.first
	gone := d.num // not listed: all taken as before seq
	if d.seqs != nil {
		n, _ := slices.BinarySearch(d.seqs, seq)
		gone = uint64(n)
	}
	before := span - min(gone, span)
	if before >= d.msgs {
		return 0
	}
	return d.msgs - before
}

// maxSizeWalk is how many messages removedByMaxBytes reads at most.
const maxSizeWalk = 10_000

// removedByMaxBytes reports whether max_bytes = limit removes the message
// at sequence from: the server removes the oldest messages until the
// stream's bytes fit, so it keeps from only when the messages from it on
// fit in limit. It reads them, up to maxSizeWalk; more than that counts
// as removed.
func removedByMaxBytes(ctx context.Context, s jetstream.Stream, storage jetstream.StorageType, from uint64, limit int64) (bool, error) {
	var sum int64
	for seq, n := from, 0; n < maxSizeWalk; n++ {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(">"))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("cannot read stream %s at sequence %d: %w", s.CachedInfo().Config.Name, seq, err)
		}
		if sum += storedSize(storage, m); sum > limit {
			return true, nil
		}
		seq = m.Sequence + 1
	}
	return true, nil
}

// storedSize is the size the server counts for a message in a stream's
// bytes (and max_bytes): its record in the file or memory store.
func storedSize(storage jetstream.StorageType, m *jetstream.RawStreamMsg) int64 {
	hdr := 0
	if len(m.Header) > 0 {
		hdr = len("NATS/1.0\r\n\r\n")
		for k, vs := range m.Header {
			for _, v := range vs {
				hdr += len(k) + len(": ") + len(v) + len("\r\n")
			}
		}
	}
	n := int64(len(m.Subject) + hdr + len(m.Data))
	if storage == jetstream.MemoryStorage {
		return n + 16 // sequence and time
	}
	if hdr > 0 {
		n += 4 // header length
	}
	return n + 30 // record length, sequence, time, subject length, hash
}

// holdBackLimits applies keepLimitsThatWouldLoseMessages to next and
// drops the limits it kept from changes: what Bootstrap and ConfigDiff
// both do with a stream's lowered limits.
func holdBackLimits(ctx context.Context, s jetstream.Stream, have jetstream.StreamConfig, next *jetstream.StreamConfig, changes []Change) (kept []string, rest []Change, err error) {
	kept, err = keepLimitsThatWouldLoseMessages(ctx, s, have, next)
	if err != nil {
		return nil, nil, err
	}
	rest = slices.DeleteFunc(changes, func(c Change) bool {
		return (c.Field == "max_msgs" && next.MaxMsgs == have.MaxMsgs) || (c.Field == "max_bytes" && next.MaxBytes == have.MaxBytes) ||
			(c.Field == "max_age" && next.MaxAge == have.MaxAge) || (c.Field == "discard" && next.Discard == have.Discard)
	})
	return kept, rest, nil
}

// limitValue is the current value of a limit, for the log.
func limitValue(field string, c jetstream.StreamConfig) string {
	switch field {
	case "max_msgs":
		return fmt.Sprint(c.MaxMsgs)
	case "max_bytes":
		return fmt.Sprint(c.MaxBytes)
	case "discard":
		return fmt.Sprintf("%q", strings.ToLower(strings.TrimPrefix(c.Discard.String(), "Discard")))
	}
	return c.MaxAge.String()
}

// firstUnprocessed returns the sequence and time of the oldest message
// consumer ci has not acknowledged (awaiting an ack, or not delivered yet
// and matching its filter), or 0 when the stream no longer holds one.
func firstUnprocessed(ctx context.Context, s jetstream.Stream, ci *jetstream.ConsumerInfo) (uint64, time.Time, error) {
	from := ci.Delivered.Stream + 1
	if ci.NumAckPending > 0 {
		from = ci.AckFloor.Stream + 1
	}
	filters := consumerFilters(ci.Config)
	if ci.NumAckPending > 0 {
		filters = []string{">"}
	}
	var seq uint64
	var t time.Time
	for _, f := range filters {
		m, err := s.GetMsg(ctx, from, jetstream.WithGetMsgSubject(f))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return 0, time.Time{}, fmt.Errorf("cannot read stream %s at sequence %d for consumer %s: %w", ci.Stream, from, ci.Name, err)
		}
		if seq == 0 || m.Sequence < seq {
			seq, t = m.Sequence, m.Time
		}
	}
	return seq, t, nil
}

// holdBackReplicas undoes in next a lowered replicas count and returns
// the line that says so, or "". holdfast raises a stream's replicas from
// its config but never lowers them: every node of a cluster applies its
// own config at its start or reload, so one node's file saying
// replicas = 1 (a copy of a single node's, a typo) would make the shared
// stream R1 on every node, each acknowledged message then on one disk.
// Lowering them is the operator's act, once, with nats stream edit.
func holdBackReplicas(have jetstream.StreamConfig, next *jetstream.StreamConfig, changes []Change, deadLetter bool) (kept string, rest []Change) {
	if next.Replicas >= have.Replicas {
		return "", changes
	}
	key := fmt.Sprintf("streams.%s.replicas = %d", have.Name, next.Replicas)
	if deadLetter {
		key = fmt.Sprintf("%d replicas for dead-letter stream %s (those of the streams it serves)", next.Replicas, have.Name)
	}
	kept = fmt.Sprintf("%s not applied: stream %s has %d replicas, and holdfast never lowers them (one node's config would take the copies of every acknowledged message away); "+
		"give every node the same replicas, or lower them on purpose once with nats stream edit %s --replicas %d",
		key, have.Name, have.Replicas, have.Name, next.Replicas)
	next.Replicas = have.Replicas
	return kept, slices.DeleteFunc(changes, func(c Change) bool { return c.Field == "replicas" })
}

// configuredFilters are the filters of the consumers cfg has on the
// stream of consumer name, but for name's own (">" for none).
func configuredFilters(cfg *config.Config, name string) []string {
	var out []string
	stream := cfg.Consumers[name].Stream
	for _, other := range cfg.ConsumerNames() {
		if cc := cfg.Consumers[other]; other != name && cc.Stream == stream {
			out = append(out, consumerFilters(jetstream.ConsumerConfig{FilterSubject: cc.FilterSubject})...)
		}
	}
	return out
}

// consumerFilters are the subjects a consumer config takes: its
// filter_subject or filter_subjects, or ">".
func consumerFilters(c jetstream.ConsumerConfig) []string {
	switch {
	case len(c.FilterSubjects) > 0:
		return c.FilterSubjects
	case c.FilterSubject != "":
		return []string{c.FilterSubject}
	}
	return []string{">"}
}

// takes reports whether a consumer with filters takes subject.
func takes(filters []string, subject string) bool {
	for _, f := range filters {
		if server.SubjectMatchesFilter(subject, f) {
			return true
		}
	}
	return false
}

// maxFilterSubjects is how many subjects holdBackFilter checks at most.
const maxFilterSubjects = 10_000

// holdBackFilter undoes in next a changed filter of a consumer of an
// interest or workqueue stream that leaves messages it has not processed
// to no consumer: on an interest stream the server deletes those at once,
// as it does any message no consumer takes; a workqueue stream keeps
// them for no one, until max_age removes them unseen. It returns the line that
// says so (naming the key, a subject and what to do), or "", and changes
// without the filter then. A stream with more than maxFilterSubjects
// subjects the filter leaves counts as losing messages. On a workqueue
// stream a subject that configured filters takes (configured: those of
// the config's other consumers of the stream) is not left to no one: a
// consumer created in the same bootstrap gets its messages.
func holdBackFilter(ctx context.Context, js jetstream.JetStream, stream string, have jetstream.ConsumerConfig, next *jetstream.ConsumerConfig, changes []Change,
	configured []string) (kept string, rest []Change, err error) {
	oldFilters, newFilters := consumerFilters(have), consumerFilters(*next)
	if slices.Equal(oldFilters, newFilters) {
		return "", changes, nil
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return "", nil, fmt.Errorf("cannot read stream %s: %w", stream, err)
	}
	retention := s.CachedInfo().Config.Retention
	switch retention {
	case jetstream.InterestPolicy:
	case jetstream.WorkQueuePolicy:
		newFilters = append(slices.Clone(newFilters), configured...)
	default:
		return "", changes, nil
	}
	c, err := js.Consumer(ctx, stream, have.Durable)
	if err != nil {
		return "", nil, fmt.Errorf("cannot read consumer %s on stream %s: %w", have.Durable, stream, err)
	}
	ci, err := c.Info(ctx)
	if err != nil {
		return "", nil, fmt.Errorf("cannot read consumer %s on stream %s: %w", have.Durable, stream, err)
	}
	if ci.NumPending+uint64(ci.NumAckPending) == 0 {
		return "", changes, nil
	}
	subject, seq, err := firstLeftToNoOne(ctx, s, ci, oldFilters, newFilters)
	if err != nil || seq == 0 {
		return "", changes, err
	}
	fate := `(retention "interest") the server would delete at once`
	if retention == jetstream.WorkQueuePolicy {
		fate = `(retention "workqueue") no consumer would ever process`
	}
	kept = fmt.Sprintf("consumers.%s.filter_subject = %q not applied: on stream %s %s the messages of %s "+
		"consumer %s has not processed yet (from stream sequence %d), which no other consumer takes; holdfast keeps its filter %s. "+
		"Reload once the consumer has processed them (holdfast status), or give them a consumer; to leave them on purpose, set it with nats consumer edit %s %s",
		have.Durable, next.FilterSubject, stream, fate, subject, have.Durable, seq, strings.Join(oldFilters, " "), stream, have.Durable)
	next.FilterSubject, next.FilterSubjects = have.FilterSubject, have.FilterSubjects
	return kept, slices.DeleteFunc(changes, func(c Change) bool { return c.Field == "filter_subject" }), nil
}

// firstLeftToNoOne returns a subject of the messages consumer ci has not
// processed that filters newFilters leave and no other consumer of the
// stream takes, with the sequence of its first such message; 0 for none.
func firstLeftToNoOne(ctx context.Context, s jetstream.Stream, ci *jetstream.ConsumerInfo, oldFilters, newFilters []string) (string, uint64, error) {
	type other struct {
		filters  []string
		ackFloor uint64
	}
	var others []other
	lister := s.ListConsumers(ctx)
	for oc := range lister.Info() {
		if oc.Name != ci.Name {
			others = append(others, other{consumerFilters(oc.Config), oc.AckFloor.Stream})
		}
	}
	if err := lister.Err(); err != nil {
		return "", 0, fmt.Errorf("cannot list the consumers of stream %s: %w", ci.Stream, err)
	}
	from := ci.AckFloor.Stream + 1
	checked := 0
	for _, f := range oldFilters {
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(f))
		if err != nil {
			return "", 0, fmt.Errorf("cannot read the subjects of stream %s: %w", ci.Stream, err)
		}
		for _, subject := range slices.Sorted(maps.Keys(info.State.Subjects)) {
			if takes(newFilters, subject) {
				continue
			}
			if checked++; checked > maxFilterSubjects {
				return subject, from, nil
			}
			m, err := s.GetMsg(ctx, from, jetstream.WithGetMsgSubject(subject))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue
			}
			if err != nil {
				return "", 0, fmt.Errorf("cannot read stream %s at sequence %d: %w", ci.Stream, from, err)
			}
			if !slices.ContainsFunc(others, func(o other) bool { return o.ackFloor < m.Sequence && takes(o.filters, subject) }) {
				return subject, m.Sequence, nil
			}
		}
	}
	return "", 0, nil
}
