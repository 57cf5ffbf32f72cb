package daemon

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/pipeline"
)

// DeadLetterView is a dead letter as the status page lists it
// (/deadletters.json): its place, why it failed, and the start of its
// payload as text.
type DeadLetterView struct {
	Stream          string    `json:"stream"`
	Seq             uint64    `json:"seq"`
	Consumer        string    `json:"consumer"`
	OriginalSubject string    `json:"original_subject"`
	OriginalStream  string    `json:"original_stream"`
	OriginalSeq     uint64    `json:"original_seq"`
	Deliveries      uint64    `json:"deliveries"`
	FailedAt        time.Time `json:"failed_at"`
	Reason          string    `json:"reason"`
	Size            int       `json:"size"`
	// Preview is the payload's first bytes as text (invalid UTF-8
	// replaced); Truncated says there is more.
	Preview   string `json:"preview"`
	Truncated bool   `json:"truncated"`
}

// DeadLetterDetail is one dead letter whole (/deadletter.json): its
// headers and its payload as text, up to detailBytes.
type DeadLetterDetail struct {
	DeadLetterView
	Header map[string][]string `json:"header"`
}

// How much of a payload the page gets, and how many dead letters.
const (
	previewBytes = 200
	detailBytes  = 64 << 10
	// MaxDeadLetterList is the most dead letters /deadletters.json lists.
	MaxDeadLetterList = 100
)

func viewOf(dl pipeline.DeadLetter, max int) DeadLetterView {
	v := DeadLetterView{Stream: dl.Stream, Seq: dl.Seq, Consumer: dl.Consumer, OriginalSubject: dl.OriginalSubject,
		OriginalStream: dl.OriginalStream, OriginalSeq: dl.OriginalSeq, Deliveries: dl.Deliveries, FailedAt: dl.FailedAt,
		Reason: dl.Error, Size: len(dl.Data)}
	data := dl.Data
	if len(data) > max {
		data, v.Truncated = data[:max], true
	}
	v.Preview = strings.ToValidUTF8(string(data), string(utf8.RuneError))
	return v
}

// deadLetters returns the newest dead letters, newest first: of consumer,
// or of every consumer when it is "", at most limit.
func (d *Daemon) deadLetters(ctx context.Context, consumer string, limit int) ([]DeadLetterView, error) {
	cfg := d.running.Load()
	streams := map[string]bool{}
	if consumer != "" {
		cc := cfg.Consumers[consumer]
		if cc == nil {
			return nil, fmt.Errorf("no consumer %s in the config", consumer)
		}
		if cc.DeadLetter == "" {
			return nil, nil
		}
		streams[cc.DeadLetter] = true
	} else {
		for name := range cfg.DeadLetterStreams() {
			streams[name] = true
		}
	}
	limit = min(max(limit, 1), MaxDeadLetterList)
	var out []DeadLetterView
	for _, name := range slices.Sorted(maps.Keys(streams)) {
		got, err := newestDeadLetters(ctx, d.srv.JetStream(), name, consumer, limit)
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
	}
	slices.SortFunc(out, func(a, b DeadLetterView) int { return b.FailedAt.Compare(a.FailedAt) })
	return out[:min(len(out), limit)], nil
}

// newestDeadLetters returns stream's newest dead letters, of consumer
// or of every consumer when it is "", newest first, at most limit.
func newestDeadLetters(ctx context.Context, js jetstream.JetStream, stream, consumer string, limit int) ([]DeadLetterView, error) {
	dls, err := pipeline.NewestDeadLetters(ctx, js, stream, consumer, limit)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	out := make([]DeadLetterView, 0, len(dls))
	for _, dl := range dls {
		out = append(out, viewOf(dl, previewBytes))
	}
	return out, err
}

// deadLetter returns one dead letter whole, if stream is a dead-letter
// stream of the config.
func (d *Daemon) deadLetter(ctx context.Context, stream string, seq uint64) (*DeadLetterDetail, error) {
	if _, ok := d.running.Load().DeadLetterStreams()[stream]; !ok {
		return nil, fmt.Errorf("%s is not a dead-letter stream of this holdfast", stream)
	}
	dl, err := pipeline.GetDeadLetter(ctx, d.srv.JetStream(), stream, seq)
	if err != nil {
		return nil, err
	}
	return &DeadLetterDetail{DeadLetterView: viewOf(dl, detailBytes), Header: dl.Header}, nil
}

// replayDeadLetter asks the workers to handle one dead letter again; it
// returns once the handler succeeded (the dead letter is then removed).
func (d *Daemon) replayDeadLetter(ctx context.Context, stream string, seq uint64) error {
	cfg := d.running.Load()
	if _, ok := cfg.DeadLetterStreams()[stream]; !ok {
		return fmt.Errorf("%s is not a dead-letter stream of this holdfast", stream)
	}
	dl, err := pipeline.GetDeadLetter(ctx, d.srv.JetStream(), stream, seq)
	if err != nil {
		return err
	}
	return pipeline.RequestReplay(ctx, d.srv.Conn(), dl, cfg.ReplayTimeout(dl.Consumer))
}

// replayAllDeadLetters replays every dead letter of consumer, oldest
// first, and stops at the first failure.
func (d *Daemon) replayAllDeadLetters(ctx context.Context, consumer string) (replayed int, err error) {
	cfg := d.running.Load()
	cc := cfg.Consumers[consumer]
	if cc == nil || cc.DeadLetter == "" {
		return 0, fmt.Errorf("consumer %s has no dead-letter stream", consumer)
	}
	var todo []pipeline.DeadLetter
	if err := pipeline.ListDeadLetters(ctx, d.srv.JetStream(), cc.DeadLetter, consumer, func(dl pipeline.DeadLetter) error {
		todo = append(todo, dl.ReplayRef())
		return nil
	}); err != nil {
		return 0, err
	}
	for _, dl := range todo {
		if err := pipeline.RequestReplay(ctx, d.srv.Conn(), dl, cfg.ReplayTimeout(consumer)); err != nil {
			return replayed, err
		}
		replayed++
	}
	return replayed, nil
}

// purgeDeadLetters deletes consumer's dead letters up to seq upto, and
// keeps its parked messages.
func (d *Daemon) purgeDeadLetters(ctx context.Context, consumer string, upto uint64) (pipeline.Purged, error) {
	cc := d.running.Load().Consumers[consumer]
	if cc == nil || cc.DeadLetter == "" {
		return pipeline.Purged{}, fmt.Errorf("consumer %s has no dead-letter stream", consumer)
	}
	if upto == 0 {
		return pipeline.Purged{}, errors.New("upto: give the last sequence to delete (the newest you have seen), so that dead letters stored since are kept")
	}
	return pipeline.PurgeDeadLetters(ctx, d.srv.JetStream(), cc.DeadLetter, consumer, upto)
}
