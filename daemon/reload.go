package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/embedded/bootstrap"
	"github.com/holdfast-io/holdfast/internal/subjects"
)

// ReloadReply is the daemon's answer on subjects.Reload.
type ReloadReply struct {
	ServerName string `json:"server_name"`
	PID        int    `json:"pid"`
	// ConfigFile is the file a reload reads ("" for the built-in
	// defaults).
	ConfigFile string `json:"config_file"`
	// Plan is what a reload of the file as it is now would do; nil when
	// the file cannot be loaded, and Error says why.
	Plan *ReloadPlan `json:"plan,omitempty"`
	// Drift are the differences between the file and the server that
	// the server cannot apply in place (a stream's retention or
	// storage): a reload of the file, and a start, would be refused.
	// Only a request of AskDrift gets them.
	Drift []string `json:"drift,omitempty"`
	Error string   `json:"error,omitempty"`
	// LastReload is what the last reload did; nil before the first.
	LastReload *ReloadResult `json:"last_reload,omitempty"`
	// Recent are what the last reloads did, oldest first (LastReload
	// among them): reloads asked for at about the same time may run one
	// after the other before an asker reads the result, and each asker
	// wants the first that started after its signal.
	Recent []ReloadResult `json:"recent,omitempty"`
}

// ReloadResult is what a reload did.
type ReloadResult struct {
	// Seq counts the reloads since start, this one included.
	Seq uint64 `json:"seq"`
	// Started is when the reload began: after the SIGHUP that asked
	// for it, or after one that arrived while the reload before it ran.
	Started time.Time  `json:"started"`
	Time    time.Time  `json:"time"`
	Plan    ReloadPlan `json:"plan"`
	// Error says why the reload was refused or not wholly applied; ""
	// when it applied the whole plan.
	Error string `json:"error,omitempty"`
	// HeldBack are the changes of the plan the reload kept from the
	// server on purpose (a lowered limit that would delete unprocessed
	// messages, lowered replicas).
	HeldBack []HeldBack `json:"held_back,omitempty"`
	// NotApplied are the changes of the plan to consumers whose workers
	// could not start with them (an exec command not installed): the
	// next reload tries them again.
	NotApplied []HeldBack `json:"not_applied,omitempty"`
	// SetBack are what differed on the server from the config before the
	// reload and no longer does (bootstrap.Diff): a stream or consumer
	// someone changed, subjects a stopped restore held back.
	SetBack []string `json:"set_back,omitempty"`
}

// HeldBack is a key of a reload's plan it did not apply, and why
// ("KEY = VALUE not applied: ...").
type HeldBack struct {
	Key string `json:"key"`
	Why string `json:"why"`
}

// keptReloads is how many reloads' results subjects.Reload answers with.
const keptReloads = 16

// recordReload keeps what a reload that began at started did for
// subjects.Reload. It runs on the signal loop only.
func (d *Daemon) recordReload(started time.Time, plan ReloadPlan, err error, setBack []string, notApplied []HeldBack, heldBack ...HeldBack) {
	r := ReloadResult{Seq: 1, Started: started, Time: time.Now(), Plan: plan, HeldBack: heldBack, NotApplied: notApplied, SetBack: setBack}
	var kept []ReloadResult
	if p := d.reloads.Load(); p != nil {
		kept = *p
		r.Seq = kept[len(kept)-1].Seq + 1
	}
	if err != nil {
		r.Error = err.Error()
	}
	kept = append(kept[max(0, len(kept)+1-keptReloads):len(kept):len(kept)], r)
	d.reloads.Store(&kept)
}

// lastReloads returns the kept reloads and the last of them (nil, nil
// before the first).
func (d *Daemon) lastReloads() ([]ReloadResult, *ReloadResult) {
	p := d.reloads.Load()
	if p == nil {
		return nil, nil
	}
	return *p, &(*p)[len(*p)-1]
}

// loadForReload reads the config file as a reload does, against the
// running config.
func (d *Daemon) loadForReload() (*config.Config, string, error) {
	next, source, err := config.LoadForReload(d.configFile, d.running.Load())
	if err != nil {
		return nil, source, fmt.Errorf("the config has problems: %w", err)
	}
	return next, source, nil
}

// ReloadFromFile reads the config file again (Options.ConfigFile) and
// reloads it (see Reload). A file with problems is refused as a whole:
// the running config stays.
func (d *Daemon) ReloadFromFile(ctx context.Context) error {
	started := time.Now()
	next, source, err := d.loadForReload()
	if err != nil {
		d.log.Error("reload refused: the config has problems; still running the previous one", "err", err)
		d.recordReload(started, ReloadPlan{}, err, nil, nil)
		// Said until a reload reads the file: a SIGHUP's sender sees no
		// answer, and the next start would fail on this file.
		file := "the config file"
		if source != "" && !strings.Contains(err.Error(), source) {
			file += " " + source
		}
		w := fmt.Sprintf("the reload at %s refused %s, and holdfast would not start with it; it runs the config it had: %v; fix the file and reload",
			started.Format(time.TimeOnly), file, err)
		d.fileRefused.Store(&w)
		return err
	}
	d.fileRefused.Store(nil)
	return d.reload(ctx, next, started)
}

// AskDrift is the request on subjects.Reload whose answer also holds the
// drift (ReloadReply.Drift), which takes a look at every stream and
// consumer: `holdfast reload` asks without it while it waits.
const AskDrift = "drift"

// serveReload answers subjects.Reload on the daemon's in-process connection.
func serveReload(d *Daemon) (*nats.Subscription, error) {
	subject := subjects.Reload(d.running.Load().Server.Name)
	sub, err := d.srv.Conn().Subscribe(subject, func(m *nats.Msg) {
		recent, last := d.lastReloads()
		reply := ReloadReply{ServerName: d.running.Load().Server.Name, PID: os.Getpid(), LastReload: last, Recent: recent}
		next, source, err := d.loadForReload()
		reply.ConfigFile = source
		if source != "" && !filepath.IsAbs(source) {
			// Relative to this process's directory, which the asker
			// (holdfast reload, in another directory) does not know: it
			// refused a reload of this very file as "another file".
			if abs, err := filepath.Abs(source); err == nil {
				reply.ConfigFile = abs
			}
		}
		if err != nil {
			reply.Error = err.Error()
		} else {
			plan := PlanReload(d.running.Load(), next)
			reply.Plan = &plan
			if string(m.Data) == AskDrift {
				ctx, cancel := context.WithTimeout(context.Background(), configDiffEvery)
				reply.Drift = bootstrap.Drift(ctx, d.srv.JetStream(), next)
				cancel()
			}
		}
		data, err := json.Marshal(reply)
		if err != nil {
			d.log.Error("cannot encode the reload plan", "err", err)
			return
		}
		if err := m.Respond(data); err != nil && !errors.Is(err, nats.ErrMsgNoReply) {
			d.log.Warn("cannot answer a reload plan request", "err", err)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("cannot serve %s: %w", subject, err)
	}
	return sub, nil
}

// serveFlush answers subjects.Flush on the daemon's in-process connection
// after a flush of the store (jetstream.commit_window): empty, or the
// flush's error.
func serveFlush(d *Daemon) (*nats.Subscription, error) {
	subject := subjects.Flush(d.running.Load().Server.Name)
	sub, err := d.srv.Conn().Subscribe(subject, func(m *nats.Msg) {
		go func() {
			var data []byte
			if err := d.srv.Flush(); err != nil {
				data = []byte(err.Error())
			}
			if err := m.Respond(data); err != nil && !errors.Is(err, nats.ErrMsgNoReply) {
				d.log.Warn("cannot answer a flush request", "err", err)
			}
		}()
	})
	if err != nil {
		return nil, fmt.Errorf("cannot serve %s: %w", subject, err)
	}
	return sub, nil
}
