package bytesize

import "testing"

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"16777216": 16 << 20, "16MiB": 16 << 20, "16Mi": 16 << 20, "1.5Gi": 3 << 29,
		"1.5GiB": 3 << 29, "512kb": 512000, "2M": 2000000, "8 MiB": 8 << 20, "0": 0, "1TiB": 1 << 40, "64b": 64} {
		if got, err := Parse(in); err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "1.5", "0.3KiB", "12XB", "1e30", "NaN"} {
		if got, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) = %d, want an error", in, got)
		}
	}
	var v int64 = 3 << 20
	if s := (Value{&v}).String(); s != "3MiB" {
		t.Errorf("String() = %q", s)
	}
}
