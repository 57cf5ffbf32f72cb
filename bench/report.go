package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// newFigure is a figure of n messages of size bytes in elapsed, with the
// latencies given.
func newFigure(name string, n, size int, elapsed time.Duration, lat []time.Duration) Figure {
	sec := elapsed.Seconds()
	f := Figure{
		Name:       name,
		Msgs:       n,
		Bytes:      int64(n) * int64(size),
		Seconds:    sec,
		MsgsPerSec: float64(n) / sec,
		MBPerSec:   float64(n) * float64(size) / sec / 1e6,
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		pct := func(q float64) float64 {
			i := int(q*float64(len(lat))+0.5) - 1
			i = max(0, min(i, len(lat)-1))
			return float64(lat[i]) / 1e3
		}
		f.Latency = &Latency{P50: pct(0.50), P90: pct(0.90), P99: pct(0.99), Max: float64(lat[len(lat)-1]) / 1e3}
	}
	return f
}

// PrintReport writes the report as a table.
func PrintReport(w io.Writer, r *Report) {
	p, m := r.Params, r.Machine
	fmt.Fprintf(w, "holdfast bench: %d msgs of %d B, %d publisher(s) (window %d), %d worker(s)\n",
		p.Msgs, p.Size, p.Publishers, p.Window, p.Workers)
	fmt.Fprintf(w, "machine: %d CPUs, %s, %s/%s, %s; store on %s (%s); nats-server %s\n\n",
		m.CPUs, m.Kernel, m.GOOS, m.GOARCH, m.GoVersion, m.StoreFS, m.StoreDir, m.NATSServer)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "sync\tfigure\tmsgs\tmsgs/s\tMB/s\tp50\tp90\tp99\tmax\t")
	for _, run := range r.Runs {
		for _, f := range run.Figures {
			l := "-\t-\t-\t-"
			if f.Latency != nil {
				l = fmt.Sprintf("%s\t%s\t%s\t%s", micros(f.Latency.P50), micros(f.Latency.P90),
					micros(f.Latency.P99), micros(f.Latency.Max))
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%.2f\t%s\t\n", run.Sync, f.Name, f.Msgs, f.MsgsPerSec, f.MBPerSec, l)
		}
	}
	_ = tw.Flush()
	for _, run := range r.Runs {
		if g := run.GroupCommit; g != nil {
			per := 0.0
			if g.Batches > 0 {
				per = float64(g.BatchedMsgs) / float64(g.Batches)
			}
			fmt.Fprintf(w, "\n%s: group commit stored %d messages in %d atomic batches (%.0f per batch), %d alone, %d passed on\n",
				run.Sync, g.BatchedMsgs, g.Batches, per, g.Alone, g.Forwarded)
		}
	}
}

func micros(us float64) string {
	d := time.Duration(us * 1e3)
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.0fµs", us)
}

// progress shows the current figure and its count on a terminal.
type progress struct {
	w        io.Writer
	mu       sync.Mutex
	name     string
	done     func() int64
	total    int
	stopCh   chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w, stopCh: make(chan struct{})}
	p.wg.Add(1)
	go p.loop()
	return p
}

// set switches to a new figure; on a nil progress it does nothing.
func (p *progress) set(name string, done func() int64, total int) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.name, p.done, p.total = name, done, total
}

func (p *progress) loop() {
	defer p.wg.Done()
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.stopCh:
			fmt.Fprint(p.w, "\r\033[K")
			return
		case <-t.C:
			p.mu.Lock()
			if p.done != nil {
				n := p.done()
				const width = 30
				fill := int(int64(width) * n / int64(max(p.total, 1)))
				fmt.Fprintf(p.w, "\r\033[K%-22s [%s%s] %d/%d", p.name, strings.Repeat("=", fill), strings.Repeat(" ", width-fill), n, p.total)
			}
			p.mu.Unlock()
		}
	}
}

func (p *progress) stop() {
	p.stopOnce.Do(func() { close(p.stopCh); p.wg.Wait() })
}
