package config

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
	}{
		{"0", 0},
		{"4096", 4096},
		{"-1", -1},
		{"-1B", -1},
		{"+5", 5},
		{"1_000_000", 1_000_000},
		{"12B", 12},
		{"1K", 1 << 10},
		{"1KB", 1 << 10},
		{"1 KiB", 1 << 10},
		{"1kib", 1 << 10},
		{"512MiB", 512 << 20},
		{"512MB", 512 << 20},
		{"3M", 3 << 20},
		{"10GB", 10 << 30},
		{"10GiB", 10 << 30},
		{"2G", 2 << 30},
		{"1TB", 1 << 40},
		{"1TiB", 1 << 40},
		{"  7MiB  ", 7 << 20},
		{"8388607TiB", 8388607 << 40}, // the largest whole TiB that fits in an int64
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSize(tt.in)
			if err != nil {
				t.Fatalf("ParseSize(%q): %v", tt.in, err)
			}
			if got != tt.want {
				t.Errorf("ParseSize(%q) = %d, want %d", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseSizeErrors(t *testing.T) {
	tests := []struct {
		in      string
		wantErr string // a fragment of the message
	}{
		{"", "empty size"},
		{"   ", "empty size"},
		{"10XB", `unknown size unit "XB"`},
		{"10 PB", "unknown size unit"},
		{"1.5GB", "unknown size unit"},
		{"GB", "is not a size"},
		{"-", "is not a size"},
		{"_", "is not a size"},
		{"-5", `negative size "-5"`},
		{"-2", "only -1 (unlimited) is allowed"},
		{"-1KB", "negative size"},
		{"99999999999999999999", `"99999999999999999999" is not a size`},
		{"8388608TiB", "too large"},
		{"9223372036854775807KB", "too large"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSize(tt.in)
			if err == nil {
				t.Fatalf("ParseSize(%q) = %d, want an error", tt.in, got)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseSize(%q) error %q does not contain %q", tt.in, err, tt.wantErr)
			}
		})
	}
}

// TestSizeInConfig feeds sizes through the TOML decoder, where a value may
// be an integer or a string, and checks what Validate says about it.
func TestSizeInConfig(t *testing.T) {
	tests := []struct {
		value string // TOML right-hand side
		want  int64
		bad   string // "" when valid; else a fragment of the problem
	}{
		{`"10GB"`, 10 << 30, ""},
		{`"512MiB"`, 512 << 20, ""},
		{`"1 KiB"`, 1 << 10, ""},
		{`4096`, 4096, ""},
		{`4_096`, 4096, ""},
		{`"4096"`, 4096, ""},
		{`"-1"`, -1, ""},
		{`-1`, -1, ""},
		{`"10XB"`, 0, `streams.S.max_bytes = "10XB": unknown size unit`},
		{`"-5"`, 0, `streams.S.max_bytes = "-5": negative size`},
		{`-5`, 0, `streams.S.max_bytes = "-5": negative size`},
		{`""`, 0, `streams.S.max_bytes = "": empty size`},
		{`"99999999999999999999"`, 0, `streams.S.max_bytes = "99999999999999999999"`},
		{`"9999999999TB"`, 0, `streams.S.max_bytes = "9999999999TB": size "9999999999TB" is too large`},
		{`1.5`, 0, `streams.S.max_bytes = "1.5": a size must be an integer or a string`},
		{`true`, 0, `streams.S.max_bytes = "true": a size must be an integer or a string`},
		{`[1]`, 0, `streams.S.max_bytes = "[1]": a size must be an integer or a string`},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			cfg := mustParse(t, "[streams.S]\nsubjects = [\"s.*\"]\nmax_bytes = "+tt.value+"\n")
			err := cfg.Validate()
			if tt.bad == "" {
				if err != nil {
					t.Fatalf("max_bytes = %s: %v", tt.value, err)
				}
				if got := cfg.Streams["S"].MaxBytes.Bytes; got != tt.want {
					t.Errorf("max_bytes = %s parsed as %d, want %d", tt.value, got, tt.want)
				}
				return
			}
			wantProblems(t, err, tt.bad)
		})
	}
}

// An integer that does not fit in an int64 is a TOML syntax error, with
// its line.
func TestSizeIntegerOverflow(t *testing.T) {
	_, err := Parse(strings.NewReader("[server]\n\nmax_payload = 99999999999999999999\n"), "h.toml")
	if err == nil {
		t.Fatal("Parse accepted an integer larger than int64")
	}
	for _, want := range []string{"h.toml", "line 3", "server.max_payload", "99999999999999999999"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}

func TestSizeString(t *testing.T) {
	tests := []struct {
		n    int64
		want string
	}{
		{-1, "-1"},
		{-7, "-1"},
		{0, "0"},
		{1000, "1000"},
		{1 << 10, "1KiB"},
		{1536, "1536"},
		{1 << 20, "1MiB"},
		{10 << 30, "10GiB"},
		{3 << 40, "3TiB"},
		{1<<40 + 1<<30, "1025GiB"},
	}
	for _, tt := range tests {
		if got := Bytes(tt.n).String(); got != tt.want {
			t.Errorf("Bytes(%d).String() = %q, want %q", tt.n, got, tt.want)
		}
		// What String prints parses back to the same size (for sizes >= -1).
		if tt.n >= -1 {
			if back, err := ParseSize(Bytes(tt.n).String()); err != nil || back != tt.n {
				t.Errorf("ParseSize(%q) = %d, %v; want %d", Bytes(tt.n).String(), back, err, tt.n)
			}
		}
	}
}

func TestDurationInConfig(t *testing.T) {
	tests := []struct {
		value string
		want  time.Duration
		bad   string
	}{
		{`"30s"`, 30 * time.Second, ""},
		{`"72h"`, 72 * time.Hour, ""},
		{`"1h30m"`, 90 * time.Minute, ""},
		{`"250ms"`, 250 * time.Millisecond, ""},
		{`" 2m "`, 2 * time.Minute, ""},
		{`"0s"`, 0, ""},
		{`"5"`, 0, `streams.S.max_age = "5": not a duration`},
		{`"abc"`, 0, `streams.S.max_age = "abc": not a duration`},
		{`""`, 0, `streams.S.max_age = "": not a duration`},
		{`"3 days"`, 0, `streams.S.max_age = "3 days": not a duration`},
		{`5`, 0, `streams.S.max_age = "5": a duration must be a string`},
		{`1.5`, 0, `streams.S.max_age = "1.5": a duration must be a string`},
		{`true`, 0, `streams.S.max_age = "true": a duration must be a string`},
		{`"-1h"`, 0, `streams.S.max_age = -1h0m0s: must not be negative`},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			cfg := mustParse(t, "[streams.S]\nsubjects = [\"s.*\"]\nduplicate_window = \"0s\"\nmax_age = "+tt.value+"\n")
			err := cfg.Validate()
			if tt.bad == "" {
				if err != nil {
					t.Fatalf("max_age = %s: %v", tt.value, err)
				}
				if got := cfg.Streams["S"].MaxAge.Duration; got != tt.want {
					t.Errorf("max_age = %s parsed as %v, want %v", tt.value, got, tt.want)
				}
				return
			}
			wantProblems(t, err, tt.bad)
		})
	}
}

func TestDurationAndSizeConstructors(t *testing.T) {
	if d := Dur(90 * time.Second); d.Duration != 90*time.Second || d.String() != "1m30s" {
		t.Errorf("Dur(90s) = %v (%q)", d.Duration, d.String())
	}
	if s := Bytes(math.MaxInt64); s.Bytes != math.MaxInt64 {
		t.Errorf("Bytes(MaxInt64).Bytes = %d", s.Bytes)
	}
}
