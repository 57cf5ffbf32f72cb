package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/urfave/cli/v2"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/daemon"
	"github.com/holdfast-io/holdfast/internal/subjects"
)

func reloadCommand() *cli.Command {
	return &cli.Command{
		Name:  "reload",
		Usage: "reload the running holdfast's config file and wait for the result; exit 1 when it was refused",
		Description: "Sends SIGHUP to the running holdfast and waits for its answer on " + subjects.Reload("") + "<server name>:\n" +
			"what the reload applied, or why it was refused. A reload with a change that needs a restart applies\n" +
			"nothing and exits 1 naming the keys. When holdfast cannot be asked (no credentials for it), --pid\n" +
			"still gets the signal, after the file passed the checks of holdfast check; its log tells the result.",
		Flags: []cli.Flag{
			serverFlag,
			&cli.IntFlag{Name: "pid", Usage: "process to signal (systemd's $MAINPID); default: the one holdfast reports"},
			&cli.DurationFlag{Name: "timeout", Value: 10 * time.Minute,
				Usage: "how long to wait for the reload (it waits for running handlers, up to shutdown_timeout per consumer)"},
		},
		Action: func(c *cli.Context) error {
			ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
			defer cancel()
			cfg, nc, _, err := connect(c)
			var before *daemon.ReloadReply
			if err == nil {
				defer nc.Close()
				before, err = askReload(ctx, nc, cfg, nil)
			}
			if err != nil {
				if pid := c.Int("pid"); pid > 0 {
					return reloadUnasked(c, pid, err)
				}
				return err
			}
			if err := sameConfigFile(configPath(c), before.ConfigFile); err != nil {
				return usageError(err)
			}
			pid := c.Int("pid")
			if pid <= 0 {
				pid = before.PID
			}
			last, sent := reloadSeq(before), time.Now()
			if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
				return runtimeError(fmt.Errorf("cannot signal holdfast (pid %d): %w (run as root or as holdfast's user, or systemctl reload holdfast)", pid, err))
			}
			for {
				r, err := askReload(ctx, nc, cfg, nil)
				if err == nil {
					if res := reloadAfter(r, last, sent); res != nil {
						return reportReload(c.App.Writer, r.ConfigFile, res)
					}
				}
				select {
				case <-ctx.Done():
					return runtimeError(fmt.Errorf("no reload result within %s (last: %v): see holdfast's log", c.Duration("timeout"), err))
				case <-time.After(100 * time.Millisecond):
				}
			}
		},
	}
}

// sameConfigFile refuses a reload asked with --config mine when the
// daemon runs with another file (theirs; "" for the built-in defaults):
// it reloads its own, and mine would have been checked for nothing.
func sameConfigFile(mine, theirs string) error {
	if mine == "" {
		return nil
	}
	if theirs == "" {
		return fmt.Errorf("holdfast runs with the built-in defaults, not %s: a reload reads no file; restart it with --config %s", mine, mine)
	}
	a, errA := os.Stat(mine)
	b, errB := os.Stat(theirs)
	if errA == nil && errB == nil && os.SameFile(a, b) {
		return nil
	}
	if absA, err := filepath.Abs(mine); err == nil && absA == theirs {
		return nil
	}
	return fmt.Errorf("holdfast runs with %s, and a reload reads that file, not %s: edit %s (or restart holdfast with --config %s)", theirs, mine, theirs, mine)
}

// askReload asks the holdfast nc is connected to what a reload would do
// and what its last reload did; with daemon.AskDrift as the request,
// also what the server cannot change in place.
func askReload(ctx context.Context, nc *nats.Conn, cfg *config.Config, request []byte) (*daemon.ReloadReply, error) {
	name := nc.ConnectedServerName()
	if name == "" {
		name = cfg.Server.Name
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	msg, err := nc.RequestWithContext(rctx, subjects.Reload(name), request)
	if err != nil {
		return nil, runtimeError(fmt.Errorf("holdfast does not answer on %s: %w (is it still starting? see holdfast status)", subjects.Reload(name), err))
	}
	var r daemon.ReloadReply
	if err := json.Unmarshal(msg.Data, &r); err != nil {
		return nil, runtimeError(fmt.Errorf("cannot read holdfast's answer on %s: %w", subjects.Reload(name), err))
	}
	return &r, nil
}

// reloadSeq is the number of the last reload r reports, 0 for none.
func reloadSeq(r *daemon.ReloadReply) uint64 {
	if r == nil || r.LastReload == nil {
		return 0
	}
	return r.LastReload.Seq
}

// reloadAfter is the reload r reports that answers a SIGHUP sent at
// sent, after reload number last: the first that started after it (one
// running when the signal came did not read the file for it; the signal
// makes the next one). Several askers at once may each see another's
// reload come after theirs before they read: each gets its own. nil
// while it has not ended.
func reloadAfter(r *daemon.ReloadReply, last uint64, sent time.Time) *daemon.ReloadResult {
	if len(r.Recent) == 0 { // a holdfast from before Recent
		if reloadSeq(r) > last {
			return r.LastReload
		}
		return nil
	}
	for i := range r.Recent {
		if res := &r.Recent[i]; res.Seq > last && !res.Started.Before(sent) {
			return res
		}
	}
	return nil
}

// reportReload prints what the reload res of source did, and fails when
// it was refused or not wholly applied.
func reportReload(w io.Writer, source string, res *daemon.ReloadResult) error {
	if source == "" {
		source = "built-in defaults"
	}
	if res.Error == "" {
		fmt.Fprintf(w, "reloaded %s\n", source)
		var held, why, failed []string
		for _, h := range res.HeldBack {
			held, why = append(held, h.Key), append(why, h.Why)
		}
		for _, h := range res.NotApplied {
			held, failed = append(held, h.Key), append(failed, h.Why)
		}
		printKeys(w, "applied:", slices.DeleteFunc(slices.Clone(res.Plan.Apply), func(k string) bool { return slices.Contains(held, k) }))
		if len(res.SetBack) > 0 {
			printKeys(w, "set back on the server (it differed from the config):", res.SetBack)
		}
		if len(held) == 0 {
			return nil
		}
		if len(why) > 0 {
			printKeys(w, "not applied (held back on purpose; the server keeps its setting):", why)
		}
		if len(failed) > 0 {
			printKeys(w, "not applied (the workers could not start with it; fix the cause and reload again):", failed)
		}
		return runtimeError(fmt.Errorf("reload of %s: %s not applied (see above)", source, strings.Join(held, ", ")))
	}
	if len(res.Plan.Restart) > 0 {
		printKeys(w, "needs a restart (nothing of this reload was applied):", res.Plan.Restart)
		printKeys(w, "a reload applies once those are restarted or set back:", res.Plan.Apply)
	}
	return runtimeError(fmt.Errorf("reload of %s: %s", source, res.Error))
}

// reloadUnasked validates the config file as holdfast check does and
// sends SIGHUP to pid without waiting: holdfast could not be asked (why).
func reloadUnasked(c *cli.Context, pid int, why error) error {
	if _, _, err := config.Load(configPath(c)); err != nil {
		return runtimeError(fmt.Errorf("reload refused: %w", err))
	}
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		return runtimeError(fmt.Errorf("cannot signal holdfast (pid %d): %w", pid, err))
	}
	fmt.Fprintf(c.App.ErrWriter, "warning: sent SIGHUP to holdfast (pid %d) without waiting for the result, which its log tells: %v\n", pid, why)
	return nil
}

// printKeys prints a heading and keys, one a line; "(none)" for none.
func printKeys(w io.Writer, heading string, keys []string) {
	fmt.Fprintln(w, heading)
	if len(keys) == 0 {
		fmt.Fprintln(w, "  (none)")
	}
	for _, k := range keys {
		fmt.Fprintln(w, "  "+k)
	}
}

// checkRunning prints what a reload of the running holdfast's config
// file would apply and what needs a restart; it fails when anything
// needs a restart or the file has problems.
func checkRunning(c *cli.Context) error {
	cfg, nc, _, err := connect(c)
	if err != nil {
		return err
	}
	defer nc.Close()
	r, err := askReload(c.Context, nc, cfg, []byte(daemon.AskDrift))
	if err != nil {
		return err
	}
	if r.Plan == nil {
		return runtimeError(fmt.Errorf("holdfast (pid %d) cannot reload its config: %s", r.PID, r.Error))
	}
	source := r.ConfigFile
	if source == "" {
		source = "built-in defaults"
	}
	fmt.Fprintf(c.App.Writer, "running holdfast (pid %d), config %s\n", r.PID, source)
	printKeys(c.App.Writer, "a reload applies:", r.Plan.Apply)
	printKeys(c.App.Writer, "needs a restart:", r.Plan.Restart)
	if !r.Plan.Reloadable() {
		return runtimeError(errors.New("a reload would be refused: restart to apply " + strings.Join(r.Plan.Restart, ", ")))
	}
	if len(r.Drift) > 0 {
		printKeys(c.App.Writer, "the server cannot change in place (a reload, and a restart, would be refused):", r.Drift)
		return runtimeError(errors.New("a reload would be refused as a whole, and a restart too: the server cannot change in place what is listed above"))
	}
	return nil
}
