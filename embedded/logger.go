package embedded

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
)

// serverLogger bridges nats-server's Logger interface to slog. Fatalf does
// not exit the process: it records the error so that start-up can return
// it (the server calls Fatalf when, for example, JetStream cannot be
// enabled, and then never becomes ready).
type serverLogger struct {
	log   *slog.Logger
	once  sync.Once
	fatal chan error
}

func newServerLogger(log *slog.Logger) *serverLogger {
	return &serverLogger{log: log, fatal: make(chan error, 1)}
}

func (l *serverLogger) Noticef(format string, v ...any) {
	l.log.Info(fmt.Sprintf(format, v...))
}

func (l *serverLogger) Warnf(format string, v ...any) {
	l.log.Warn(fmt.Sprintf(format, v...))
}

func (l *serverLogger) Errorf(format string, v ...any) {
	l.log.Error(fmt.Sprintf(format, v...))
}

func (l *serverLogger) Fatalf(format string, v ...any) {
	err := fmt.Errorf(format, v...)
	l.log.Error(err.Error(), "fatal", true)
	l.once.Do(func() { l.fatal <- err })
}

func (l *serverLogger) Debugf(format string, v ...any) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug(fmt.Sprintf(format, v...))
	}
}

func (l *serverLogger) Tracef(format string, v ...any) {
	if l.log.Enabled(context.Background(), slog.LevelDebug-4) {
		l.log.Log(context.Background(), slog.LevelDebug-4, fmt.Sprintf(format, v...))
	}
}
