package main

import (
	"errors"
	"strings"
	"testing"
)

func TestOnceError(t *testing.T) {
	for _, tc := range []struct {
		name  string
		seen  []int
		stray int
		want  string // "" = exactly once
	}{
		{"each once", []int{1, 1, 1}, 0, ""},
		{"lost", []int{1, 0, 1}, 0, "of the edge's messages 10..12, 1 LOST (11), 0 DUPLICATED, and 0"},
		{"duplicated", []int{1, 2, 1}, 0, "0 LOST, 1 DUPLICATED (11), and 0"},
		{"stray", []int{1, 1, 1}, 2, "and 2 hub messages"},
		{"many lost", make([]int, 7), 0, "7 LOST (10, 11, 12, 13, 14, …)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := onceError(tc.seen, 10, tc.stray)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, errNotOnce) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want errNotOnce containing %q", err, tc.want)
			}
		})
	}
}

// A CSV as natscli v0.5.0 writes it for two publishers of 1,000 messages
// of 128 B: MsgCount counts the PubAcks too; the rate is over the longer.
const pubCSV = `#RunID,ClientID,MsgCount,MsgBytes,MsgsPerSec,BytesPerSec,DurationSecs,MinLatencyMicroSecs,AvgLatencyMicroSecs,MaxLatencyMicroSecs,P50LatencyMicroSecs,P90LatencyMicroSecs,P99LatencyMicroSecs,P99.9LatencyMicroSecs,StdDevLatencyMicroSecs
DaiCZknv5jLt7ffCMdS8KT,P0,2000,128000,34762,4449640.481216,0.028766,8062.242000,14314.629000,20567.016000,8062.242000,20567.016000,20567.016000,20567.016000,15607.412800
DaiCZknv5jLt7ffCMdS8KT,P1,2000,128000,27570,3529026.685618,0.036271,17313.751000,18024.153000,18734.555000,17313.751000,18734.555000,18734.555000,18734.555000,18020.137265
`

func TestBenchRate(t *testing.T) {
	got, err := benchRate(strings.NewReader(pubCSV), 128)
	if err != nil {
		t.Fatal(err)
	}
	if want := 2000 / 0.036271; got < want*0.999 || got > want*1.001 {
		t.Fatalf("rate %.0f, want %.0f", got, want)
	}
	if _, err := benchRate(strings.NewReader("a,b\n1,2\n"), 128); err == nil {
		t.Fatal("an unexpected CSV was read")
	}
}
