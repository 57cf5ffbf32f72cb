package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/internal/subjects"
)

// ConfigDiff compares the configured streams, dead-letter streams and
// consumers with what the server has now, as Bootstrap would, without
// changing anything, and describes each that differs. A node applies its
// config only when it starts or reloads; in a cluster another node's
// start or reload with another config (or `nats stream edit`) changes the
// shared stream under it, and this node's next start or reload would
// change it back. A stream or consumer that does not answer is left out
// (the Monitor reports it).
func Diff(ctx context.Context, js jetstream.JetStream, cfg *config.Config) []string {
	var out []string
	eachExisting(ctx, js, cfg, func(s jetstream.Stream, want jetstream.StreamConfig, table string, deadLetter bool) {
		have := s.CachedInfo().Config
		if text := RestoringText(have); text != "" {
			out = append(out, text)
			return
		}
		if held, ok := subjects.Held(have.Name, have.Subjects, have.Metadata); ok {
			// Held back by a restore --replace before it deleted the
			// stream: running, or stopped before it changed anything.
			out = append(out, fmt.Sprintf("stream %s"+closedText+"holdfast restore --replace holds its subjects %v back while it saves and replaces it; "+
				"if no restore runs, one was stopped before it deleted anything: holdfast reload (or a restart) gives them back", have.Name, held))
			return
		}
		next, changes, err := diffStream(have, want)
		if err == nil {
			// Lowered replicas and limits this node's own start or
			// reload held back (Bootstrap) differ for that reason, not
			// because of another node: say so, as the start or reload did.
			if kept, rest := holdBackReplicas(have, &next, changes, deadLetter); kept != "" {
				out = append(out, kept)
				changes = rest
			}
		}
		if err == nil && !deadLetter {
			// A lowered limit this node's own start or reload held back
			// (Bootstrap) differs for that reason, not because of another
			// node: say so, as the start or reload did.
			var kept []string
			if kept, changes, err = holdBackLimits(ctx, s, have, &next, changes); err != nil {
				return
			}
			out = append(out, kept...)
		}
		out = append(out, diffText("stream", want.Name, table, changes, err)...)
	}, func(name string, cc *config.ConsumerConfig, have jetstream.ConsumerConfig) {
		next, changes, err := diffConsumer(cc.Stream, have, ConsumerSpec(name, cc))
		if err == nil {
			// A filter this node's own start or reload held back
			// (Bootstrap): say so, as the start or reload did.
			var kept string
			if kept, changes, err = holdBackFilter(ctx, js, cc.Stream, have, &next, changes, configuredFilters(cfg, name)); err != nil {
				return
			}
			if kept != "" {
				out = append(out, kept)
			}
		}
		out = append(out, diffText("consumer", name, "[consumers."+name+"]", changes, err)...)
	})
	return out
}

// closedText is what every Diff line about a stream that refuses
// publishes (its subjects held back by a restore) says.
const closedText = " takes no publishes: "

// Closed picks, from Diff's lines, those about streams that refuse every
// publish: not a drift to warn of, a stream out of service.
func Closed(diff []string) []string {
	var out []string
	for _, l := range diff {
		if strings.Contains(l, closedText) {
			out = append(out, l)
		}
	}
	return out
}

// diffText describes what differs between a stream or consumer on the
// server and this node's config.
func diffText(kind, name, table string, changes []Change, err error) []string {
	if err != nil {
		var de *DriftError
		if !errors.As(err, &de) {
			return []string{fmt.Sprintf("%s %s: %v", kind, name, err)}
		}
		return []string{fmt.Sprintf("%s %s: %s is %s on the server, %s in this node's config (%s): this node would refuse to start",
			kind, name, de.Field, de.Have, de.Want, table)}
	}
	if len(changes) == 0 {
		return nil
	}
	var fields []string
	for _, c := range changes {
		fields = append(fields, fmt.Sprintf("%s is %s on the server, %s in this node's config", c.Field, c.Old, c.New))
	}
	return []string{fmt.Sprintf("%s %s differs from this node's config (%s): %s; another node's config, a reload there or a client (nats %s edit) changed it, and this node's next start or reload changes it back: make the config the same on every node",
		kind, name, table, strings.Join(fields, ", "), kind)}
}
