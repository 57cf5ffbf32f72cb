package main

import (
	"math"
	"strings"
	"testing"
)

// CSVs as natscli v0.5.0 writes them (`nats bench ... --csv`): MsgCount is
// the connection's protocol messages in and out, not the job's messages.
const (
	consumeCSV = `#RunID,ClientID,MsgCount,MsgBytes,MsgsPerSec,BytesPerSec,DurationSecs
wsXP4hKcqudS60b36mt9Up,S0,4011,256000,97664,12501082.247013,0.020478
`
	pubCSV = `#RunID,ClientID,MsgCount,MsgBytes,MsgsPerSec,BytesPerSec,DurationSecs,MinLatencyMicroSecs,AvgLatencyMicroSecs,MaxLatencyMicroSecs,P50LatencyMicroSecs,P90LatencyMicroSecs,P99LatencyMicroSecs,P99.9LatencyMicroSecs,StdDevLatencyMicroSecs
DaiCZknv5jLt7ffCMdS8KT,P0,2000,128000,34762,4449640.481216,0.028766,8062.242000,14314.629000,20567.016000,8062.242000,20567.016000,20567.016000,20567.016000,15607.412800
DaiCZknv5jLt7ffCMdS8KT,P1,2000,128000,27570,3529026.685618,0.036271,17313.751000,18024.153000,18734.555000,17313.751000,18734.555000,18734.555000,18734.555000,18020.137265
`
)

func TestParseBenchCSV(t *testing.T) {
	for _, tc := range []struct {
		name           string
		csv            string
		rate, p50, p99 float64
	}{
		// 2,000 messages consumed (and 2,000 acks sent: MsgCount 4,011) in 0.020478 s.
		{"consume", consumeCSV, 2000 / 0.020478, 0, 0},
		// Two publishers of 1,000 each; the rate is over the longer one.
		{"two publishers", pubCSV, 2000 / 0.036271, (8062.242 + 17313.751) / 2, 20567.016},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := parseBenchCSV(strings.NewReader(tc.csv), 128)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range []struct {
				what      string
				got, want float64
			}{{"rate", r.rate, tc.rate}, {"p50", r.p50, tc.p50}, {"p99", r.p99, tc.p99}} {
				if math.Abs(f.got-f.want) > 1e-6*max(1, f.want) {
					t.Errorf("%s = %.3f, want %.3f", f.what, f.got, f.want)
				}
			}
		})
	}
}

func TestParseBenchCSVRefusesOtherFormats(t *testing.T) {
	for name, in := range map[string]string{
		"empty":         "",
		"header only":   strings.SplitN(consumeCSV, "\n", 2)[0] + "\n",
		"other columns": "#RunID,ClientID,MsgCount,Bytes,MsgsPerSec,BytesPerSec,DurationSecs\nx,S0,1,128,1,1,1\n",
		"zero duration": "#RunID,ClientID,MsgCount,MsgBytes,MsgsPerSec,BytesPerSec,DurationSecs\nx,S0,1,128,1,1,0\n",
		"not a number":  "#RunID,ClientID,MsgCount,MsgBytes,MsgsPerSec,BytesPerSec,DurationSecs\nx,S0,1,abc,1,1,1\n",
	} {
		if _, err := parseBenchCSV(strings.NewReader(in), 128); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
