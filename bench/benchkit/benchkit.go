// Package benchkit holds what the benchmark programs (bench/compare,
// bench/edge, bench/footprint) share to talk to the servers they start:
// a free port, a JetStream connection, a stream's message count, and the
// tables they write. It is not part of the holdfast binary.
package benchkit

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// FreePort returns a TCP port on 127.0.0.1 that was free just now.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Connect connects to url, waiting at most timeout for the server, and
// returns the connection and its JetStream.
func Connect(url string, timeout time.Duration, opts ...jetstream.JetStreamOpt) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(url, nats.Timeout(timeout))
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc, opts...)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// StreamMsgs returns how many messages stream holds, asking for at most
// timeout.
func StreamMsgs(js jetstream.JetStream, stream string, timeout time.Duration) (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, err
	}
	return s.CachedInfo().State.Msgs, nil
}

// Table writes a markdown table of figures measured over several runs:
// the lead columns that name a figure, one column per run and the range.
type Table struct {
	w    *bytes.Buffer
	lead int
}

// NewTable writes the header of a table of runs runs to w, its first
// columns named lead.
func NewTable(w *bytes.Buffer, runs int, lead ...string) *Table {
	fmt.Fprintf(w, "| %s |", strings.Join(lead, " | "))
	for i := range runs {
		fmt.Fprintf(w, " run %d |", i+1)
	}
	fmt.Fprintf(w, " min–max |\n|%s", strings.Repeat(" --- |", len(lead)))
	fmt.Fprintln(w, strings.Repeat(" ---: |", runs+1))
	return &Table{w: w, lead: len(lead)}
}

// Row writes one figure: its lead cells, then each run's value with
// format (a fmt verb, bold when wrapped in **) and the range.
func (t *Table) Row(lead []string, format string, values []float64) {
	fmt.Fprintf(t.w, "| %s |", strings.Join(lead, " | "))
	for _, v := range values {
		fmt.Fprintf(t.w, " "+format+" |", v)
	}
	plain := strings.Trim(format, "*")
	fmt.Fprintf(t.w, " "+plain+"–"+plain+" |\n", slices.Min(values), slices.Max(values))
}
