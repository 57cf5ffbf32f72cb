package main

import (
	"strings"
	"testing"
)

func TestParseStatTicks(t *testing.T) {
	for _, tc := range []struct {
		name, stat string
		want       int64
		wantChild  int64
		wantErr    bool
	}{
		{name: "plain", want: 33 + 7, wantChild: 4 + 1,
			stat: "1234 (holdfast) S 1 1234 1234 0 -1 4194560 2000 0 0 0 33 7 4 1 20 0 12 0 100 2000000 3000 18446744073709551615"},
		{name: "name with spaces and parentheses", want: 5 + 2,
			stat: "99 (a (b) c) R 1 99 99 0 -1 0 0 0 0 0 5 2 0 0 20 0 1 0 1 1 1 1"},
		{name: "no name", stat: "99 R 1", wantErr: true},
		{name: "short", stat: "99 (x) R 1 2 3", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, child, err := parseStatTicks(tc.stat)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %t", err, tc.wantErr)
			}
			if got != tc.want || child != tc.wantChild {
				t.Fatalf("ticks = %d, children's %d; want %d, %d", got, child, tc.want, tc.wantChild)
			}
		})
	}
}

func TestParseIOWriteBytes(t *testing.T) {
	io := "rchar: 100\nwchar: 200\nsyscr: 3\nsyscw: 4\nread_bytes: 4096\nwrite_bytes: 8192\ncancelled_write_bytes: 0\n"
	got, err := parseIOWriteBytes(strings.NewReader(io))
	if err != nil || got != 8192 {
		t.Fatalf("write_bytes = %d, %v; want 8192", got, err)
	}
	if _, err := parseIOWriteBytes(strings.NewReader("rchar: 1\n")); err == nil {
		t.Fatal("no error without write_bytes")
	}
}
