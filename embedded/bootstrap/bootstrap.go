package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/internal/settle"
	"github.com/holdfast-io/holdfast/internal/subjects"
)

// ErrDrift is the sentinel for a difference between the config and an
// existing stream or consumer that the server cannot apply in place.
var ErrDrift = errors.New("existing stream or consumer differs in a field that cannot be changed")

// DriftError names a field the server cannot change on an existing stream
// or consumer, and what the operator can do.
type DriftError struct {
	Kind, Name, Field string
	Have, Want        string
	Fix               string
}

func (e *DriftError) Error() string {
	return fmt.Sprintf("%s %s: %s is %s on the server but the config says %s; the server cannot change it in place: %s",
		e.Kind, e.Name, e.Field, e.Have, e.Want, e.Fix)
}

// Unwrap returns ErrDrift.
func (e *DriftError) Unwrap() error { return ErrDrift }

// PartialError is a bootstrap that stopped at a stream, dead-letter
// stream or consumer the server refused, after it had applied the
// configured streams in Streams (their settings are on the server, but
// for what it held back and logged).
type PartialError struct {
	Streams []string
	Err     error
}

func (e *PartialError) Error() string { return e.Err.Error() }

// Unwrap returns the refusal.
func (e *PartialError) Unwrap() error { return e.Err }

// Change is one field applied to an existing stream or consumer.
type Change struct {
	Field    string
	Old, New string
}

// StreamSpec turns the configured stream name into the server's stream
// config.
//
// Its max_msg_size is cfg.StreamMaxMsgSize: server.max_payload (more on a
// hub's stream of edge messages). The server itself accepts
// subjects.DeadLetterHeadroom more (see embedded.Options), so that a
// message of the largest allowed size still fits in its dead letter with the Holdfast-* headers
// added; configured streams refuse anything larger.
func StreamSpec(cfg *config.Config, name string) jetstream.StreamConfig {
	sc := cfg.Streams[name]
	c := jetstream.StreamConfig{
		Name:              name,
		Subjects:          slices.Clone(sc.Subjects),
		MaxMsgs:           sc.MaxMsgs,
		MaxBytes:          sc.MaxBytes.Bytes,
		MaxAge:            sc.MaxAge.Duration,
		Replicas:          sc.Replicas,
		Duplicates:        sc.DuplicateWindow.Duration,
		MaxMsgsPerSubject: -1,
		MaxConsumers:      -1,
		MaxMsgSize:        int32(cfg.StreamMaxMsgSize(name)),
	}
	c.Sources, c.Mirror = streamSources(sc)
	switch sc.Retention {
	case "interest":
		c.Retention = jetstream.InterestPolicy
	case "workqueue":
		c.Retention = jetstream.WorkQueuePolicy
	default:
		c.Retention = jetstream.LimitsPolicy
	}
	if sc.Discard == "new" {
		c.Discard = jetstream.DiscardNew
	}
	if sc.Storage == "memory" {
		c.Storage = jetstream.MemoryStorage
	}
	if cfg.TakesBarrier(name) {
		// The MQTT gate's barrier: a refused publish that comes back
		// after what devices published before it was stored (with group
		// commit, through the ingest, in the same order).
		c.Subjects = append(c.Subjects, subjects.Barrier(cfg.Server.Name, name))
	}
	if sc.GroupCommit {
		// holdfast's ingest answers the configured subjects and publishes
		// atomic batches behind the prefix; the transform stores them
		// under the configured subjects again (subjects.GroupCommitPrefix).
		c.Subjects = subjects.GroupCommitSubjects(name, c.Subjects)
		c.SubjectTransform = &jetstream.SubjectTransformConfig{Source: subjects.GroupCommit(name, ">"), Destination: ">"}
		c.AllowAtomicPublish = true
	}
	if cfg.TakesEdgeMessages(name) && c.Mirror == nil {
		// The edges forward their backlogs in atomic batches: one flush
		// on the hub per batch instead of one per message.
		c.AllowAtomicPublish = true
		// An edge reads its position, the last message it forwarded, at
		// every reconnect: a direct get answers with the message as
		// stored, where the API's answers it base64-encoded, a third
		// larger than the edge's max_payload lets over the leafnode.
		c.AllowDirect = true
	}
	return c
}

// DeadLetterSpec is the stream that holds dead letters for the given
// consumers: file storage, nothing ever removed by a limit (a full store
// makes the dead-letter publish fail, and the original then stays).
//
// replicas follows the streams it serves (see config.DeadLetterReplicas).
func DeadLetterSpec(name string, consumers []string, replicas int) jetstream.StreamConfig {
	subjs := make([]string, 0, len(consumers))
	for _, c := range consumers {
		subjs = append(subjs, subjects.DeadLetters(c))
	}
	sort.Strings(subjs)
	return jetstream.StreamConfig{
		Name:              name,
		Description:       "holdfast dead letters",
		Subjects:          subjs,
		Retention:         jetstream.LimitsPolicy,
		Discard:           jetstream.DiscardNew,
		Storage:           jetstream.FileStorage,
		Replicas:          max(replicas, 1),
		MaxMsgs:           -1,
		MaxBytes:          -1,
		MaxMsgsPerSubject: -1,
		MaxConsumers:      -1,
		MaxMsgSize:        -1,
		Duplicates:        2 * time.Minute,
	}
}

// ConsumerSpec turns a configured consumer into the server's durable pull
// consumer config. The retry backoff stays with holdfast (NakWithDelay):
// the server's BackOff would override ack_wait.
func ConsumerSpec(name string, cc *config.ConsumerConfig) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Metadata:      map[string]string{HandlerMetadata: cc.Handler},
		Durable:       name,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cc.AckWait.Duration,
		MaxDeliver:    cc.MaxDeliver,
		MaxAckPending: cc.MaxAckPending,
		FilterSubject: cc.FilterSubject,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		ReplayPolicy:  jetstream.ReplayInstantPolicy,
	}
}

// Bootstrap creates or updates every configured stream, dead-letter stream
// and consumer. It is idempotent, never deletes anything, logs every field
// it changes and stops at a difference the server cannot apply.
func Apply(ctx context.Context, js jetstream.JetStream, cfg *config.Config, log *slog.Logger) error {
	log = log.With("component", "bootstrap")
	// Right after the meta leader is elected, a stream another node just
	// created may have no leader of its own for a moment: its info times
	// out, a placement lacks peers. On one node, a server busy with a slow
	// disk may answer an API request after the client's timeout (the
	// workers' consumer lookup right after the bootstrap timed out so
	// under load, and holdfast run stopped at start-up). Those pass: every
	// step is idempotent, so it is tried again.
	clustered := cfg.Cluster.Enabled()
	return settle.Retry(ctx, func(err error) bool { return settle.Transient(err, clustered) }, func(attempt int, err error) {
		if clustered {
			log.Info("the cluster is settling: bootstrap tries again", "attempt", attempt, "err", err)
		} else {
			log.Warn("the server did not answer in time: bootstrap tries again", "attempt", attempt, "err", err)
		}
	}, func() error { return bootstrapOnce(ctx, js, cfg, log) })
}

func bootstrapOnce(ctx context.Context, js jetstream.JetStream, cfg *config.Config, log *slog.Logger) error {
	if err := checkDrift(ctx, js, cfg); err != nil {
		return err
	}
	var done []string
	for _, name := range cfg.StreamNames() {
		if err := ensureStreamRaced(ctx, js, StreamSpec(cfg, name), false, log); err != nil {
			return partial(done, err)
		}
		done = append(done, name)
	}
	if err := ensureRest(ctx, js, cfg, log); err != nil {
		return partial(done, err)
	}
	return nil
}

// partial is err, as a *PartialError when the streams in done were
// applied before it.
func partial(done []string, err error) error {
	if len(done) == 0 {
		return err
	}
	return &PartialError{Streams: done, Err: err}
}

// ensureRest is the bootstrap after the configured streams: the
// dead-letter streams and the consumers.
func ensureRest(ctx context.Context, js jetstream.JetStream, cfg *config.Config, log *slog.Logger) error {
	dls := cfg.DeadLetterStreams()
	if err := releaseMovedDeadLetters(ctx, js, dls, log); err != nil {
		return err
	}
	for _, name := range slices.Sorted(maps.Keys(dls)) {
		if err := ensureStreamRaced(ctx, js, DeadLetterSpec(name, dls[name], cfg.DeadLetterReplicas(name)), true, log); err != nil {
			return err
		}
	}
	for _, name := range cfg.ConsumerNames() {
		cc := cfg.Consumers[name]
		others := configuredFilters(cfg, name)
		err := ensureConsumer(ctx, js, cc.Stream, ConsumerSpec(name, cc), others, log)
		if errors.Is(err, jetstream.ErrConsumerExists) {
			// Another node of the cluster created it a moment ago with
			// other settings: compare with what it made, as at any start.
			err = ensureConsumer(ctx, js, cc.Stream, ConsumerSpec(name, cc), others, log)
		}
		if err != nil {
			return err
		}
	}
	warnUnconfiguredConsumers(ctx, js, cfg, log)
	return nil
}

// checkDrift returns every difference the server cannot apply in place
// (DriftError) between the config and the streams, dead-letter streams
// and consumers that exist, before anything is changed: else the streams
// sorted before the one that drifted would be updated while a reload says
// "not changed" and keeps the old config as the running one.
func checkDrift(ctx context.Context, js jetstream.JetStream, cfg *config.Config) error {
	return errors.Join(driftErrors(ctx, js, cfg)...)
}

// driftErrors are checkDrift's differences, one DriftError each.
func driftErrors(ctx context.Context, js jetstream.JetStream, cfg *config.Config) []error {
	var errs []error
	dls := cfg.DeadLetterStreams()
	eachExisting(ctx, js, cfg, func(s jetstream.Stream, want jetstream.StreamConfig, _ string, deadLetter bool) {
		if _, _, err := diffStream(s.CachedInfo().Config, want); err != nil {
			if deadLetter {
				deadLetterFix(err, dls[want.Name])
			}
			errs = append(errs, err)
		}
	}, func(name string, cc *config.ConsumerConfig, have jetstream.ConsumerConfig) {
		if _, _, err := diffConsumer(cc.Stream, have, ConsumerSpec(name, cc)); err != nil {
			errs = append(errs, err)
		}
		if was := have.Metadata[HandlerMetadata]; cc.Implied && cc.Handler == config.DefaultHandler && was != "" && was != cc.Handler {
			errs = append(errs, &ImpliedHandlerError{Consumer: name, Stream: cc.Stream, Was: was, Is: cc.Handler})
		}
	})
	return errs
}

// HandlerMetadata is the consumer metadata key that holds the handler
// holdfast's workers last ran the consumer with.
const HandlerMetadata = "holdfast.handler"

// ImpliedHandlerError is a consumer that ran with handler Was and that
// no [consumers.NAME] table configures now, so that it would take the
// built-in default one, Is: most likely a table removed to stop its
// workers, or a config file replaced by another.
type ImpliedHandlerError struct {
	Consumer, Stream string
	Was, Is          string
}

func (e *ImpliedHandlerError) Error() string {
	return fmt.Sprintf("the config file has no table for consumer %s, which ran with handler %q: without its [consumers.%s] table it would take the built-in default handler %q, "+
		"which acknowledges the messages waiting for it without the %s handler seeing them. Put the table back with handler = %q; "+
		"to stop its workers, write [consumers.%s] with stream = %q and workers = 0; to have the %s handler take its messages, write handler = %q in that table",
		e.Consumer, e.Was, e.Consumer, e.Is, e.Was, e.Was, e.Consumer, e.Stream, e.Is, e.Is)
}

// Unwrap returns ErrDrift.
func (e *ImpliedHandlerError) Unwrap() error { return ErrDrift }

// Drift describes, one line each, the differences between cfg and the
// streams and consumers that exist that the server cannot apply in place
// (see DriftError): what makes a reload of cfg, and a start, refuse it.
func Drift(ctx context.Context, js jetstream.JetStream, cfg *config.Config) []string {
	var out []string
	for _, err := range driftErrors(ctx, js, cfg) {
		out = append(out, err.Error())
	}
	return out
}

// deadLetterFix makes the fix of a DriftError of a dead-letter stream,
// which no [streams] table sets, name the dead_letter keys of consumers
// that use it: the stream may be a client's, never to be deleted for
// holdfast.
func deadLetterFix(err error, consumers []string) {
	var de *DriftError
	if !errors.As(err, &de) {
		return
	}
	keys := make([]string, len(consumers))
	for i, c := range consumers {
		keys[i] = "consumers." + c + ".dead_letter"
	}
	de.Fix = fmt.Sprintf("it is the dead-letter stream of %s, and holdfast keeps dead letters in a stream of limits retention and file storage: "+
		"set %s to a name no stream has (holdfast creates that stream), and stream %s stays as it is",
		strings.Join(keys, ", "), strings.Join(keys, " and "), de.Name)
}

// eachExisting calls stream for each configured stream and dead-letter
// stream (with the config table that sets it, and whether it holds dead
// letters) and consumer for each configured consumer, with what the
// server has now; those missing or not answering are left out (created
// later, or reported by the Monitor).
func eachExisting(ctx context.Context, js jetstream.JetStream, cfg *config.Config,
	stream func(s jetstream.Stream, want jetstream.StreamConfig, table string, deadLetter bool),
	consumer func(name string, cc *config.ConsumerConfig, have jetstream.ConsumerConfig)) {
	check := func(want jetstream.StreamConfig, table string, deadLetter bool) {
		if s, err := js.Stream(ctx, want.Name); err == nil {
			stream(s, want, table, deadLetter)
		}
	}
	for _, name := range cfg.StreamNames() {
		check(StreamSpec(cfg, name), "[streams."+name+"]", false)
	}
	dls := cfg.DeadLetterStreams()
	for _, name := range slices.Sorted(maps.Keys(dls)) {
		check(DeadLetterSpec(name, dls[name], cfg.DeadLetterReplicas(name)), "the dead letters of "+strings.Join(dls[name], ", "), true)
	}
	for _, name := range cfg.ConsumerNames() {
		cc := cfg.Consumers[name]
		if have, err := consumerConfig(ctx, js, cc.Stream, name); err == nil {
			consumer(name, cc, have)
		}
	}
}

// consumerConfig is the config of durable consumer name on stream, a pull
// or a push consumer (which js.Consumer refuses to read).
func consumerConfig(ctx context.Context, js jetstream.JetStream, stream, name string) (jetstream.ConsumerConfig, error) {
	c, err := js.Consumer(ctx, stream, name)
	if errors.Is(err, jetstream.ErrNotPullConsumer) {
		pc, perr := js.PushConsumer(ctx, stream, name)
		if perr != nil {
			return jetstream.ConsumerConfig{}, perr
		}
		return pc.CachedInfo().Config, nil
	}
	if err != nil {
		return jetstream.ConsumerConfig{}, err
	}
	return c.CachedInfo().Config, nil
}

// warnUnconfiguredConsumers logs each durable consumer of a configured
// interest or workqueue stream that the config does not name (removed
// from the file, or made by a client). holdfast never deletes it, and on
// such a stream it holds every message it has not acknowledged (on a
// workqueue stream the messages of its filter go to it alone): nothing
// else would tell that they are kept, or not processed, for it.
func warnUnconfiguredConsumers(ctx context.Context, js jetstream.JetStream, cfg *config.Config, log *slog.Logger) {
	for _, name := range cfg.StreamNames() {
		sc := cfg.Streams[name]
		if sc.Retention != "interest" && sc.Retention != "workqueue" {
			continue
		}
		s, err := js.Stream(ctx, name)
		if err != nil {
			continue
		}
		lister := s.ListConsumers(ctx)
		for ci := range lister.Info() {
			if cc := cfg.Consumers[ci.Name]; ci.Config.Durable == "" || (cc != nil && cc.Stream == name) {
				continue
			}
			log.Warn("consumer not in the config: holdfast leaves it, and the stream keeps for it every message it has not acknowledged (on a workqueue stream the messages of its filter go to it alone); remove it with nats consumer rm if nothing uses it",
				"stream", name, "consumer", ci.Name, "retention", sc.Retention, "pending", ci.NumPending, "ack_pending", ci.NumAckPending)
		}
		if err := lister.Err(); err != nil {
			log.Debug("cannot list the stream's consumers", "stream", name, "err", err)
		}
	}
}

// releaseMovedDeadLetters handles a consumer whose dead_letter moved to
// another stream: the stream that holds its dead-letter subject
// (dlq.<CONSUMER>.>) today gives that subject up, so that the new
// dead-letter stream can take it. Nothing is deleted: the dead letters
// already there stay in the old stream (logged, with where to find them).
// Otherwise creating the new stream fails on overlapping subjects and
// holdfast cannot start.
func releaseMovedDeadLetters(ctx context.Context, js jetstream.JetStream, dls map[string][]string, log *slog.Logger) error {
	for _, target := range slices.Sorted(maps.Keys(dls)) {
		for _, consumer := range dls[target] {
			subj := subjects.DeadLetters(consumer)
			names := js.StreamNames(ctx, jetstream.WithStreamListSubject(subj))
			var owners []string
			for n := range names.Name() {
				if n != target {
					owners = append(owners, n)
				}
			}
			if err := names.Err(); err != nil {
				return fmt.Errorf("cannot look up the stream holding %s: %w", subj, err)
			}
			for _, owner := range owners {
				s, err := js.Stream(ctx, owner)
				if err != nil {
					return fmt.Errorf("cannot read stream %s: %w", owner, err)
				}
				info := s.CachedInfo()
				if !slices.Contains(info.Config.Subjects, subj) {
					return fmt.Errorf("stream %s has subjects %v, which overlap %s, the dead-letter subject of consumer %s: "+
						"change that stream's subjects so that they leave %s to holdfast", owner, info.Config.Subjects, subj, consumer, subj)
				}
				next := info.Config
				next.Subjects = slices.DeleteFunc(slices.Clone(next.Subjects), func(x string) bool { return x == subj })
				if len(next.Subjects) == 0 {
					next.Subjects = []string{subjects.Retired(owner)}
				}
				if _, err := js.UpdateStream(ctx, next); err != nil {
					return fmt.Errorf("cannot release %s from stream %s for the new dead-letter stream %s: %w", subj, owner, target, err)
				}
				log.Warn("dead letters of the consumer moved to another stream: the old stream keeps its dead letters but takes no new ones",
					"consumer", consumer, "old", owner, "new", target, "subject", subj, "messages_in_old_stream", info.State.Msgs,
					"hint", fmt.Sprintf("nats stream view %s; delete it once handled", owner))
			}
		}
	}
	return nil
}

// ensureStreamRaced is ensureStream, once more when the create lost a
// race: in a cluster all nodes bootstrap at once, one creates, and a
// create with other settings from another node finds the name taken; it
// then compares with what exists, as at any start (updates what can be
// updated, reports drift, never deletes).
func ensureStreamRaced(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig, deadLetter bool, log *slog.Logger) error {
	err := ensureStream(ctx, js, want, deadLetter, log)
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		err = ensureStream(ctx, js, want, deadLetter, log)
	}
	return err
}

func ensureStream(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig, deadLetter bool, log *slog.Logger) error {
	s, err := js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if _, err := js.CreateStream(ctx, want); err != nil {
			return fmt.Errorf("cannot create stream %s: %w%s", want.Name, err, overlapHint(ctx, js, want, deadLetter, err))
		}
		log.Info("stream created", "stream", want.Name, "subjects", want.Subjects, "retention", want.Retention.String(),
			"storage", want.Storage.String(), "max_msgs", want.MaxMsgs, "max_bytes", want.MaxBytes, "max_age", want.MaxAge)
		return nil
	}
	if err != nil {
		return fmt.Errorf("cannot read stream %s: %w", want.Name, err)
	}
	have := s.CachedInfo().Config
	if text := RestoringText(have); text != "" {
		log.Error(text, "stream", want.Name)
	}
	if deadLetter {
		// Keep subjects of consumers no longer configured: their dead
		// letters stay reachable.
		for _, subj := range have.Subjects {
			if !slices.Contains(want.Subjects, subj) && !strings.HasPrefix(subj, subjects.RetiredPrefix) {
				want.Subjects = append(want.Subjects, subj)
			}
		}
		sort.Strings(want.Subjects)
	}
	next, changes, err := diffStream(have, want)
	if err != nil {
		return err
	}
	if kept, rest := holdBackReplicas(have, &next, changes, deadLetter); kept != "" {
		log.Error(kept, "stream", want.Name)
		changes = rest
	}
	if !deadLetter {
		var kept []string
		kept, changes, err = holdBackLimits(ctx, s, have, &next, changes)
		if err != nil {
			return err
		}
		for _, k := range kept {
			log.Error(k, "stream", want.Name)
		}
	}
	if len(changes) == 0 {
		log.Debug("stream up to date", "stream", want.Name)
		return nil
	}
	if _, err := js.UpdateStream(ctx, next); err != nil {
		return fmt.Errorf("cannot update stream %s (%s): %w%s", want.Name, describe(changes), err, overlapHint(ctx, js, want, deadLetter, err))
	}
	for _, c := range changes {
		log.Info("stream updated", "stream", want.Name, "field", c.Field, "old", c.Old, "new", c.New)
	}
	return nil
}

// errSubjectOverlap is the server's error code for a stream whose
// subjects overlap another's.
const errSubjectOverlap jetstream.ErrorCode = 10065

// overlapHint names, for the server's "subjects overlap with an existing
// stream", the streams that hold the subjects and what to do; "" for any
// other error. The configured streams cannot overlap one another (Validate
// refuses that), so the other is a stream the config no longer names (one
// renamed in the file: holdfast never deletes it or moves its messages) or
// one a client made. The server's error names neither.
func overlapHint(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig, deadLetter bool, err error) string {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != errSubjectOverlap {
		return ""
	}
	var others []string
	seen := map[string]bool{want.Name: true}
	for _, subj := range want.Subjects {
		names := js.StreamNames(ctx, jetstream.WithStreamListSubject(subj))
		for n := range names.Name() {
			if seen[n] {
				continue
			}
			seen[n] = true
			desc := n
			if s, err := js.Stream(ctx, n); err == nil {
				info := s.CachedInfo()
				desc = fmt.Sprintf("%s (subjects %v, %d messages)", n, info.Config.Subjects, info.State.Msgs)
			}
			others = append(others, desc)
		}
	}
	key := fmt.Sprintf("streams.%s.subjects = %v", want.Name, want.Subjects)
	if deadLetter {
		key = fmt.Sprintf("the dead-letter subjects %v of stream %s", want.Subjects, want.Name)
	}
	if len(others) == 0 {
		return fmt.Sprintf(": %s overlap a stream outside the config (nats stream ls)", key)
	}
	return fmt.Sprintf(": %s overlap stream %s, which the config does not name (renamed in the file? holdfast never deletes a stream or moves its messages); "+
		"process or back up its messages, then remove it (nats stream rm) or give it other subjects (nats stream edit), or choose other subjects",
		key, strings.Join(others, ", "))
}

// diffStream returns have with the managed fields of want applied, and the
// changes. Fields holdfast does not manage (description, limits set by an
// operator with the nats CLI) are kept.
// RestoringText describes a stream a restore left unfinished (see
// subjects.Restoring), or is "" for any other.
func RestoringText(have jetstream.StreamConfig) string {
	backup, ok := subjects.Restoring(have.Name, have.Subjects, have.Metadata)
	if !ok {
		return ""
	}
	if backup == "" {
		backup = "a backup"
	}
	return fmt.Sprintf("stream %s"+closedText+"it is a restore from %s that did not finish (or is still running), part of the backup at most; holdfast keeps its subjects held back. "+
		"Run the restore again: holdfast restore --replace %s (or, to put back the stream it replaced, the holdfast-replaced-%s-* copy that restore named)",
		have.Name, backup, backup, have.Name)
}

func diffStream(have, want jetstream.StreamConfig) (jetstream.StreamConfig, []Change, error) {
	drift := func(field, h, w, fix string) error {
		return &DriftError{Kind: "stream", Name: want.Name, Field: field, Have: h, Want: w, Fix: fix}
	}
	if have.Retention != want.Retention {
		return have, nil, drift("retention", have.Retention.String(), want.Retention.String(),
			fmt.Sprintf("set streams.%s.retention back, or back up the stream (nats stream backup), delete it and restart holdfast to recreate it", want.Name))
	}
	if have.Storage != want.Storage {
		return have, nil, drift("storage", have.Storage.String(), want.Storage.String(),
			fmt.Sprintf("set streams.%s.storage back, or back up the stream (nats stream backup), delete it and restart holdfast to recreate it", want.Name))
	}
	next := have
	var changes []Change
	if _, ok := subjects.Restoring(want.Name, have.Subjects, have.Metadata); ok {
		// Part of a backup a restore left unfinished: its subjects stay
		// held back (RestoringText says so) until a restore replaces it.
	} else if !slices.Equal(have.Subjects, want.Subjects) {
		record(&changes, "subjects", have.Subjects, want.Subjects)
		next.Subjects = want.Subjects
	}
	set(&changes, "discard", &next.Discard, want.Discard)
	set(&changes, "max_msgs", &next.MaxMsgs, want.MaxMsgs)
	set(&changes, "max_bytes", &next.MaxBytes, want.MaxBytes)
	set(&changes, "max_age", &next.MaxAge, want.MaxAge)
	set(&changes, "replicas", &next.Replicas, want.Replicas)
	set(&changes, "max_msg_size", &next.MaxMsgSize, want.MaxMsgSize)
	set(&changes, "duplicate_window", &next.Duplicates, want.Duplicates)
	if err := diffSources(&next, want, &changes); err != nil {
		return have, nil, err
	}
	set(&changes, "allow_atomic", &next.AllowAtomicPublish, want.AllowAtomicPublish)
	if want.AllowDirect {
		// Set where holdfast needs it; an operator's elsewhere is kept.
		set(&changes, "allow_direct", &next.AllowDirect, true)
	}
	if transform(have.SubjectTransform) != transform(want.SubjectTransform) {
		record(&changes, "subject_transform", transform(have.SubjectTransform), transform(want.SubjectTransform))
		next.SubjectTransform = want.SubjectTransform
	}
	// An operator may have switched the stream to async persistence with
	// the nats CLI; that silently voids jetstream.sync = "always".
	set(&changes, "persist_mode", &next.PersistMode, jetstream.DefaultPersistMode)
	return next, changes, nil
}

// transform describes a subject transform for comparison and the log.
func transform(t *jetstream.SubjectTransformConfig) string {
	if t == nil {
		return ""
	}
	return t.Source + " -> " + t.Destination
}

// set makes *field want, recording the change, when they differ.
func set[T comparable](changes *[]Change, name string, field *T, want T) {
	if *field != want {
		record(changes, name, *field, want)
		*field = want
	}
}

// record notes that field changes from old to new.
func record(changes *[]Change, field string, old, new any) {
	*changes = append(*changes, Change{Field: field, Old: fmt.Sprint(old), New: fmt.Sprint(new)})
}

func describe(changes []Change) string {
	var s string
	for i, c := range changes {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%s %s → %s", c.Field, c.Old, c.New)
	}
	return s
}

// ensureConsumer creates or updates the consumer want of stream; others
// are the filters of the other consumers the config has on the stream
// (see holdBackFilter).
func ensureConsumer(ctx context.Context, js jetstream.JetStream, stream string, want jetstream.ConsumerConfig, others []string, log *slog.Logger) error {
	have, err := consumerConfig(ctx, js, stream, want.Durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		if _, err := js.CreateConsumer(ctx, stream, want); err != nil {
			return fmt.Errorf("cannot create consumer %s on stream %s: %w%s", want.Durable, stream, err, workQueueHint(ctx, js, stream, want, err))
		}
		log.Info("consumer created", "consumer", want.Durable, "stream", stream, "ack_wait", want.AckWait,
			"max_deliver", want.MaxDeliver, "max_ack_pending", want.MaxAckPending, "filter_subject", want.FilterSubject)
		return nil
	}
	if err != nil {
		return fmt.Errorf("cannot read consumer %s on stream %s: %w", want.Durable, stream, err)
	}
	next, changes, err := diffConsumer(stream, have, want)
	if err != nil {
		return err
	}
	kept, changes, err := holdBackFilter(ctx, js, stream, have, &next, changes, others)
	if err != nil {
		return err
	}
	if kept != "" {
		log.Error(kept, "consumer", want.Durable)
	}
	if len(changes) == 0 {
		log.Debug("consumer up to date", "consumer", want.Durable)
		return nil
	}
	if _, err := js.UpdateConsumer(ctx, stream, next); err != nil {
		return fmt.Errorf("cannot update consumer %s (%s): %w%s", want.Durable, describe(changes), err, workQueueHint(ctx, js, stream, want, err))
	}
	for _, ch := range changes {
		log.Info("consumer updated", "consumer", want.Durable, "field", ch.Field, "old", ch.Old, "new", ch.New)
	}
	return nil
}

// The server's error codes for a consumer of a workqueue stream whose
// filter is not its own: "multiple non-filtered consumers not allowed on
// workqueue stream" and "filtered consumer not unique on workqueue
// stream".
const (
	errWorkQueueUnfiltered jetstream.ErrorCode = 10099
	errWorkQueueNotUnique  jetstream.ErrorCode = 10100
)

// workQueueHint names, for the server's refusal of a consumer on a
// workqueue stream, the stream's other consumers and what to do; "" for
// any other error. The configured consumers cannot overlap one another
// (Validate refuses that), so the other is a consumer the config no
// longer names (one renamed in the file: holdfast never deletes it, and
// it holds the messages of its filter) or one a client made.
func workQueueHint(ctx context.Context, js jetstream.JetStream, stream string, want jetstream.ConsumerConfig, err error) string {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || (apiErr.ErrorCode != errWorkQueueUnfiltered && apiErr.ErrorCode != errWorkQueueNotUnique) {
		return ""
	}
	s, serr := js.Stream(ctx, stream)
	if serr != nil {
		return ""
	}
	overlaps := func(c jetstream.ConsumerConfig) bool {
		for _, a := range consumerFilters(c) {
			for _, b := range consumerFilters(want) {
				if server.SubjectsCollide(a, b) {
					return true
				}
			}
		}
		return false
	}
	var others, rm []string
	lister := s.ListConsumers(ctx)
	for ci := range lister.Info() {
		if ci.Name == want.Durable || !overlaps(ci.Config) {
			continue
		}
		others = append(others, fmt.Sprintf("consumer %s (filter %q, %d messages pending, %d awaiting an ack)",
			ci.Name, strings.Join(consumerFilters(ci.Config), " "), ci.NumPending, ci.NumAckPending))
		rm = append(rm, fmt.Sprintf("nats consumer rm %s %s", stream, ci.Name))
	}
	if len(others) == 0 {
		return ""
	}
	return fmt.Sprintf(": [consumers.%s] (filter_subject %q) overlaps %s on stream %s, which the config does not name (renamed in the file? holdfast never deletes a consumer); "+
		"retention \"workqueue\" gives a message to one consumer only, and the messages of its filter wait for it: name it in the config again, "+
		"or let it process them, then remove it (%s)",
		want.Durable, want.FilterSubject, strings.Join(others, ", "), stream, strings.Join(rm, "; "))
}

func diffConsumer(stream string, have, want jetstream.ConsumerConfig) (jetstream.ConsumerConfig, []Change, error) {
	fix := fmt.Sprintf("set it back in [consumers.%s], or delete the consumer (nats consumer rm %s %s: its position is lost, the messages stay) and restart holdfast",
		want.Durable, stream, want.Durable)
	drift := func(field, h, w string) error {
		return &DriftError{Kind: "consumer", Name: want.Durable, Field: field, Have: h, Want: w, Fix: fix}
	}
	if have.DeliverSubject != "" {
		return have, nil, &DriftError{Kind: "consumer", Name: want.Durable, Field: "deliver_subject",
			Have: fmt.Sprintf("%q (a push consumer)", have.DeliverSubject), Want: "none (holdfast's workers pull)",
			Fix: fmt.Sprintf("leave it out of [consumers] and its clients keep using it, or delete it (nats consumer rm %s %s: its position is lost, the messages stay) and restart holdfast",
				stream, want.Durable)}
	}
	if have.AckPolicy != want.AckPolicy {
		return have, nil, drift("ack_policy", have.AckPolicy.String(), want.AckPolicy.String())
	}
	if have.DeliverPolicy != want.DeliverPolicy {
		return have, nil, drift("deliver_policy", have.DeliverPolicy.String(), want.DeliverPolicy.String())
	}
	if len(have.BackOff) > 0 {
		return have, nil, drift("backoff (server side)", fmt.Sprint(have.BackOff), "none (holdfast applies backoff itself)")
	}
	next := have
	var changes []Change
	set(&changes, "ack_wait", &next.AckWait, want.AckWait)
	set(&changes, "max_deliver", &next.MaxDeliver, want.MaxDeliver)
	set(&changes, "max_ack_pending", &next.MaxAckPending, want.MaxAckPending)
	if have.FilterSubject != want.FilterSubject || len(have.FilterSubjects) > 0 {
		record(&changes, "filter_subject", have.FilterSubject+fmt.Sprint(have.FilterSubjects), want.FilterSubject)
		next.FilterSubject = want.FilterSubject
		next.FilterSubjects = nil
	}
	// The server's own metadata (its version, _nats.*) is kept.
	var meta map[string]string
	for _, k := range slices.Sorted(maps.Keys(want.Metadata)) {
		v := want.Metadata[k]
		if have.Metadata[k] == v {
			continue
		}
		record(&changes, "metadata "+k, have.Metadata[k], v)
		if meta == nil {
			meta = maps.Clone(have.Metadata)
			if meta == nil {
				meta = map[string]string{}
			}
		}
		meta[k] = v
	}
	if meta != nil {
		next.Metadata = meta
	}
	return next, changes, nil
}

// StreamDrift checks a stream's configuration as the server would have it
// (read from a backup, say) against cfg: a *DriftError for a field the
// server cannot change in place (retention, storage), which would stop
// holdfast's next start; nil when it has none, or cfg does not make the
// stream.
func StreamDrift(cfg *config.Config, have jetstream.StreamConfig) error {
	var want jetstream.StreamConfig
	consumers := cfg.DeadLetterStreams()[have.Name]
	if _, ok := cfg.Streams[have.Name]; ok {
		want = StreamSpec(cfg, have.Name)
	} else if consumers != nil {
		want = DeadLetterSpec(have.Name, consumers, cfg.DeadLetterReplicas(have.Name))
	} else {
		return nil
	}
	_, _, err := diffStream(have, want)
	if consumers != nil {
		deadLetterFix(err, consumers)
	}
	return err
}

// ConsumerDrift is StreamDrift for a durable consumer of stream (ack
// policy, deliver policy, a server-side backoff).
func ConsumerDrift(cfg *config.Config, stream string, have jetstream.ConsumerConfig) error {
	cc := cfg.Consumers[have.Durable]
	if cc == nil || cc.Stream != stream {
		return nil
	}
	_, _, err := diffConsumer(stream, have, ConsumerSpec(have.Durable, cc))
	return err
}
