package main

import (
	"fmt"

	"github.com/urfave/cli/v2"
)

// manCommand prints the holdfast(1) manual page, generated from the command
// and flag definitions, so that it never drifts from `holdfast help`. The
// packages ship its output as /usr/share/man/man1/holdfast.1.gz
// (packaging/build.sh). Hidden: it is for packagers, not for operators.
func manCommand() *cli.Command {
	return &cli.Command{
		Name:   "man",
		Usage:  "print the holdfast(1) manual page (roff)",
		Hidden: true,
		Action: func(c *cli.Context) error {
			app := *c.App
			app.Description = manDescription
			page, err := app.ToManWithSection(1)
			if err != nil {
				return runtimeError(fmt.Errorf("man page: %w", err))
			}
			_, err = fmt.Fprint(c.App.Writer, page+manFooter)
			return err
		},
	}
}

const manDescription = `holdfast is one binary that embeds NATS Server with JetStream on a validated
store directory, creates the streams and durable consumers of its config file,
and runs in-process workers that hand each message to a handler (log, exec or
http) and acknowledge it only after the handler succeeded. Failed messages go
to a dead-letter stream. Any NATS client works against it.`

// manFooter is roff appended to the generated page.
const manFooter = `.SH ENVIRONMENT
.TP
.B HOLDFAST_CONFIG
the config file, as \fB\-\-config\fR (which wins over it).
.SH FILES
.TP
.I /etc/holdfast/holdfast.toml
the config of the packaged service; \fBholdfast config\fR prints a commented default.
.TP
.I /var/lib/holdfast
the service's data; JetStream keeps its files in \fI/var/lib/holdfast/jetstream\fR.
.TP
.I /usr/lib/systemd/system/holdfast.service
the systemd unit; change it with \fBsystemctl edit holdfast\fR.
.SH EXIT STATUS
0 on success, 1 when the command failed, 2 on a usage or config error.
.SH SEE ALSO
.BR systemctl (1),
.BR journalctl (1),
.BR systemd.exec (5),
/usr/share/doc/holdfast/
`
