package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// surviveBrokenPipe keeps holdfast running when what it writes to stdout
// or stderr goes to a pipe nobody reads any more. Go kills a program
// writing to a broken pipe on fd 1 or 2 with SIGPIPE unless it is
// notified; once notified, such a write fails with EPIPE, which holdfast
// ignores. Notify, not Ignore: an ignored signal stays ignored in the
// exec handlers' processes.
func surviveBrokenPipe() {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
}

// interruptible is the context of a backup or a restore: cancelled by
// Ctrl-C, systemctl stop or a closed terminal, so that the command cleans
// up what it started. Its output may be gone by then (Ctrl-C on
// `holdfast restore ... | tee log` stops tee too): the clean-up must not
// die of the broken pipe its next line meets.
func interruptible(ctx context.Context) (context.Context, context.CancelFunc) {
	surviveBrokenPipe()
	return signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
}
