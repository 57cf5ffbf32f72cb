package config

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Size is a byte count read from TOML as an integer (bytes) or a string
// such as "10GB", "512MiB" or "-1" (unlimited). As in nats-server, KB, MB,
// GB and TB are powers of 1024, the same as KiB, MiB, GiB and TiB.
//
// A value that does not parse is kept and reported by Validate, so that
// every problem in a file is listed at once.
type Size struct {
	Bytes int64
	bad   *badValue
}

// Duration is a time span read from TOML as a Go duration string ("30s",
// "72h", "1h30m"). An unparsable value is reported by Validate.
type Duration struct {
	time.Duration
	bad *badValue
}

type badValue struct {
	text string
	err  error
}

// FormatBytes prints a size with binary units, as the config accepts
// them ("2.7 MiB").
func FormatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}

// Bytes returns a Size of n bytes.
func Bytes(n int64) Size { return Size{Bytes: n} }

// Dur returns a Duration of d.
func Dur(d time.Duration) Duration { return Duration{Duration: d} }

var sizeUnits = map[string]int64{
	"":    1,
	"B":   1,
	"K":   1 << 10,
	"KB":  1 << 10,
	"KIB": 1 << 10,
	"M":   1 << 20,
	"MB":  1 << 20,
	"MIB": 1 << 20,
	"G":   1 << 30,
	"GB":  1 << 30,
	"GIB": 1 << 30,
	"T":   1 << 40,
	"TB":  1 << 40,
	"TIB": 1 << 40,
}

// ParseSize parses a size such as "10GB", "512MiB", "4096" or "-1".
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("empty size: use a number of bytes or a unit such as \"512MiB\" or \"10GB\"")
	}
	i := 0
	if t[0] == '-' || t[0] == '+' {
		i = 1
	}
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '_') {
		i++
	}
	num := strings.ReplaceAll(t[:i], "_", "")
	unit := strings.ToUpper(strings.TrimSpace(t[i:]))
	mult, ok := sizeUnits[unit]
	if !ok {
		return 0, fmt.Errorf("unknown size unit %q: use B, KB, MB, GB, TB (or KiB, MiB, GiB, TiB)", t[i:])
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a size: use a number of bytes or a unit such as \"512MiB\" or \"10GB\"", s)
	}
	if n == -1 && mult == 1 {
		return -1, nil
	}
	if n < 0 {
		return 0, fmt.Errorf("negative size %q: only -1 (unlimited) is allowed", s)
	}
	if n > math.MaxInt64/mult {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return n * mult, nil
}

// UnmarshalTOML implements toml.Unmarshaler.
func (s *Size) UnmarshalTOML(v any) error {
	switch x := v.(type) {
	case int64:
		*s = Size{Bytes: x}
		if x < -1 {
			s.bad = &badValue{text: strconv.FormatInt(x, 10), err: fmt.Errorf("negative size: only -1 (unlimited) is allowed")}
		}
	case string:
		n, err := ParseSize(x)
		*s = Size{Bytes: n}
		if err != nil {
			s.bad = &badValue{text: x, err: err}
		}
	default:
		*s = Size{bad: &badValue{text: fmt.Sprint(v), err: fmt.Errorf("a size must be an integer or a string such as \"10GB\", not %T", v)}}
	}
	return nil
}

// String formats the size the way it is written in a config file.
func (s Size) String() string {
	if s.Bytes < 0 {
		return "-1"
	}
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if s.Bytes >= u.m && s.Bytes%u.m == 0 {
			return strconv.FormatInt(s.Bytes/u.m, 10) + u.suffix
		}
	}
	return strconv.FormatInt(s.Bytes, 10)
}

// UnmarshalTOML implements toml.Unmarshaler.
func (d *Duration) UnmarshalTOML(v any) error {
	s, ok := v.(string)
	if !ok {
		*d = Duration{bad: &badValue{text: fmt.Sprint(v), err: fmt.Errorf("a duration must be a string such as \"30s\" or \"72h\", not %T", v)}}
		return nil
	}
	p, err := time.ParseDuration(strings.TrimSpace(s))
	*d = Duration{Duration: p}
	if err != nil {
		d.bad = &badValue{text: s, err: fmt.Errorf("not a duration: use Go syntax such as \"30s\", \"2m\" or \"72h\"")}
	}
	return nil
}
