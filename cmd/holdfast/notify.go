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

// Stopping tells systemd a shutdown began.
func (n *notifier) Stopping() {
	n.send(sd.SdNotifyStopping + "\n" + "STATUS=" + "draining and shutting down")
}

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
