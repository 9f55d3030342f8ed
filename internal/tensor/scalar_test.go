package tensor

import (
	"math"
	"testing"
)

// Vectors from docs/references.md §4 (PyTorch's test_float8.py and c10 encoders).
func TestE4M3(t *testing.T) {
	encode := []struct {
		in   float32
		want uint8
	}{
		{1.0, 0x38}, {-1.0, 0xB8}, {449, 0x7E}, {463.99, 0x7E}, {464, 0x7E}, {464.01, 0x7F},
		{479, 0x7F}, {480, 0x7F}, {1e6, 0x7F}, {float32(math.Inf(1)), 0x7F}, {float32(math.Inf(-1)), 0xFF},
		{float32(math.NaN()), 0x7F}, {float32(math.Ldexp(1, -10)), 0x00}, {float32(3 * math.Ldexp(1, -10)), 0x02},
		{0.1, 0x1D}, {1.0625, 0x38}, {1.125, 0x39}, {1.1875, 0x3A}, {float32(math.Copysign(0, -1)), 0x80},
		{-0.5, 0xB0}, {448, 0x7E}, {-448, 0xFE},
	}
	for _, c := range encode {
		if got := E4M3FromF32(c.in); got != c.want {
			t.Errorf("E4M3FromF32(%v) = %#x, want %#x", c.in, got, c.want)
		}
	}
	decode := map[uint8]float64{0x38: 1, 0x3C: 1.5, 0x40: 2, 0x30: 0.5, 0x70: 128, 0x77: 240, 0x78: 256,
		0x07: 0.013671875, 0x7E: 448, 0xFE: -448, 0x08: math.Ldexp(1, -6), 0x01: math.Ldexp(1, -9)}
	for code, want := range decode {
		if got := F32FromE4M3(code); float64(got) != want {
			t.Errorf("F32FromE4M3(%#x) = %v, want %v", code, got, want)
		}
	}
	if !math.IsNaN(float64(F32FromE4M3(0x7F))) || !math.IsNaN(float64(F32FromE4M3(0xFF))) {
		t.Error("0x7F and 0xFF must decode to NaN")
	}
	if math.Signbit(float64(F32FromE4M3(0x80))) != true || F32FromE4M3(0x80) != 0 {
		t.Error("0x80 must decode to -0")
	}
	for i := range 256 { // every non-NaN code round-trips
		if c := uint8(i); c&0x7F != 0x7F && E4M3FromF32(F32FromE4M3(c)) != c {
			t.Errorf("code %#x does not round-trip", c)
		}
	}
}

func TestE5M2(t *testing.T) {
	encode := []struct {
		in   float32
		want uint8
	}{
		{57344, 0x7B}, {61439, 0x7B}, {61440, 0x7C}, {65536, 0x7C}, {1e9, 0x7C},
		{float32(math.Inf(1)), 0x7C}, {float32(math.Inf(-1)), 0xFC}, {float32(math.NaN()), 0x7F},
		{float32(math.Ldexp(1, -17)), 0x00}, {1.125, 0x3C}, {1.375, 0x3E}, {-2.5, 0xC1}, {-0.5, 0xB8},
	}
	for _, c := range encode {
		if got := E5M2FromF32(c.in); got != c.want {
			t.Errorf("E5M2FromF32(%v) = %#x, want %#x", c.in, got, c.want)
		}
	}
	decode := map[uint8]float64{0x3C: 1, 0x3D: 1.25, 0x03: 4.57763671875e-05, 0x7B: 57344, 0xFB: -57344,
		0x04: math.Ldexp(1, -14), 0x01: math.Ldexp(1, -16)}
	for code, want := range decode {
		if got := F32FromE5M2(code); float64(got) != want {
			t.Errorf("F32FromE5M2(%#x) = %v, want %v", code, got, want)
		}
	}
	if !math.IsInf(float64(F32FromE5M2(0x7C)), 1) || !math.IsInf(float64(F32FromE5M2(0xFC)), -1) {
		t.Error("0x7C/0xFC must decode to ±inf")
	}
	for _, c := range []uint8{0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF} {
		if !math.IsNaN(float64(F32FromE5M2(c))) {
			t.Errorf("%#x must decode to NaN", c)
		}
	}
	for i := range 256 {
		if c := uint8(i); c&0x7F <= 0x7C && E5M2FromF32(F32FromE5M2(c)) != c {
			t.Errorf("code %#x does not round-trip", c)
		}
	}
}

func TestBF16(t *testing.T) {
	cases := []struct {
		in   uint32
		want uint16
	}{
		{0x3F800000, 0x3F80}, {0x3F808000, 0x3F80}, {0x3F818000, 0x3F82}, {0x3F808001, 0x3F81},
		{0x3F80FFFF, 0x3F81}, {0x7F7FFFFF, 0x7F80}, {0x7F800000, 0x7F80}, {0xFF800000, 0xFF80},
		{0x00000001, 0x0000}, {0x80000000, 0x8000}, {0xFFC00000, 0x7FC0}, {0x7FC00001, 0x7FC0}, {0x40490FDB, 0x4049},
	}
	for _, c := range cases {
		if got := BF16FromF32(math.Float32frombits(c.in)); got != c.want {
			t.Errorf("BF16FromF32(%#08x) = %#04x, want %#04x", c.in, got, c.want)
		}
	}
	if F32FromBF16(0x7F7F) != 3.3895313892515355e38 || float64(F32FromBF16(0x0080)) != math.Ldexp(1, -126) ||
		float64(F32FromBF16(0x0001)) != 9.183549615799121e-41 {
		t.Error("BF16 decode vectors")
	}
}

func TestF16(t *testing.T) {
	cases := []struct {
		in   float32
		want uint16
	}{{1, 0x3C00}, {65504, 0x7BFF}, {65520, 0x7C00}, {-2, 0xC000}, {float32(math.Ldexp(1, -24)), 0x0001},
		{1 + float32(math.Ldexp(1, -11)), 0x3C00}, {1 + 3*float32(math.Ldexp(1, -11)), 0x3C02}}
	for _, c := range cases {
		if got := F16FromF32(c.in); got != c.want {
			t.Errorf("F16FromF32(%v) = %#04x, want %#04x", c.in, got, c.want)
		}
	}
}

func TestCanConvert(t *testing.T) {
	allowed := []struct{ from, to DType }{
		{BF16, F32}, {F32, BF16}, {F64, F8E4M3}, {I64, BF16}, {BOOL, F16}, {U8, U16}, {I8, I64},
		{BOOL, I8}, {BOOL, U64}, {BOOL, BOOL}, {U32, U32}, {U64, F64},
	}
	refused := []struct{ from, to DType }{
		{F32, I32}, {I64, I32}, {U8, I16}, {I8, U16}, {U16, U8}, {I32, BOOL}, {F16, BOOL}, {F8E4M3, U8},
	}
	for _, c := range allowed {
		if !CanConvert(c.from, c.to) {
			t.Errorf("CanConvert(%s, %s) = false, want true", c.from, c.to)
		}
	}
	for _, c := range refused {
		if CanConvert(c.from, c.to) {
			t.Errorf("CanConvert(%s, %s) = true, want false", c.from, c.to)
		}
	}
	for _, d := range AllDTypes {
		if got, ok := ParseDType(d.String()); !ok || got != d {
			t.Errorf("ParseDType(%q) = %v, %v", d.String(), got, ok)
		}
	}
	if _, ok := ParseDType("F6_E2M3"); ok {
		t.Error("F6_E2M3 is not served")
	}
	// The source-only extensions: read as float32, never written.
	for _, c := range []struct {
		from, to DType
		ok       bool
	}{{F4, BF16, true}, {F4, F32, true}, {F4, F4, false}, {F32, F4, false}, {F4, I8, false},
		{F8E8M0, F32, true}, {F8E8M0, F8E8M0, true}, {F32, F8E8M0, false}} {
		if CanConvert(c.from, c.to) != c.ok {
			t.Errorf("CanConvert(%s, %s) != %v", c.from, c.to, c.ok)
		}
	}
}
