package handler

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// DefaultStderrLimit is how much of a command's stderr the exec handler keeps
// per message when ExecOptions.StderrLimit is zero.
const DefaultStderrLimit = 64 << 10

const (
	// exitDataErr is EX_DATAERR from sysexits.h: the input data was
	// incorrect. It is the one exit code that dead-letters a message.
	exitDataErr = 65

	// execWaitDelay bounds how long Wait keeps reading stdout and stderr
	// after the command exited (or was killed) while a process it started
	// outside its process group still holds them open.
	execWaitDelay = 2 * time.Second

	// stdoutDebugLimit is how much stdout is kept for the debug log.
	stdoutDebugLimit = 4 << 10

	// maxLoggedLines bounds the log records of one run's stderr (and
	// stdout): a command printing many short lines must not drown
	// holdfast's own log lines (or trip journald's rate limit) for each
	// message. The last ones are logged.
	maxLoggedLines = 100

	// reasonLineLimit bounds the stderr line quoted in a Result's Reason,
	// which ends up in a dead letter's Holdfast-Error header.
	reasonLineLimit = 200

	// headerEnvPrefix starts the environment variable of each message header.
	headerEnvPrefix = "HOLDFAST_HEADER_"
)

// execMetadataVars are the variables the exec handler sets for every message.
// The parent's own values of them are not passed on, so that a command never
// sees stale metadata.
var execMetadataVars = []string{
	"HOLDFAST_SUBJECT",
	"HOLDFAST_STREAM",
	"HOLDFAST_CONSUMER",
	"HOLDFAST_SEQ",
	"HOLDFAST_DELIVERY",
	"HOLDFAST_MSG_ID",
}

// ExecOptions configures an Exec handler.
type ExecOptions struct {
	// Command is the program, as an absolute path, and its arguments. It is
	// run directly, without a shell and without a PATH lookup.
	Command []string
	// Timeout bounds one run of the command; zero means only the context
	// given to Handle bounds it.
	Timeout time.Duration
	// StderrLimit is how many bytes of stderr are kept per message (the
	// last ones); zero means DefaultStderrLimit.
	StderrLimit int
}

// Exec is the "exec" handler: it runs a command per message, with the
// payload on stdin and the metadata in the environment, and judges the
// message by the exit status. It is safe for concurrent use.
//
// The environment is holdfast's own, minus any HOLDFAST_HEADER_* variables
// and the metadata variables below, plus:
//
//	HOLDFAST_SUBJECT, HOLDFAST_STREAM, HOLDFAST_CONSUMER,
//	HOLDFAST_SEQ (stream sequence), HOLDFAST_DELIVERY (attempt, from 1),
//	HOLDFAST_MSG_ID (the idempotency key),
//	HOLDFAST_HEADER_<NAME> for each message header.
//
// NAME is the header name upper-cased with every character other than A-Z,
// 0-9 and _ replaced by _, so "X-Trace.Id" becomes HOLDFAST_HEADER_X_TRACE_ID.
// Several values of a header, and headers whose names map to the same
// variable, are joined with "," in the order of their sorted names.
//
// Exit status 0 succeeds. Exit status 65 (EX_DATAERR) fails the message
// permanently. Any other exit status, death by a signal, the timeout and
// cancellation of the context retry it. The command runs in its own process
// group; on timeout or cancellation the whole group is killed with SIGKILL,
// and so is whatever the command leaves running in its group when it
// exits, success or not: a handler is done when its command is. Processes
// that leave the group (setsid, setpgid) are not tracked; the handler stops
// reading their stdout and stderr 2 seconds after the command exited.
//
// Stderr goes to the log line by line, at warn level, or info level when the
// command succeeded: its last 100 lines within its last StderrLimit bytes,
// after one record saying how much was dropped. Stdout is discarded, unless the logger is enabled for
// debug level: then its last 4 KiB are logged at debug level.
type Exec struct {
	command     []string
	timeout     time.Duration
	timeoutErr  error
	stderrLimit int
	waitDelay   time.Duration
	logger      *slog.Logger
}

// NewExec checks cfg and returns an Exec handler. The command must be
// an absolute path to an executable file. A nil logger means slog.Default().
func NewExec(cfg ExecOptions, logger *slog.Logger) (*Exec, error) {
	if len(cfg.Command) == 0 || cfg.Command[0] == "" {
		return nil, errors.New("exec handler: no command given")
	}
	path := cfg.Command[0]
	for i, arg := range cfg.Command {
		if strings.IndexByte(arg, 0) >= 0 {
			// exec fails with EINVAL for every message, which would
			// retry each up to max_deliver and dead-letter it.
			return nil, fmt.Errorf("exec handler: command[%d] %q contains a NUL byte, which no program or argument can carry", i, arg)
		}
	}
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("exec handler: command %q is not an absolute path: it runs without a shell or PATH lookup", path)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("exec handler: command %s: %w", path, err)
	}
	if fi.IsDir() {
		return nil, fmt.Errorf("exec handler: command %s is a directory", path)
	}
	if fi.Mode()&0o111 == 0 {
		return nil, fmt.Errorf("exec handler: command %s is not executable (mode %s)", path, fi.Mode())
	}
	// The mode may let others run it but not this process's user (a
	// root-owned 0700 script for the holdfast user), or the file system
	// may be mounted noexec: every message would then fail to start.
	if err := unix.Access(path, unix.X_OK); err != nil {
		return nil, fmt.Errorf("exec handler: command %s cannot be executed by this process (uid %d, mode %s): %w", path, os.Getuid(), fi.Mode(), err)
	}
	// A script whose interpreter cannot run fails to start with ENOENT
	// (or EACCES) of the script itself, for every message.
	if err := interpreterProblem(path); err != nil {
		return nil, fmt.Errorf("exec handler: command %s: %w", path, err)
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("exec handler: timeout %s is negative", cfg.Timeout)
	}
	if cfg.StderrLimit < 0 {
		return nil, fmt.Errorf("exec handler: stderr limit %d is negative", cfg.StderrLimit)
	}
	limit := cfg.StderrLimit
	if limit == 0 {
		limit = DefaultStderrLimit
	}
	if logger == nil {
		logger = slog.Default()
	}
	return &Exec{
		command:     slices.Clone(cfg.Command),
		timeout:     cfg.Timeout,
		timeoutErr:  fmt.Errorf("timed out after %s", cfg.Timeout),
		stderrLimit: limit,
		waitDelay:   execWaitDelay,
		logger:      logger,
	}, nil
}

// Handle runs the command for msg and waits for it to exit.
func (h *Exec) Handle(ctx context.Context, msg *Message) Result {
	env, err := messageEnv(os.Environ(), msg)
	if err != nil {
		return Fail(err.Error())
	}

	runCtx := ctx
	if h.timeout > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeoutCause(ctx, h.timeout, h.timeoutErr)
		defer cancel()
	}

	cmd := exec.CommandContext(runCtx, h.command[0], h.command[1:]...)
	cmd.Env = env
	cmd.Stdin = bytes.NewReader(msg.Data)
	stderr := &tailBuffer{limit: h.stderrLimit}
	cmd.Stderr = stderr
	var stdout *tailBuffer
	if h.logger.Enabled(ctx, slog.LevelDebug) {
		stdout = &tailBuffer{limit: stdoutDebugLimit}
		cmd.Stdout = stdout
	}
	// Pdeathsig: a command whose holdfast dies (kill -9, the OOM killer)
	// is killed with it instead of running on with its stdin cut short,
	// on a payload that is not the message. (The signal follows the
	// thread that started the command; the Go runtime ends a thread only
	// when a goroutine locked to it returns, which holdfast's do not.)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return killProcessGroup(cmd.Process.Pid) }
	cmd.WaitDelay = h.waitDelay

	if err := cmd.Start(); err != nil {
		if errors.Is(err, syscall.E2BIG) {
			return Fail(fmt.Sprintf("cannot start %s: the message's headers do not fit in the environment: %v", h.command[0], err))
		}
		// The program may be being replaced by a deployment; try again.
		if ierr := interpreterProblem(h.command[0]); ierr != nil {
			return RetryLater(fmt.Sprintf("cannot start %s: %v", h.command[0], ierr))
		}
		return RetryLater(fmt.Sprintf("cannot start %s: %v", h.command[0], err))
	}
	trackCommand(cmd.Process.Pid)
	// Wait for the command to exit without reaping it: while it is a
	// zombie its pid, which is its process group's id, cannot be reused,
	// so the kill below reaches only what it started.
	exited := waitExited(cmd.Process.Pid)
	if exited {
		_ = killProcessGroup(cmd.Process.Pid)
	}
	// Untracked before it is reaped, after which its pid may be reused.
	untrackCommand(cmd.Process.Pid)
	waitErr := cmd.Wait()
	if !exited {
		_ = killProcessGroup(cmd.Process.Pid)
	}
	state := cmd.ProcessState
	if state == nil {
		return RetryLater(fmt.Sprintf("waiting for %s: %v", h.command[0], waitErr))
	}
	code := state.ExitCode()

	level := slog.LevelWarn
	if code == 0 {
		level = slog.LevelInfo
	}
	h.logOutput(ctx, level, "handler stderr", msg, stderr)
	if stdout != nil {
		h.logOutput(ctx, slog.LevelDebug, "handler stdout", msg, stdout)
	}
	last := lastLine(stderr.Bytes())

	switch {
	case code == 0:
		if errors.Is(waitErr, exec.ErrWaitDelay) {
			h.logger.LogAttrs(ctx, slog.LevelWarn, "handler exited but left a process outside its process group holding its stdout or stderr open",
				slog.Uint64("seq", msg.Sequence),
				slog.String("subject", msg.Subject),
				slog.String("consumer", msg.Consumer),
				slog.Duration("waited", h.waitDelay),
			)
		}
		return Ok()
	case code == exitDataErr:
		return Fail(withLine("exit status 65 (EX_DATAERR)", last))
	case runCtx.Err() != nil:
		cause := context.Cause(runCtx)
		reason := cause.Error()
		if cause != h.timeoutErr {
			reason = "stopped: " + reason
		}
		return RetryLater(withLine(reason+"; process group killed", last))
	case code > 0:
		return RetryLater(withLine("exit status "+strconv.Itoa(code), last))
	}
	if ws, ok := state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return RetryLater(withLine("killed by signal "+ws.Signal().String(), last))
	}
	return RetryLater(withLine(state.String(), last))
}

// logOutput logs what a command wrote to stdout or stderr, one record a line.
func (h *Exec) logOutput(ctx context.Context, level slog.Level, text string, msg *Message, out *tailBuffer) {
	if !h.logger.Enabled(ctx, level) {
		return
	}
	attrs := func(extra slog.Attr) []slog.Attr {
		return []slog.Attr{
			slog.Uint64("seq", msg.Sequence),
			slog.String("subject", msg.Subject),
			slog.String("consumer", msg.Consumer),
			extra,
		}
	}
	var lines [][]byte
	for data := out.Bytes(); len(data) > 0; {
		var line []byte
		line, data, _ = bytes.Cut(data, []byte{'\n'})
		lines = append(lines, line)
	}
	droppedBytes, droppedLines := out.Dropped(), 0
	if n := len(lines) - maxLoggedLines; n > 0 {
		for _, line := range lines[:n] {
			droppedBytes += int64(len(line)) + 1
		}
		droppedLines = n
		lines = lines[n:]
	}
	if droppedBytes > 0 {
		extra := []slog.Attr{slog.Int64("dropped_bytes", droppedBytes)}
		if droppedLines > 0 {
			extra = append(extra, slog.Int("dropped_lines", droppedLines))
		}
		h.logger.LogAttrs(ctx, level, text+" truncated", append(attrs(extra[0]), extra[1:]...)...)
	}
	for _, line := range lines {
		h.logger.LogAttrs(ctx, level, text, attrs(slog.String("line", string(bytes.TrimSuffix(line, []byte{'\r'}))))...)
	}
}

// shebangLimit is how much of a script the kernel reads for its #! line
// (BINPRM_BUF_SIZE).
const shebangLimit = 256

// interpreterProblem returns why the interpreter that the #! line of the
// script at path names cannot be run by this process, or nil: when it can,
// when path is no script, or when path cannot be read (an execute-only
// binary). Like the kernel, it takes the interpreter to be the first word
// after "#!", ended by a blank or the end of the line; a carriage return is
// part of it (a script with Windows line endings).
func interpreterProblem(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	buf := make([]byte, shebangLimit)
	n, _ := io.ReadFull(f, buf)
	line, ok := bytes.CutPrefix(buf[:n], []byte("#!"))
	if !ok {
		return formatProblem(buf[:n])
	}
	line, _, _ = bytes.Cut(line, []byte{'\n'})
	line = bytes.TrimLeft(line, " \t")
	if i := bytes.IndexAny(line, " \t\x00"); i >= 0 {
		line = line[:i]
	}
	interp := string(line)
	if interp == "" {
		return errors.New("its #! line names no interpreter")
	}
	if err := unix.Access(interp, unix.X_OK); err != nil {
		err = fmt.Errorf("its interpreter %q (the #! line) cannot be executed: %w", interp, err)
		if strings.HasSuffix(interp, "\r") {
			err = fmt.Errorf("%w; the script has Windows line endings (its #! line ends with a carriage return): convert it, e.g. with dos2unix", err)
		}
		return err
	}
	return nil
}

// formatProblem returns why the kernel cannot run a file that starts with
// head and has no #! line, or nil: an ELF binary, an empty head (nothing
// read), or formats registered with binfmt_misc, which may run anything.
// A shell runs such a script with sh, so it works when tried by hand;
// holdfast starts it without a shell, and execve fails with ENOEXEC.
func formatProblem(head []byte) error {
	if len(head) == 0 || bytes.HasPrefix(head, []byte("\x7fELF")) || hasBinfmtMisc() {
		return nil
	}
	if bytes.HasPrefix(head, []byte("\xef\xbb\xbf#!")) {
		return errors.New("it starts with a byte-order mark before its #! line, so the kernel cannot run it (exec format error): save it as UTF-8 without BOM")
	}
	return errors.New("it has no #! line and is no ELF binary, so the kernel cannot run it (exec format error; a shell runs it with sh, holdfast starts it without one): begin it with a #! line such as #!/bin/sh")
}

// hasBinfmtMisc reports whether binfmt_misc formats are registered (the
// kernel may then run files that are neither ELF nor #! scripts), or
// whether that cannot be told: the packaged unit hides /proc/sys
// (ProcSubset=pid), and a command run through a registered format (a .jar)
// must not be refused there.
func hasBinfmtMisc() bool {
	entries, err := os.ReadDir("/proc/sys/fs/binfmt_misc")
	if err != nil {
		return true
	}
	for _, e := range entries {
		if e.Name() != "register" && e.Name() != "status" {
			return true
		}
	}
	return false
}

// waitExited blocks until the child pid has exited, leaving it to be
// reaped by exec.Cmd.Wait, and reports whether it could wait so.
func waitExited(pid int) bool {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			return err == nil
		}
	}
}

// runningCommands holds the process group ids of the exec commands running
// now, for KillRunningCommands.
var runningCommands struct {
	sync.Mutex
	pgids map[int]struct{}
}

func trackCommand(pgid int) {
	runningCommands.Lock()
	defer runningCommands.Unlock()
	if runningCommands.pgids == nil {
		runningCommands.pgids = make(map[int]struct{})
	}
	runningCommands.pgids[pgid] = struct{}{}
}

func untrackCommand(pgid int) {
	runningCommands.Lock()
	defer runningCommands.Unlock()
	delete(runningCommands.pgids, pgid)
}

// KillRunningCommands sends SIGKILL to the process group of every exec
// handler command running now, and to the command itself, and returns how
// many it signalled. A program that exits without waiting for its handlers
// (holdfast on a second stop signal) calls it first: their commands run in
// process groups of their own, which no signal to the program reaches, and
// would go on running, unsupervised and past their timeout, while their
// messages are delivered again after the restart. The command itself is
// signalled too because it may have moved to another process group
// (setpgid); its pid cannot have been reused, since it is tracked only
// until it is reaped.
func KillRunningCommands() int {
	runningCommands.Lock()
	defer runningCommands.Unlock()
	n := 0
	for pgid := range runningCommands.pgids {
		groupErr := killProcessGroup(pgid)
		cmdErr := syscall.Kill(pgid, syscall.SIGKILL)
		if groupErr == nil || cmdErr == nil {
			n++
		}
	}
	return n
}

// killProcessGroup sends SIGKILL to the process group pgid.
func killProcessGroup(pgid int) error {
	err := syscall.Kill(-pgid, syscall.SIGKILL)
	if errors.Is(err, syscall.ESRCH) {
		return os.ErrProcessDone
	}
	return err
}

// messageEnv returns parent without the variables the exec handler owns,
// plus msg's metadata and headers.
func messageEnv(parent []string, msg *Message) ([]string, error) {
	env := make([]string, 0, len(parent)+len(execMetadataVars)+len(msg.Header))
	for _, kv := range parent {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, headerEnvPrefix) || slices.Contains(execMetadataVars, name) {
			continue
		}
		env = append(env, kv)
	}
	own := len(env)
	env = append(env,
		"HOLDFAST_SUBJECT="+msg.Subject,
		"HOLDFAST_STREAM="+msg.Stream,
		"HOLDFAST_CONSUMER="+msg.Consumer,
		"HOLDFAST_SEQ="+strconv.FormatUint(msg.Sequence, 10),
		"HOLDFAST_DELIVERY="+strconv.FormatUint(msg.Delivery, 10),
		"HOLDFAST_MSG_ID="+idempotencyKey(msg),
	)

	names := make([]string, 0, len(msg.Header))
	for name := range msg.Header {
		names = append(names, name)
	}
	slices.Sort(names)
	var order []string
	values := make(map[string][]string, len(names))
	for _, name := range names {
		if name == "" || len(msg.Header[name]) == 0 {
			continue
		}
		v := headerEnvPrefix + headerEnvName(name)
		if _, seen := values[v]; !seen {
			order = append(order, v)
		}
		values[v] = append(values[v], msg.Header[name]...)
	}
	for _, v := range order {
		env = append(env, v+"="+strings.Join(values[v], ","))
	}

	for _, kv := range env[own:] {
		if strings.IndexByte(kv, 0) >= 0 {
			name, _, _ := strings.Cut(kv, "=")
			return nil, fmt.Errorf("%s would contain a NUL byte, which cannot be passed in the environment", name)
		}
	}
	return env, nil
}

// headerEnvName maps a header name to the NAME of HOLDFAST_HEADER_<NAME>.
func headerEnvName(header string) string {
	var b strings.Builder
	b.Grow(len(header))
	for _, r := range header {
		switch {
		case r >= 'a' && r <= 'z':
			b.WriteRune(r - 'a' + 'A')
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}

// tailBuffer is an io.Writer that keeps the last limit bytes written to it
// and counts the ones it dropped. It holds at most 2*limit bytes.
type tailBuffer struct {
	limit   int
	buf     []byte
	dropped int64
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if n >= b.limit {
		b.dropped += int64(len(b.buf) + n - b.limit)
		b.buf = append(b.buf[:0], p[n-b.limit:]...)
		return n, nil
	}
	b.buf = append(b.buf, p...)
	if len(b.buf) > 2*b.limit {
		drop := len(b.buf) - b.limit
		b.dropped += int64(drop)
		b.buf = b.buf[:copy(b.buf, b.buf[drop:])]
	}
	return n, nil
}

// Bytes returns the kept bytes, at most limit of them.
func (b *tailBuffer) Bytes() []byte {
	if len(b.buf) > b.limit {
		return b.buf[len(b.buf)-b.limit:]
	}
	return b.buf
}

// Dropped returns how many bytes were written but not kept.
func (b *tailBuffer) Dropped() int64 {
	return b.dropped + int64(len(b.buf)-len(b.Bytes()))
}

// lastLine returns the last non-blank line of out, made fit for a Reason.
func lastLine(out []byte) string {
	out = bytes.TrimRight(out, " \t\r\n")
	if i := bytes.LastIndexByte(out, '\n'); i >= 0 {
		out = out[i+1:]
	}
	return OneLine(string(out), reasonLineLimit)
}

// withLine appends a quoted stderr line to a reason.
func withLine(reason, line string) string {
	if line == "" {
		return reason
	}
	return reason + ": " + line
}

// OneLine makes s fit for a log attribute or a NATS header value: valid
// UTF-8, control characters as spaces, trimmed, and at most limit bytes (cut
// on a character boundary, marked with "...").
func OneLine(s string, limit int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	s = strings.TrimSpace(s)
	if len(s) <= limit {
		return s
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
