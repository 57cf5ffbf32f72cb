package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// userHZ is the unit of utime and stime in /proc/PID/stat: USER_HZ, 100 on
// every Linux architecture holdfast is built for (it is part of the ABI,
// whatever the kernel's own tick rate).
const userHZ = 100

// sample is what /proc says about a process at one moment.
type sample struct {
	// ticks is utime+stime of every thread, live or exited, in 1/userHZ s.
	ticks int64
	// childTicks is cutime+cstime: the same of the children it waited
	// for (an exec handler's commands).
	childTicks int64
	// runNS is the time on a CPU of the threads alive now, in ns
	// (/proc/PID/task/*/schedstat): finer than ticks, blind to threads
	// that exit between two samples (Go keeps its threads).
	runNS int64
	// writeBytes is what the process caused to be written to storage
	// (/proc/PID/io write_bytes).
	writeBytes int64
}

// readSample reads the sample of process pid.
func readSample(pid int) (sample, error) {
	var s sample
	dir := fmt.Sprintf("/proc/%d", pid)
	stat, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return s, err
	}
	if s.ticks, s.childTicks, err = parseStatTicks(string(stat)); err != nil {
		return s, err
	}
	f, err := os.Open(filepath.Join(dir, "io"))
	if err != nil {
		return s, err
	}
	defer f.Close()
	if s.writeBytes, err = parseIOWriteBytes(f); err != nil {
		return s, err
	}
	tasks, err := os.ReadDir(filepath.Join(dir, "task"))
	if err != nil {
		return s, err
	}
	for _, t := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, "task", t.Name(), "schedstat"))
		if err != nil {
			continue // the thread exited since the listing
		}
		fields := strings.Fields(string(b))
		if len(fields) == 0 {
			continue
		}
		ns, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return s, fmt.Errorf("task %s schedstat %q: %w", t.Name(), b, err)
		}
		s.runNS += ns
	}
	return s, nil
}

// parseStatTicks returns utime+stime (fields 14 and 15) and
// cutime+cstime (16 and 17, the children waited for) of a /proc/PID/stat
// line. The command name (field 2) is in parentheses and may itself hold
// spaces and parentheses: the fields are counted from after its last ')'.
func parseStatTicks(stat string) (own, children int64, err error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/PID/stat %q: no command name", stat)
	}
	// After the name come field 3 (state) onwards: utime is field 14.
	fields := strings.Fields(stat[i+1:])
	if len(fields) < 15 {
		return 0, 0, fmt.Errorf("/proc/PID/stat %q: %d fields after the name, want at least 15", stat, len(fields))
	}
	var v [4]int64
	for k := range v {
		if v[k], err = strconv.ParseInt(fields[11+k], 10, 64); err != nil {
			return 0, 0, fmt.Errorf("field %d %q: %w", 14+k, fields[11+k], err)
		}
	}
	return v[0] + v[1], v[2] + v[3], nil
}

// parseIOWriteBytes returns write_bytes of a /proc/PID/io file.
func parseIOWriteBytes(r io.Reader) (int64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "write_bytes:"); ok {
			return strconv.ParseInt(strings.TrimSpace(rest), 10, 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no write_bytes in /proc/PID/io")
}
