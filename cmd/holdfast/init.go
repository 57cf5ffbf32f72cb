package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/holdfast-io/holdfast/config"
)

// initCommand writes a first config and a sample exec handler into a
// directory, and says what to run next.
func initCommand() *cli.Command {
	return &cli.Command{
		Name:      "init",
		Usage:     "write a commented config and a sample handler into DIR (default: the current directory), to start from",
		ArgsUsage: "[DIR]",
		Action: func(c *cli.Context) error {
			if c.NArg() > 1 {
				return usageError(fmt.Errorf("init takes one DIR at most, got %q", c.Args().Slice()))
			}
			dir := "."
			if c.NArg() == 1 {
				dir = c.Args().First()
			}
			dir, err := filepath.Abs(dir)
			if err != nil {
				return runtimeError(err)
			}
			cfgPath, handlerPath := filepath.Join(dir, "holdfast.toml"), filepath.Join(dir, "handler.sh")
			for _, p := range []string{cfgPath, handlerPath} {
				if _, err := os.Lstat(p); err == nil {
					return usageError(fmt.Errorf("%s exists: holdfast init writes new files only; give another DIR, or move it away", p))
				}
			}
			text, err := initConfig(filepath.Join(dir, "data"), handlerPath)
			if err != nil {
				return runtimeError(err)
			}
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return runtimeError(err)
			}
			if err := os.WriteFile(handlerPath, []byte(sampleHandler), 0o755); err != nil {
				return runtimeError(err)
			}
			if err := os.WriteFile(cfgPath, text, 0o640); err != nil {
				return runtimeError(err)
			}
			fmt.Fprintf(c.App.Writer, `wrote %s (every key, commented) and %s (the handler of consumer WORKER1).

Start holdfast:
  holdfast run --config %s
and in another terminal:
  holdfast pub orders.created '{"id":1}'                  # handled: the log shows it
  holdfast pub orders.created '{"id":2,"invalid":true}'   # the handler refuses it: a dead letter
  holdfast dlq ls                                         # there it is, with the reason
  holdfast status                                         # or http://127.0.0.1:8222/ in a browser
Edit %s to handle your messages; docs/handlers.md says what it gets.
`, cfgPath, handlerPath, shellQuote(cfgPath), handlerPath)
			return nil
		},
	}
}

// initConfig is the default config file with its store in storeDir and
// consumer WORKER1 running handler through the exec handler.
func initConfig(storeDir, handler string) ([]byte, error) {
	var b bytes.Buffer
	if err := config.WriteDefault(&b, storeDir); err != nil {
		return nil, err
	}
	text := b.String()
	for _, r := range [][2]string{
		{`handler = "log"             # log | exec | http | forward`, `handler = "exec"            # log | exec | http | forward`},
		{`# command = ["/usr/local/bin/process-order", "--strict"]  # absolute path, no shell`,
			fmt.Sprintf(`command = [%q]  # absolute path, no shell (written by holdfast init)`, handler)},
	} {
		if !strings.Contains(text, r[0]) {
			return nil, errors.New("the default config no longer has the line holdfast init edits: " + r[0])
		}
		text = strings.Replace(text, r[0], r[1], 1)
	}
	return []byte(text), nil
}

func shellQuote(s string) string {
	if strings.ContainsAny(s, " '\"$\\`") {
		return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
	}
	return s
}

// sampleHandler is the exec handler holdfast init writes.
const sampleHandler = `#!/bin/sh
# A sample exec handler, written by holdfast init. holdfast runs it once per
# message: the payload on stdin, the subject, sequence, delivery and
# idempotency key in HOLDFAST_* variables (docs/handlers.md). What it
# prints to stderr goes to holdfast's log.
#
#   exit 0   done: the message is acknowledged
#   exit 65  the message is bad: it goes to the dead letters now
#   other    try again after the backoff; a dead letter after max_deliver
payload=$(cat)
echo "order $HOLDFAST_SEQ on $HOLDFAST_SUBJECT (delivery $HOLDFAST_DELIVERY): $payload" >&2
case "$payload" in
*'"invalid":true'*)
	echo "cannot process: the order is marked invalid" >&2
	exit 65
	;;
esac
exit 0
`
