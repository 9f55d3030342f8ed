// Package bytesize reads and prints sizes in bytes for flags and environment variables: plain
// bytes, or a number with a binary (KiB, Ki) or decimal (kB, K) unit, as Kubernetes writes them.
package bytesize

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// byteUnits are the suffixes a size takes: binary (KiB, Ki, as Kubernetes writes them)
// and decimal (kB, K), case-insensitive; no suffix is bytes.
var byteUnits = []struct {
	suffix string
	scale  float64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"ki", 1 << 10}, {"mi", 1 << 20}, {"gi", 1 << 30}, {"ti", 1 << 40},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
	{"k", 1e3}, {"m", 1e6}, {"g", 1e9}, {"t", 1e12}, {"b", 1},
}

// Value is a flag.Value for a size in bytes held in *P: 16777216, 16MiB, 16Mi, 1.5GiB.
type Value struct{ P *int64 }

func (b Value) String() string {
	if b.P == nil {
		return "0"
	}
	v := *b.P
	for _, u := range []struct {
		name  string
		scale int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if v != 0 && v%u.scale == 0 {
			return strconv.FormatInt(v/u.scale, 10) + u.name
		}
	}
	return strconv.FormatInt(v, 10)
}

func (b Value) Set(s string) error {
	n, err := Parse(s)
	if err == nil {
		*b.P = n
	}
	return err
}

// Parse reads a size: plain bytes or a number with a unit; it must come to whole bytes.
func Parse(s string) (int64, error) {
	num, scale := strings.TrimSpace(s), 1.0
	lower := strings.ToLower(num)
	for _, u := range byteUnits {
		if strings.HasSuffix(lower, u.suffix) {
			num, scale = strings.TrimSpace(num[:len(num)-len(u.suffix)]), u.scale
			break
		}
	}
	if n, err := strconv.ParseInt(num, 10, 64); err == nil && scale == 1 {
		return n, nil
	}
	f, err := strconv.ParseFloat(num, 64)
	v := f * scale
	if err != nil || math.IsNaN(v) || v != math.Trunc(v) || math.Abs(v) >= 1<<63 {
		return 0, fmt.Errorf("%q is not a whole number of bytes (e.g. 16777216, 16MiB, 1.5GiB)", s)
	}
	return int64(v), nil
}
