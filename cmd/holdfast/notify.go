package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	sd "github.com/coreos/go-systemd/v22/daemon"
	"golang.org/x/sys/unix"
)

// notifier speaks systemd's sd_notify protocol. Without NOTIFY_SOCKET
// every call is a no-op.
type notifier struct {
	log *slog.Logger
}

func newNotifier(log *slog.Logger) *notifier { return &notifier{log: log.With("component", "systemd")} }

func (n *notifier) send(state string) {
	if _, err := sd.SdNotify(false, state); err != nil {
		n.log.Warn("sd_notify failed", "state", state, "err", err)
	}
}

// Status sets the unit's status line (systemctl status).
func (n *notifier) Status(msg string) { n.send("STATUS=" + msg) }

// Ready tells systemd start-up is complete.
func (n *notifier) Ready(status string) { n.send(sd.SdNotifyReady + "\n" + "STATUS=" + status) }

// Reloading tells systemd a reload began; Ready ends it.
func (n *notifier) Reloading() {
	n.send(fmt.Sprintf("%s\nMONOTONIC_USEC=%d\nSTATUS=reloading the config", sd.SdNotifyReloading, monotonicUsec()))
}

// monotonicUsec is CLOCK_MONOTONIC in microseconds, which systemd wants
// with RELOADING=1.
func monotonicUsec() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return ts.Nano() / 1000
}

// Stopping tells systemd a shutdown began, which may last up to take: the
// unit's stop timeout (TimeoutStopSec) is extended to take from now when
// it would end earlier, so that a shutdown_timeout longer than the packaged
// unit's 90 s is not cut short by SIGKILL in the middle of the drain.
// EXTEND_TIMEOUT_USEC never shortens a timeout; systemd before 236
// ignores it.
func (n *notifier) Stopping(take time.Duration) {
	n.send(fmt.Sprintf("%s\nEXTEND_TIMEOUT_USEC=%d\nSTATUS=draining and shutting down", sd.SdNotifyStopping, take.Microseconds()))
}

// stopMargin is what a shutdown takes beyond shutdown_timeout: giving back
// what is unfinished, draining the in-process connection (up to 10 s),
// shutting the server down and syncing the store. With the default
// shutdown_timeout (20 s) the total is the unit's TimeoutStopSec (90 s).
const stopMargin = 70 * time.Second

// Watchdog sends WATCHDOG=1 at half the unit's WatchdogSec, but only while
// healthy answers nil: a stuck server or pipeline stops the pings and
// systemd restarts the service.
func (n *notifier) Watchdog(ctx context.Context, healthy func(context.Context) error) {
	interval, err := sd.SdWatchdogEnabled(false)
	if err != nil || interval == 0 {
		return
	}
	t := time.NewTicker(interval / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := healthy(ctx); err != nil {
				n.log.Error("health probe failed: withholding watchdog ping", "err", err)
				continue
			}
			n.send(sd.SdNotifyWatchdog)
		}
	}
}
